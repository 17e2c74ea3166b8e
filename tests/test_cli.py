"""The gsim command line, run as a user runs it (a subprocess, real files)."""
import json
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

import gsim


def gsim_cli(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "gsim.cli", *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"gsim {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def test_help_lists_subcommands_without_loading_heavy_modules():
    out = gsim_cli("--help").stdout
    for sub in ("render", "render-lidar", "info", "demo", "street", "synth", "convert", "reconstruct", "eval", "validate",
                "import-ply", "export-ply", "export-nerfstudio"):
        assert sub in out
    code = "import sys, gsim.cli; gsim.cli.build_parser(); print(sorted(m for m in ('torch', 'numba', 'gsplat') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    gsim_cli("street", "--out", out, "--frames", 4, "--surfels", 3000, "--width", 96, "--height", 54)
    return out


def test_demo_writes_scene_images_and_video(demo_dir):
    assert len(gsim.load_scene(demo_dir / "scene").background) > 2500
    rgb = sorted((demo_dir / "render" / "rgb").glob("*.png"))
    depth = sorted((demo_dir / "render" / "depth").glob("*.png"))
    assert len(rgb) == 4 and len(depth) == 4
    img = imageio.imread(rgb[0])
    assert img.shape == (54, 96, 3) and img.std() > 10  # a picture, not a blank frame
    d = imageio.imread(depth[0])
    assert d.dtype == np.uint16 and d.max() > 256  # metres * 256
    frames = imageio.mimread(demo_dir / "render" / "video.mp4")
    assert len(frames) == 4 and frames[0].shape[:2] == (54, 96)
    assert not list(demo_dir.rglob(".*tmp*"))  # no temporary files left behind


def test_render_and_info(demo_dir, tmp_path):
    gsim_cli("render", demo_dir / "scene", "--trajectory", demo_dir / "trajectory.json", "--out", tmp_path,
             "--backend", "numba", "--no-video")
    assert len(list((tmp_path / "rgb").glob("*.png"))) == 4 and not (tmp_path / "video.mp4").exists()
    a = imageio.imread(tmp_path / "rgb" / "000002.png").astype(int)
    b = imageio.imread(demo_dir / "render" / "rgb" / "000002.png").astype(int)
    assert np.abs(a - b).max() <= 1
    info = gsim_cli("info", demo_dir / "scene").stdout
    assert "background surfels:" in info and "numba: available" in info


def test_bad_input_gives_one_clear_line(demo_dir, tmp_path):
    traj = json.loads((demo_dir / "trajectory.json").read_text())
    traj["frames"][1]["T_world_camera"][0][0] = 3.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(traj))
    p = gsim_cli("render", demo_dir / "scene", "--trajectory", bad, "--out", tmp_path / "o", check=False)
    assert p.returncode == 2 and "frames[1].T_world_camera" in p.stderr and "Traceback" not in p.stderr
    p = gsim_cli("info", tmp_path / "nowhere", check=False)
    assert p.returncode == 2 and "nowhere" in p.stderr
    p = gsim_cli("render", demo_dir / "scene", "--trajectory", demo_dir / "trajectory.json", "--out",
                 tmp_path / "o", "--backend", "gsplat", check=False)
    if "gsplat" not in gsim.available_backends():
        assert p.returncode == 2 and "gsplat" in p.stderr and "not available" in p.stderr


def test_ply_export_import_roundtrip(demo_dir, tmp_path):
    gsim_cli("export-ply", demo_dir / "scene", tmp_path / "street.ply")
    gsim_cli("import-ply", tmp_path / "street.ply", tmp_path / "scene2")
    a, b = gsim.load_scene(demo_dir / "scene").background, gsim.load_scene(tmp_path / "scene2").background
    assert len(a) == len(b)
    assert np.array_equal(a.means, b.means.astype(np.float32))
    assert np.allclose(a.opacities, b.opacities, rtol=1e-6) and np.allclose(a.scales, b.scales, rtol=1e-6)


DDAD = __import__("pathlib").Path(__file__).parents[1].parent / "shared" / "data" / "ddad_dgp"


@pytest.mark.skipif(not DDAD.is_dir(), reason="../shared/data/ddad_dgp is absent (see ../shared/data/README.md)")
def test_convert_dgp_validate_and_errors(tmp_path):
    gsim_cli("convert", "dgp", DDAD / "scene_dataset_v1.0.json", tmp_path / "logs")
    logs = sorted(p.parent for p in (tmp_path / "logs").rglob("log.json"))
    assert logs
    out = gsim_cli("validate", logs[0]).stdout
    assert "valid gsim log" in out and "actors" in out
    bad = gsim_cli("validate", tmp_path / "nowhere", check=False)
    assert bad.returncode == 2 and "nowhere" in bad.stderr and "Traceback" not in bad.stderr
    bad = gsim_cli("reconstruct", logs[0], tmp_path / "r", "--resume", check=False)
    assert bad.returncode == 2 and "checkpoint" in bad.stderr


