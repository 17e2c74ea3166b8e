"""`gsim view` (bridges.browser.viewer): opening what it shows, clear errors, and the page in a real headless Chromium:
not blank, the view from a log camera equals gsim's own render at that camera, the time slider moves an actor."""
import shutil
import socket
import time

import numpy as np
import pytest

import gsim
from gsim.errors import InputError
from support import plane, pose, random_scene

pytest.importorskip("viser")


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    """A tiny synthetic log (its cameras' principal points centred) and a scene beside it: a ground plane and a
    colourful actor driving 6 m along the ego's lane over the log's time."""
    from gsim.scenes.log import load_log
    from gsim.scenes.synth import SynthOptions, synthesize
    root = tmp_path_factory.mktemp("view")
    synthesize(root / "log", seed=0, options=SynthOptions(n_frames=6, width=96, height=60, supersample=1,
                                                          lidar_beams=8, lidar_azimuth_resolution_deg=2.0),
               progress=False)
    log = load_log(root / "log")
    t0, t1 = int(log.frames[0].timestamp_us), int(log.frames[-1].timestamp_us)
    car = gsim.Actor(id="blob", category="car", size=(2.0, 2.0, 2.0),
                     surfels=random_scene(300, 3, spread=(0.6, 0.6, 0.5), z=0.0),
                     track_timestamps_us=np.array([t0, t1]),
                     track_poses=np.stack([pose(9.0, -1.75, 0.0, 1.0), pose(15.0, -1.75, 0.0, 1.0)]))
    gsim.Scene(background=plane(extent=40.0, spacing=0.5), actors=(car,)).save(root / "scene")
    return root


def test_open_target_and_bad_input(street, tmp_path):
    from gsim.bridges.browser.viewer import Viewer, open_target
    t = open_target(str(street / "scene"))  # the log beside the scene folder
    assert t.log is not None and len(t.scene.actors) == 1
    assert open_target(str(street / "scene"), log=str(street / "log")).log.name == t.log.name
    with pytest.raises(InputError, match="no such directory"):
        open_target(str(tmp_path / "nope"))
    with pytest.raises(InputError, match="no scene.json"):
        open_target(str(tmp_path))
    with pytest.raises(InputError, match="--log .*not a gsim log"):
        open_target(str(street / "scene"), log=str(tmp_path))
    with socket.socket() as s:  # a port in use: refused by name (viser would quietly take the next one)
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(InputError, match=f"--port {s.getsockname()[1]}: cannot serve"):
            Viewer(t, port=s.getsockname()[1])


