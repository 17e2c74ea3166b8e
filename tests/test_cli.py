"""The gsim command line, run as a user runs it (a subprocess, real files)."""
import json
import subprocess
import sys

import imageio.v2 as imageio
import numpy as np
import pytest

import gsim
from gsim.errors import GsimWarning


def gsim_cli(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "gsim.cli", *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"gsim {args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


COMMANDS = ("render", "info", "street", "import-ply", "export-ply", "render-lidar", "demo", "synth", "convert", "overlay",
            "export-nerfstudio", "validate", "compile", "reconstruct", "eval", "trajectory", "truth", "scenario", "library",
            "diffusion", "expand", "closed-loop", "serve", "batch", "view")
# what the command line must not load to list its commands: the kernels and every optional extra
HEAVY = ("torch", "numba", "gsplat", "diffusers", "transformers", "grpc", "sumolib", "libsumo", "traci", "gymnasium",
         "mcap", "trimesh", "pydantic", "yaml", "kiss_icp", "viser", "rosbags", "cyclonedds")


def test_help_lists_subcommands_without_loading_heavy_modules():
    out = gsim_cli("--help").stdout
    listing = out[out.index("COMMAND\n"):out.index("options:")].splitlines()
    assert tuple(line.split()[0] for line in listing if line.startswith("    ") and line[4] != " ") == COMMANDS
    code = (f"import sys, gsim.cli; gsim.cli.build_parser(); print(sorted(m for m in {HEAVY!r} "
            f"if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


def test_each_layer_registers_its_own_commands():
    from gsim.cli import build_parser, commands
    owners = {name[0]: p.get_default("fn").__module__ for name, p in commands(build_parser()).items()}
    assert owners["render"] == owners["info"] == "gsim.cli" and owners["render-lidar"] == "gsim.lidar.cli"
    assert owners["reconstruct"] == owners["eval"] == "gsim.scenes.cli" and owners["library"] == "gsim.editing.cli"
    assert owners["expand"] == "gsim.diffusion.cli" and owners["serve"] == owners["closed-loop"] == "gsim.bridges.cli"
    a = build_parser().parse_args(["render", "s", "--trajectory", "t", "--out", "o", "--repair", "m"])
    assert a.repair == "m" and a.open_repairer.__module__ == "gsim.diffusion.cli"  # diffusion's option on core's command


@pytest.fixture(scope="module")
def street_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("street")
    gsim_cli("street", "--out", out, "--frames", 4, "--surfels", 3000, "--width", 96, "--height", 54)
    return out


def test_street_writes_scene_images_and_video(street_dir):
    assert len(gsim.load_scene(street_dir / "scene").background) > 2500
    rgb = sorted((street_dir / "render" / "rgb").glob("*.png"))
    depth = sorted((street_dir / "render" / "depth").glob("*.png"))
    assert len(rgb) == 4 and len(depth) == 4
    img = imageio.imread(rgb[0])
    assert img.shape == (54, 96, 3) and img.std() > 10  # a picture, not a blank frame
    d = imageio.imread(depth[0])
    assert d.dtype == np.uint16 and d.max() > 256  # metres * 256
    frames = imageio.mimread(street_dir / "render" / "video.mp4")
    assert len(frames) == 4 and frames[0].shape[:2] == (54, 96)
    assert not list(street_dir.rglob(".*tmp*"))  # no temporary files left behind


def test_render_and_info(street_dir, tmp_path):
    gsim_cli("render", street_dir / "scene", "--trajectory", street_dir / "trajectory.json", "--out", tmp_path,
             "--backend", "numba", "--no-video")
    assert len(list((tmp_path / "rgb").glob("*.png"))) == 4 and not (tmp_path / "video.mp4").exists()
    a = imageio.imread(tmp_path / "rgb" / "000002.png").astype(int)
    b = imageio.imread(street_dir / "render" / "rgb" / "000002.png").astype(int)
    assert np.abs(a - b).max() <= 1
    info = gsim_cli("info", street_dir / "scene").stdout
    assert "background surfels:" in info and "numba: available" in info


def test_bad_input_gives_one_clear_line(street_dir, tmp_path):
    traj = json.loads((street_dir / "trajectory.json").read_text())
    traj["frames"][1]["T_world_camera"][0][0] = 3.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(traj))
    p = gsim_cli("render", street_dir / "scene", "--trajectory", bad, "--out", tmp_path / "o", check=False)
    assert p.returncode == 2 and "frames[1].T_world_camera" in p.stderr and "Traceback" not in p.stderr
    p = gsim_cli("info", tmp_path / "nowhere", check=False)
    assert p.returncode == 2 and "nowhere" in p.stderr
    p = gsim_cli("render", street_dir / "scene", "--trajectory", street_dir / "trajectory.json", "--out",
                 tmp_path / "o", "--backend", "gsplat", check=False)
    if "gsplat" not in gsim.available_backends():
        assert p.returncode == 2 and "gsplat" in p.stderr and "not available" in p.stderr


def test_ply_export_import_roundtrip(street_dir, tmp_path):
    gsim_cli("export-ply", street_dir / "scene", tmp_path / "street.ply")
    gsim_cli("import-ply", tmp_path / "street.ply", tmp_path / "scene2")
    a, b = gsim.load_scene(street_dir / "scene").background, gsim.load_scene(tmp_path / "scene2").background
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


def test_render_lidar_with_a_head_writes_intensity_and_kitti_bin(street_dir, tmp_path):
    from gsim.lidar.heads import FEATURES, LidarHead
    street = gsim.load_scene(street_dir / "scene")
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


def test_render_lidar_writes_every_format(street_dir, tmp_path):
    """Two VLP-16 sweeps of the street: .npy/.ply/.pcd agree with each other and with the range image."""
    T = np.eye(4)
    T[:3, 3] = [5.0, -3.0, 1.8]
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [
        {"timestamp_us": 0, "T_world_lidar": T.tolist()}, {"timestamp_us": 100_000, "T_world_lidar": T.tolist()}]}))
    out = tmp_path / "sweeps"
    gsim_cli("render-lidar", street_dir / "scene", "--spec", "velodyne-vlp16", "--trajectory", traj, "--out", out)
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
    bad = gsim_cli("render-lidar", street_dir / "scene", "--spec", "velodyne-nope", "--trajectory", traj, "--out", out,
                   check=False)
    assert bad.returncode == 2 and "velodyne-hdl64e" in bad.stderr and "Traceback" not in bad.stderr
    traj.write_text(json.dumps({"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": [[1, 0], [0, 1]]}]}))
    bad = gsim_cli("render-lidar", street_dir / "scene", "--spec", "velodyne-vlp16", "--trajectory", traj, "--out", out,
                   check=False)
    assert bad.returncode == 2 and "T_world_lidar" in bad.stderr