def test_render_lidar_with_a_head_writes_intensity_and_kitti_bin(demo_dir, tmp_path):
    from gsim.lidar.heads import FEATURES, LidarHead
    street = gsim.load_scene(demo_dir / "scene")
    bg = street.background
    feats = np.random.default_rng(0).normal(size=(len(bg), FEATURES)).astype(np.float32)
    head = LidarHead.initial(seed=1)
    head = LidarHead(head.w1, head.b1, np.random.default_rng(2).normal(0, 0.5, head.w2.shape), np.array([0.0, -5.0]))
    gsim.Scene(background=gsim.Surfels(bg.means, bg.quats, bg.scales, bg.opacities, bg.colors, feats),
               lidar_head=head).save(tmp_path / "scene")
    T = np.eye(4)
    T[:3, 3] = [5.0, -3.0, 1.8]
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": T.tolist()}]}))
    gsim_cli("render-lidar", tmp_path / "scene", "--spec", "velodyne-vlp16", "--trajectory", traj, "--out", tmp_path / "o")
    table = np.load(tmp_path / "o" / "points" / "000000.npy")
    assert table.shape[1] == 7 and len(table) > 1000 and np.all((table[:, 6] >= 0) & (table[:, 6] <= 1))
    kitti = np.fromfile(tmp_path / "o" / "points" / "000000.bin", "<f4").reshape(-1, 4)
    assert np.array_equal(kitti, table[:, [0, 1, 2, 6]]) and table[:, 6].std() > 0
    rec = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("ring", "<u2"), ("t", "<i4"), ("i", "<f4")])
    raw = (tmp_path / "o" / "points" / "000000.pcd").read_bytes()
    assert b"FIELDS x y z ring time_offset_us intensity\n" in raw
    body = np.frombuffer(raw[raw.index(b"DATA binary\n") + 12:], rec)
    assert np.array_equal(body["i"], table[:, 6])


def test_render_lidar_writes_every_format(demo_dir, tmp_path):
    """Two VLP-16 sweeps of the street: .npy/.ply/.pcd agree with each other and with the range image."""
    T = np.eye(4)
    T[:3, 3] = [5.0, -3.0, 1.8]
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [
        {"timestamp_us": 0, "T_world_lidar": T.tolist()}, {"timestamp_us": 100_000, "T_world_lidar": T.tolist()}]}))
    out = tmp_path / "sweeps"
    gsim_cli("render-lidar", demo_dir / "scene", "--spec", "velodyne-vlp16", "--trajectory", traj, "--out", out)
    table = np.load(out / "points" / "000001.npy")
    assert table.shape[1] == 6 and len(table) > 1000
    assert not (out / "points" / "000001.bin").exists()  # no LiDAR head, no intensity: no KITTI file
    assert np.allclose(np.linalg.norm(table[:, :3], axis=1), table[:, 3], rtol=1e-5)  # range = |point|
    assert set(np.unique(table[:, 4]).astype(int)) <= set(range(16))
    rec = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("ring", "<u2"), ("t", "<i4")])
    for ext, marker in (("ply", b"end_header\n"), ("pcd", b"DATA binary\n")):
        raw = (out / "points" / f"000001.{ext}").read_bytes()
        body = np.frombuffer(raw[raw.index(marker) + len(marker):], rec)
        assert len(body) == len(table) and np.array_equal(body["x"], table[:, 0]) and np.array_equal(body["ring"], table[:, 4])
    rng = imageio.imread(out / "range" / "000001.png")
    assert rng.dtype == np.uint16 and rng.shape == (16, 1800)
    assert np.count_nonzero(rng) == len(table)
    assert not list(out.rglob(".*tmp*"))
    bad = gsim_cli("render-lidar", demo_dir / "scene", "--spec", "velodyne-nope", "--trajectory", traj, "--out", out,
                   check=False)
    assert bad.returncode == 2 and "velodyne-hdl64e" in bad.stderr and "Traceback" not in bad.stderr
    traj.write_text(json.dumps({"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": [[1, 0], [0, 1]]}]}))
    bad = gsim_cli("render-lidar", demo_dir / "scene", "--spec", "velodyne-vlp16", "--trajectory", traj, "--out", out,
                   check=False)
    assert bad.returncode == 2 and "T_world_lidar" in bad.stderr