def test_cli_refuses_a_wrong_directory_in_one_line(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "gsim.cli", "view", str(tmp_path / "nope")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "no such directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def chromium():
    """A headless Chromium driven by selenium (Debian's chromium and chromium-driver), or a skip."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    o = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--use-gl=swiftshader",
                "--enable-unsafe-swiftshader", "--hide-scrollbars"):
        o.add_argument(arg)
    o.binary_location = browser
    d = webdriver.Chrome(service=Service(driver), options=o)
    d.set_window_size(800, 600)
    return d


def settle(viewer, before: int, timeout: float = 60.0) -> None:
    """Wait until the viewer has sent a full-resolution view after ``before`` renders, and the browser drew it."""
    end = time.time() + timeout
    while time.time() < end:
        states = list(viewer._clients.values())
        if viewer.renders > before and states and all(s["full"] is not None for s in states):
            time.sleep(1.0)
            return
        time.sleep(0.1)
    raise AssertionError(f"no full-resolution view within {timeout} s ({viewer.renders} renders)")


def screenshot(d) -> np.ndarray:
    import io

    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(d.get_screenshot_as_png())).convert("RGB"), np.float64) / 255.0


def test_the_page_shows_what_the_sensors_see(street):
    from gsim.bridges.browser.viewer import Viewer, open_target
    from gsim.images import psnr
    target = open_target(str(street / "scene"))
    v = Viewer(target, port=0, backend="numba")
    d = chromium()
    try:
        d.get(v.url)
        settle(v, 0)
        first = screenshot(d)
        assert first.std() > 0.05  # (a) not blank
        client = next(iter(v.server.get_clients().values()))
        v.overlays.value = False  # the scene alone (viser's own drawings hidden)
        n = v.renders
        v.snap(client, "front")
        settle(v, n)
        shot = screenshot(d)
        # (b) an independent render at the log camera's own pose and intrinsics (its field of view and centred
        # principal point), at the canvas's scale
        cam = target.log.cameras["front"].camera
        assert abs(cam.cx - cam.width / 2) < 1e-6 and abs(cam.cy - cam.height / 2) < 1e-6
        obs = v._frame().cameras["front"]
        H, W = client.camera.image_height, client.camera.image_width
        k = H / cam.height  # canvas pixels per camera pixel (the same vertical field of view)
        scaled = gsim.PinholeCamera(round(cam.width * k), H, cam.fx * k, cam.fy * k, cam.cx * k, cam.cy * k)
        off = (W - scaled.width) // 2

        def render(T):
            return gsim.render_camera(target.scene, scaled, T, backend="numba", timestamp_us=v.time_us).rgb
        # below viser's notice of software WebGL, left of the control panel: the actor and the ground
        ys, xs = np.mgrid[int(0.45 * H):int(0.95 * H), max(off, int(0.08 * W)):int(0.55 * W)]
        got = shot[ys, xs]
        T = target.log.T_world_camera(obs)
        want = render(T)[ys, xs - off]
        assert psnr(got, want) >= 25.0, psnr(got, want)
        aside = T.copy()  # and it is this view: one 0.3 m aside matches far worse
        aside[:3, 3] += T[:3, 0] * 0.3
        assert psnr(got, want) > psnr(got, render(aside)[ys, xs - off]) + 5.0
        # (c) the time slider moves the actor: the view changes where it drives
        n = v.renders
        v.time_slider.value = v.time_slider.max
        settle(v, n)
        later = screenshot(d)
        assert np.abs(later - shot).mean(-1).max() > 0.3 and np.mean(np.abs(later - shot).mean(-1) > 0.1) > 0.002
        # a CPU preview draws as many surfels as its pixels need, the full view all of them
        n_bg = len(target.scene.background)
        assert [len(v.preview_renderer(w).scene.background) for w in (320, 230, 160, 128)] == \
            [int(np.ceil(n_bg * f)) for f in (1 / 4, 1 / 8, 1 / 16, 1 / 16)]
        assert v.renderer.scene is target.scene
    finally:
        d.quit()
        v.stop()


def test_a_closed_loop_run_replays(loop_street, tmp_path):
    """A run records its scenario (run.json); the viewer rebuilds its scene, draws the ego and the actors per step
    and plots its metrics; an older run without run.json opens with its images alone."""
    import json
    from gsim.bridges.closed_loop.runner import run
    from gsim.bridges.browser.viewer import Viewer, open_target
    from support import ACROSS, scenario
    pytest.importorskip("libsumo")
    out = tmp_path / "run"
    run(scenario(loop_street, "view", ACROSS), "replay", out, progress=False, max_steps=6)
    record = json.loads((out / "run.json").read_text())
    assert record["seed"] == 0 and record["scenario"]["name"] == "view"
    t = open_target(str(out))
    assert t.scene is not None and t.log is not None and len(t.steps) == 7  # the start and six steps
    assert {a.id for a in t.scene.actors} >= {"across"}
    v = Viewer(t, port=0, backend="numba")
    try:
        assert v.times is not None and v.renderer is not None and {"/actors/ego", "/actors/across"} <= set(v._boxes)
        rgb, depth = v.render_view(t.log.T_world_camera(t.log.frames[-1].cameras["front"]), 1.0, 1.6, 160)
        assert rgb.shape == (100, 160, 3) and (depth > 0).mean() > 0.3
    finally:
        v.stop()
    (out / "run.json").unlink()  # as runs before it was recorded
    old = open_target(str(out))
    assert old.scene is None and len(old.steps) == 7
    v = Viewer(old, port=0)
    try:
        assert v.renderer is None and "/actors/ego" in v._boxes
    finally:
        v.stop()
    (out / "run.json").write_text('{"scenario": {"name": 3}}')
    with pytest.raises(InputError, match="run.json: expected the run's record"):
        open_target(str(out))


def test_a_scenario_output_marks_its_edits(edit_street, tmp_path):
    from gsim.bridges.browser.viewer import Viewer, open_target
    from gsim.editing.outputs import render_world
    from gsim.editing.scenario import parse_scenario
    from gsim.editing.world import apply
    from support import scenario_dict
    root, _ = edit_street
    sc = parse_scenario(scenario_dict(root, output=str(tmp_path / "out")))
    out = render_world(apply(sc), sc, progress=False)
    t = open_target(str(out))
    assert t.inserted == {"ahead"} and t.removed == ("parked_a",)  # (the source log does not track it)
    v = Viewer(t, port=0, backend="numba")
    try:
        assert v.side_by_side is not None and v.times is not None
    finally:
        v.stop()
    (out / "scenario.json").write_text("[1,")
    with pytest.raises(InputError, match="scenario.json: expected the scenario"):
        open_target(str(out))


def test_a_scene_without_a_log_opens_alone(tmp_path):
    """No frusta, no path: the time slider runs over the actors' tracks; without tracks there is none."""
    from gsim.bridges.browser.viewer import Viewer, open_target
    car = gsim.Actor(id="c", category="car", size=(2.0, 2.0, 2.0), surfels=random_scene(50, 1, z=0.0),
                     track_timestamps_us=np.array([0, 2_000_000]), track_poses=np.stack([pose(5, 0), pose(9, 0)]))
    gsim.Scene(background=plane(extent=10.0, spacing=1.0), actors=(car,)).save(tmp_path / "moving")
    gsim.Scene(background=plane(extent=10.0, spacing=1.0)).save(tmp_path / "still")
    for name, span in (("moving", 2.0), ("still", None)):
        t = open_target(str(tmp_path / name))
        assert t.log is None
        v = Viewer(t, port=0, backend="numba")
        try:
            assert (v.time_slider is None) == (span is None) and v.side_by_side is None
            if span is not None:
                assert abs(v.time_slider.max - span) < 1e-9
            rgb, depth = v.render_view(pose(-5, 0, 0, 1.5) @ np.array([[0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 0],
                                                                        [0, 0, 0, 1.0]]), 1.0, 1.5, 96)
            assert rgb.shape == (64, 96, 3) and (depth > 0).any()
        finally:
            v.stop()


def test_lidar_and_the_side_by_side_panel(street):
    """gsim's sweep and the log's beside it, gsim's range image, and the log camera rendered beside its image."""
    from gsim.bridges.browser.viewer import Viewer, open_target
    t = open_target(str(street / "scene"))
    v = Viewer(t, port=0, backend="numba")
    try:
        assert v.lidar_box is not None and v.side_by_side is not None
        v.lidar_box.value = True
        v._draw_lidar()
        panel = v.range_panel.image
        assert panel.ndim == 3 and panel.shape[1] == v._lidar()[1].columns and panel.max() > 0
        side = v.side_by_side.image
        cam = t.log.cameras[v.camera_pick.value].camera
        assert side.shape == (cam.height, 2 * cam.width, 3)
        v.shift.value = 2.0
        v._draw_side_by_side()
        assert np.abs(v.side_by_side.image[:, :cam.width].astype(int) - side[:, :cam.width]).mean() > 1.0
        assert np.array_equal(v.side_by_side.image[:, cam.width:], side[:, cam.width:])  # the recording stays
    finally:
        v.stop()