@pytest.fixture(scope="module")
def recon(tmp_path_factory):
    """(log, reconstructed scene): a tiny synthetic log trained for 4 iterations at downscale 2."""
    from gsim.scenes.reconstruction.init import InitOptions
    from gsim.scenes.synth import SynthOptions, synthesize
    from gsim.scenes.reconstruction.train import preset, reconstruct
    root = tmp_path_factory.mktemp("recon")
    log = synthesize(root / "log", seed=3, options=SynthOptions(n_frames=9, width=64, height=40, supersample=1,
                                                                lidar_beams=16, lidar_azimuth_resolution_deg=1.0),
                     progress=False)
    cfg = preset("cpu", iterations=4, checkpoint_every=4, downscale=2, init=InitOptions(voxel_m=0.4, max_surfels=20_000))
    return log, reconstruct(log, root / "out", cfg, progress=False)


def test_eval_defaults_to_the_training_downscale_recorded_in_the_scene(recon, tmp_path):
    from PIL import Image
    log, scene = recon
    assert json.loads((scene / "scene.json").read_text())["train"] == {"downscale": 2}
    p = gsim_cli("eval", scene, log, "--out", tmp_path / "a")
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert m["downscale"] == 2 and m["train_downscale"] == 2 and "at downscale 2" in p.stdout
    assert Image.open(next((tmp_path / "a" / "views").glob("*.png"))).size == (3 * 32, 20)  # 64x40 halved
    assert "warning" not in p.stderr
    # another resolution on purpose: allowed, and said on one line
    p = gsim_cli("eval", scene, log, "--out", tmp_path / "b", "--downscale", 1)
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["downscale"] == 1
    assert Image.open(next((tmp_path / "b" / "views").glob("*.png"))).size == (3 * 64, 40)
    assert "gsim eval: warning:" in p.stderr and "trained at downscale 2" in p.stderr and "Traceback" not in p.stderr


