"""Render trajectories from a log's camera (scenes.evaluation.render_path, `gsim trajectory`) on a tiny synthetic log."""
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

import gsim
from gsim.io import to_uint8
from gsim.scenes.reconstruction.init import InitOptions, initial_surfels
from gsim.scenes.log import load_log
from gsim.scenes.reconstruction.model import SceneModel
from gsim.scenes.evaluation.render_path import camera_path
from gsim.scenes.synth import SynthOptions, synthesize
from gsim.scenes.reconstruction.views import split_frames
from gsim.trajectory import load_trajectory

TINY = SynthOptions(n_frames=9, width=48, height=30, supersample=1, lidar_beams=16, lidar_azimuth_resolution_deg=1.0)


def gsim_cli(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "gsim.cli", *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"gsim {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    return synthesize(tmp_path_factory.mktemp("synth") / "log", seed=5, options=TINY, progress=False)


@pytest.mark.parametrize("sensor", ["front", "front_left"])  # pinhole, and OpenCV radial distortion
def test_zero_shift_file_holds_the_log_cameras_poses_and_model(log_dir, tmp_path, sensor):
    gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--camera", sensor)
    log, traj = load_log(log_dir), load_trajectory(tmp_path / "t.json")
    assert traj.camera == log.cameras[sensor].camera
    assert len(traj.poses) == len(log.frames)
    for f, t, T in zip(log.frames, traj.timestamps_us, traj.poses):
        obs = f.cameras[sensor]
        assert t == obs.timestamp_us and np.array_equal(T, log.T_world_camera(obs))


def test_shift_moves_the_camera_centre_along_the_vehicle_y_axis(log_dir):
    log = load_log(log_dir)
    base, moved = camera_path(log, "front_right"), camera_path(log, "front_right", shift_m=-1.5)
    for t, a, b in zip(base.timestamps_us, base.poses, moved.poses):
        y_axis = log.T_world_vehicle(int(t))[:3, 1]
        assert np.allclose(b[:3, 3] - a[:3, 3], -1.5 * y_axis, atol=1e-12)  # negative: to the right
        assert np.array_equal(a[:3, :3], b[:3, :3])  # same orientation


def test_a_scene_with_refined_poses_moves_the_path_where_it_puts_the_log(log_dir, tmp_path):
    """`gsim trajectory --scene`: the poses are the scene's corrections applied to the log's (a zero shift
    then renders the log's views as `gsim eval` does); without corrections they are the log's own."""
    log = load_log(log_dir)
    times = np.array([f.timestamp_us for f in log.frames], np.int64)
    C = np.tile(np.eye(4), (len(times), 1, 1))
    C[:, :3, 3] = np.linspace(0, 1, len(times))[:, None] * [0.05, -0.02, 0.01]
    scene = gsim.Scene(background=initial_surfels(log, log.frames, InitOptions(voxel_m=0.5, max_surfels=2000))[0],
                       pose_corrections=(times, C))
    scene.save(tmp_path / "s")
    gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--scene", tmp_path / "s", "--shift-m", 1.0)
    traj, plain = load_trajectory(tmp_path / "t.json"), camera_path(log, shift_m=1.0)
    assert np.allclose(traj.poses, C @ plain.poses, atol=1e-9)
    assert np.allclose(camera_path(log, shift_m=1.0, scene=gsim.Scene(background=scene.background)).poses, plain.poses)


def test_frame_selection_and_downscale(log_dir):
    log = load_log(log_dir)
    train, held = split_frames(log, 4)
    t = camera_path(log, frames="holdout", holdout_every=4)
    assert list(t.timestamps_us) == [f.timestamp_us for f in held]  # frames 0, 4, 8
    t = camera_path(log, frames="train", holdout_every=4, every=2, downscale=2)
    assert list(t.timestamps_us) == [f.timestamp_us for f in train[::2]]
    cam = log.cameras["front"].camera
    assert (t.camera.width, t.camera.height, t.camera.fx) == (cam.width // 2, cam.height // 2, cam.fx / 2)


def test_bad_input_names_what_the_user_typed(log_dir, tmp_path):
    p = gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--camera", "rear", check=False)
    assert p.returncode == 2 and "'rear'" in p.stderr and "front_left" in p.stderr and "Traceback" not in p.stderr
    p = gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--every", "0", check=False)
    assert p.returncode == 2 and "--every" in p.stderr
    p = gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--frames", "some", check=False)
    assert p.returncode == 2 and "--frames" in p.stderr
    assert not (tmp_path / "t.json").exists()
    with pytest.raises(ValueError, match="every"):
        camera_path(load_log(log_dir), every=0)


def test_gsim_render_along_the_trajectory_matches_render_camera_at_the_log_pose(log_dir, tmp_path):
    """A tiny scene (the trainer's initial surfels, with actors) rendered through the trajectory file by
    `gsim render` is the scene rendered at the log camera's own poses and times."""
    log = load_log(log_dir)
    train, _ = split_frames(log)
    bg, actors = initial_surfels(log, train, InitOptions(voxel_m=0.3, max_surfels=20_000))
    scene = SceneModel.from_surfels(bg, actors, log.actors, sorted(log.cameras)).to_scene()
    assert scene.actors
    scene.save(tmp_path / "scene")
    sensor = "front_left"  # a distorted camera
    gsim_cli("trajectory", log_dir, tmp_path / "t.json", "--camera", sensor, "--every", 4)
    gsim_cli("render", tmp_path / "scene", "--trajectory", tmp_path / "t.json", "--out", tmp_path / "r",
             "--backend", "numba", "--no-video")
    cam = log.cameras[sensor].camera
    for i, f in enumerate(log.frames[::4]):
        obs = f.cameras[sensor]
        want = to_uint8(gsim.render_camera(scene, cam, log.T_world_camera(obs), backend="numba",
                                           timestamp_us=obs.timestamp_us).rgb)
        got = imageio.imread(tmp_path / "r" / "rgb" / f"{i:06d}.png")
        assert want.std() > 5 and np.allclose(got, want, atol=1)