def test_evaluate_api_and_scenes_without_a_recorded_downscale(recon, tmp_path):
    import shutil

    from gsim.scenes.evaluation.evaluate import evaluate
    log, scene = recon
    assert gsim.load_scene(scene).train_downscale == 2
    with pytest.warns(GsimWarning, match="trained at downscale 2"):
        assert evaluate(scene, log, tmp_path / "a", downscale=3, progress=False, write_images=False)["downscale"] == 3
    old = tmp_path / "old"  # a scene written before the field existed
    shutil.copytree(scene, old)
    manifest = json.loads((old / "scene.json").read_text())
    del manifest["train"]
    (old / "scene.json").write_text(json.dumps(manifest))
    assert gsim.load_scene(old).train_downscale is None
    assert evaluate(old, log, tmp_path / "b", progress=False, write_images=False)["downscale"] == 1
    manifest["train"] = {"downscale": 0}
    (old / "scene.json").write_text(json.dumps(manifest))
    with pytest.raises(gsim.SceneFormatError, match="'train'"):
        gsim.load_scene(old)
    with pytest.raises(ValueError, match="train_downscale"):
        gsim.Scene(background=gsim.load_scene(scene).background, train_downscale=0)


def test_export_ply_of_a_scene_with_actors_asks_for_the_option(recon, tmp_path):
    from gsim.ply import load_ply
    _, scene = recon
    s = gsim.load_scene(scene)
    assert s.actors
    p = gsim_cli("export-ply", scene, tmp_path / "a.ply", check=False)
    assert p.returncode == 2 and "--timestamp-us" in p.stderr and "Traceback" not in p.stderr
    gsim_cli("export-ply", scene, tmp_path / "a.ply", "--timestamp-us", 100_000)
    assert len(load_ply(tmp_path / "a.ply")) == len(s.at(100_000))


@pytest.mark.parametrize("args,option", [
    (("street", "--surfels", 50), "--surfels"),
    (("street", "--frames", 1), "--frames"),
    (("eval", "scene", "log", "--out", "o", "--holdout-every", 1), "--holdout-every"),
    (("reconstruct", "log", "out", "--downscale", 0), "--downscale"),
    (("reconstruct", "log", "out", "--road-weight", -1), "--road-weight"),
    (("reconstruct", "log", "out", "--surface-eps", -1), "--surface-eps"),
    (("render-lidar", "scene", "--spec", "velodyne-nope", "--trajectory", "t", "--out", "o"), "--spec"),
])
def test_bad_options_are_named_as_typed(args, option):
    p = gsim_cli(*args, check=False)
    assert p.returncode == 2 and f"argument {option}" in p.stderr and "Traceback" not in p.stderr


def test_diffusion_train_takes_the_library_defaults():
    """`gsim diffusion train` without --crop / --steps trains as TrainOptions() does (the README's time is for it)."""
    from gsim.cli import build_parser
    from gsim.diffusion.train import TrainOptions
    a = build_parser().parse_args(["diffusion", "train", "scene", "log", "--out", "model"])
    assert a.crop is None and a.steps == TrainOptions().steps
    assert a.references == 2 and a.reference_depth == "lidar"  # reference-conditioned by default (issue 36)
    assert build_parser().parse_args(["diffusion", "train", "s", "l", "--out", "m", "--crop", "96"]).crop == 96


def test_render_lidar_takes_a_fixed_pattern_preset(street_dir, tmp_path):
    """The Hesai AT128 (120 degrees, a ray table, not a spinning LidarSpec): a sweep from the street's middle
    sees only what lies ahead, its range image one row of the table's rays."""
    T = np.eye(4)
    T[:3, 3] = [5.0, -3.0, 1.8]
    traj = tmp_path / "lidar.json"
    traj.write_text(json.dumps({"schema_version": 1, "frames": [{"timestamp_us": 0, "T_world_lidar": T.tolist()}]}))
    p = gsim_cli("render-lidar", street_dir / "scene", "--spec", "hesai-at128", "--trajectory", traj, "--out",
                 tmp_path / "o")
    assert "sweeps of hesai-at128" in p.stdout
    table = np.load(tmp_path / "o" / "points" / "000000.npy")
    assert len(table) > 1000 and np.all(table[:, 0] > 0)  # x forward: nothing behind the sensor
    assert np.degrees(np.abs(np.arctan2(table[:, 1], table[:, 0]))).max() < 62.4  # the 120-degree window
    assert imageio.imread(tmp_path / "o" / "range" / "000000.png").shape == (1, 1200 * 128)
