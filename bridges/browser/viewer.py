"""`gsim view`: a scene in the browser (viser), drawn by gsim's own renderer at the browser camera's pose.

What you see is what the sensors see: the main view is a `gsim.resident.Renderer` image (numba on a CPU, gsplat
where CUDA works) at the browser camera's pose and vertical field of view, sent as viser's background image with
its depth (gsim's camera-z depth), so that viser's own overlays (log camera frusta, the ego path, actor boxes,
LiDAR points) are occluded by the scene. While the camera moves the view is rendered as a preview whose width
adapts (between MIN_PREVIEW_WIDTH and PREVIEW_WIDTH pixels) so that previews keep up with PREVIEW_HZ, as
nerfstudio's viewer lowers its resolution while moving; on a CPU (numba) a preview also draws only a fraction of the
surfels, grown to cover (`Scene.thinned`; a view's cost is mostly per surfel, not per pixel): as many as its pixels
need, (width / FULL_WIDTH)^2 of them, one of PREVIEW_FRACTIONS. Once the camera has rested SETTLE_S the view is
rendered again, whole, at FULL_WIDTH.

Time: a slider (and play) over the log's time range, or the actors' tracks' without a log; the actors move on
their tracks, the frusta show the nearest frame's images. LiDAR: the log's first LiDAR with a beam model, rendered
by gsim at the current time (coloured by intensity, else range) beside the log's own sweep (grey), and gsim's
range image in a panel. Log cameras: snap the view to one, shifted sideways by the lane-shift slider; a panel shows
gsim's render of it beside the recorded image.
Opens a scene directory, a reconstruction directory (`gsim reconstruct`/`gsim demo`: its log comes from the
training record), a scenario output (scenario.json with scene/ and log/; ``log`` overrides the log) or a
closed-loop run (the run's own log, its ego and every actor's box per step, speed and time to collision over
time, the first collision marked; its scene rebuilt from the scenario its run.json records, the log's actors where
the run drove them).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.errors import InputError
from gsim.io import to_uint8
from gsim.scene import load_scene
from gsim.scenes.log import load_log, scene_and_log_dirs
from gsim.transforms import quat_to_rotmat, rotmat_to_quat

PREVIEW_WIDTH = 320
MIN_PREVIEW_WIDTH = 128
PREVIEW_HZ = 10.0  # the preview rate aimed at: a slower preview makes the next one narrower
# the shares of the surfels a CPU preview may draw: on the demo street's reconstruction a 320-px preview of a
# quarter of them costs 2.2x less than drawing them all and comes within 25.4 dB of it (bench/bench_viewer.py)
PREVIEW_FRACTIONS = (1 / 4, 1 / 8, 1 / 16)
FULL_WIDTH = 640
SETTLE_S = 0.25  # a camera that has not moved for this long gets the full resolution
PLAY_RATE = 1.0  # log seconds per second while playing


@dataclass(frozen=True, eq=False)
class Target:
    """What a view opens: a scene (None: a run recorded without its scenario, shown by its images), its log (or
    None), a name and, for a closed-loop run, its steps (steps.jsonl's records)."""

    name: str
    scene: object
    log: object = None
    steps: tuple = ()
    inserted: frozenset = frozenset()  # a scenario output's inserted actors (ids)
    removed: tuple = ()  # and its removed ones: ActorTrack of the source log where it has them, else ids


def open_target(path: str, log: Optional[str] = None) -> Target:
    """A scene, reconstruction, scenario-output or closed-loop run directory (see the module docstring); InputError
    names what is wrong."""
    p = Path(path)
    if not p.is_dir():
        what = "not a directory" if p.exists() else "no such directory"
        raise InputError(f"{path}: {what} (expected a scene, a reconstruction, a scenario output or a closed-loop "
                         f"run)")
    if (p / "steps.jsonl").is_file():
        return _open_run(p)
    edits = {}
    if (p / "scenario.json").is_file():
        scene_dir, log_dir = p / "scene", p / "log"
        edits = _edits(p / "scenario.json")
    else:
        scene_dir, log_dir = scene_and_log_dirs(p)
    if log is not None:
        log_dir = Path(log)
        if not (log_dir / "log.json").is_file():
            raise InputError(f"--log {log}: not a gsim log directory (no log.json)")
    # (the viewer's own module loads viser: a missing extra shows before any file is read)
    import viser  # noqa: F401
    scene = load_scene(scene_dir)
    return Target(p.resolve().name, scene, load_log(log_dir) if (log_dir / "log.json").is_file() else None, **edits)


def _edits(path: Path) -> dict:
    """A scenario output's inserted actor ids and removed actors (their source log's tracks where it has them)."""
    try:
        d = json.loads(path.read_text())
        edits = [e for e in d.get("edits", []) if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: expected the scenario the output was rendered from ({type(e).__name__}: {e})") \
            from None
    inserted = frozenset(str(e["id"]) for e in edits if e.get("kind") == "insert" and "id" in e)
    removed_ids = [str(e["actor"]) for e in edits if e.get("kind") == "remove" and "actor" in e]
    source = Path(str(d.get("log", "")))
    tracks = {a.id: a for a in load_log(source).actors} if (source / "log.json").is_file() else {}
    return {"inserted": inserted, "removed": tuple(tracks.get(i, i) for i in removed_ids)}


def _open_run(p: Path) -> Target:
    """A closed-loop run directory: its log (the rendered sensors, the ego, every actor's track), its steps, and the
    scene it ran on, rebuilt from the scenario run.json records, with the log's actors where the run drove them."""
    steps = []
    for line in (p / "steps.jsonl").read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except ValueError:  # a run cut off mid-line keeps the steps before it
            break
    log = load_log(p / "log") if (p / "log" / "log.json").is_file() else None
    record, scene = p / "run.json", None
    if record.is_file():  # (older runs did not record it: their images are shown)
        from pydantic import ValidationError

        from gsim.editing.world import apply

        from ..closed_loop.scenario import LoopScenario
        try:
            sc = LoopScenario.model_validate(json.loads(record.read_text())["scenario"])
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
            raise InputError(f"{record}: expected the run's record with its scenario in 'scenario' "
                             f"({type(e).__name__}: {str(e).splitlines()[0]})") from None
        scene = apply(sc, progress=False, ego_overlaps=True).scene
        tracks = {a.id: a for a in log.actors} if log is not None else {}
        scene = replace(scene, actors=tuple(
            replace(a, track_timestamps_us=tracks[a.id].timestamps_us, track_poses=tracks[a.id].poses)
            if a.id in tracks else a for a in scene.actors))
    return Target(p.resolve().name, scene, log, tuple(steps))


def browser_camera(width: int, height: int, fov_y: float) -> PinholeCamera:
    """The pinhole camera of a browser view ``width`` x ``height`` with vertical field of view ``fov_y`` (radians)."""
    f = 0.5 * height / np.tan(0.5 * fov_y)
    return PinholeCamera(width, height, f, f, 0.5 * width, 0.5 * height)


def fov_y(camera) -> float:
    """A camera's vertical field of view (radians), as viser's frusta and browser cameras take it."""
    return 2 * float(np.arctan(0.5 * camera.height / camera.fy))


def _yaw_quat(yaw: float) -> tuple:
    """wxyz of a turn by ``yaw`` about +z (an upright box's orientation)."""
    return (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))


def pose_of(wxyz, position) -> np.ndarray:
    """T_world_camera (OpenCV axes, as viser's camera and gsim's both use) from a quaternion and a position."""
    T = np.eye(4)
    T[:3, :3] = quat_to_rotmat(np.asarray(wxyz, np.float64)[None])[0]
    T[:3, 3] = position
    return T


class Viewer:
    """The viser server, its controls and one render thread per browser. ``port`` 0: a free one."""

    def __init__(self, target: Target, host: str = "127.0.0.1", port: int = 8080, backend: str = "auto"):
        import viser

        from gsim.resident import Renderer
        self.target, self.scene, self.log, self.steps = target, target.scene, target.log, target.steps
        self.renderer = None if self.scene is None else Renderer(self.scene, backend)
        cpu = self.renderer is not None and self.renderer.backend == "numba"
        self._previews = {f: Renderer(self.scene.thinned(f), "numba") for f in PREVIEW_FRACTIONS} if cpu else {}
        self.render_lock = threading.Lock()  # one render at a time: numba's threads are the machine's cores
        self._stopped = threading.Event()
        self.times = self._time_range()
        _check_port(host, port)  # (viser would take the next free port without a word)
        self.server = viser.ViserServer(host=host, port=port, verbose=False)
        if port and self.server.get_port() != port:
            self.server.stop()
            raise InputError(f"--port {port}: {host}:{port} was taken meanwhile; choose another port (0: any free one)")
        self.server.scene.set_up_direction("+z")
        # client id -> {"dirty": Event, "full": the key of the view last sent at full size, "preview": its width}
        self._clients = {}
        self._boxes = {}  # scene node -> the actor box drawn there
        self.url = f"http://{host}:{self.server.get_port()}"
        self.renders = 0  # views sent to browsers (tests and the benchmark count them)
        self._gui()
        self._draw_overlays()
        self.server.on_client_connect(self._connect)

    # ------------------------------------------------------------------ time and controls
    def _time_range(self) -> Optional[tuple]:
        if self.log is not None and len(self.log.frames):
            return int(self.log.frames[0].timestamp_us), int(self.log.frames[-1].timestamp_us)
        if self.scene is None:
            return None
        tracks = [a.track_timestamps_us for a in self.scene.actors if len(a.track_timestamps_us) > 1]
        if tracks:
            return int(min(t[0] for t in tracks)), int(max(t[-1] for t in tracks))
        return None

    @property
    def time_us(self) -> Optional[int]:
        if self.times is None:
            return 0 if self.scene is not None and self.scene.actors else None
        return int(self.times[0] + round(self.time_slider.value * 1e6))

    def _gui(self) -> None:
        gui = self.server.gui
        if self.scene is None:
            gui.add_markdown(f"**{self.target.name}**: a run recorded without its scenario (run.json): its own images "
                             f"and boxes only")
        else:
            gui.add_markdown(f"**{self.target.name}**: {len(self.scene.background.means):,} surfels, "
                             f"{len(self.scene.actors)} actors; rendered by gsim ({self.renderer.backend})")
        self.time_slider = self.play = None
        if self.times is not None:
            span = (self.times[1] - self.times[0]) * 1e-6
            self.time_slider = gui.add_slider("time (s)", 0.0, max(span, 1e-3), 0.01, 0.0)
            self.play = gui.add_checkbox("play", False)
            self.time_slider.on_update(lambda _: self._time_changed())
            threading.Thread(target=self._player, daemon=True, name="gsim-view-play").start()
        self.overlays = gui.add_checkbox("overlays (frusta, path, boxes, points)", True)
        self.overlays.on_update(lambda _: self.server.scene.set_global_visibility(self.overlays.value))
        if self.steps:
            self._metrics_plot()
        if self.target.inserted or self.target.removed:
            gone = [r if isinstance(r, str) else r.id for r in self.target.removed]
            gui.add_markdown(f"inserted (green): {', '.join(sorted(self.target.inserted)) or 'none'}; removed "
                             f"(red, where the source log tracks them): {', '.join(gone) or 'none'}")
        self.lidar_box = self.range_panel = None
        if self.scene is not None and self._lidar() is not None:
            self.lidar_box = gui.add_checkbox("LiDAR sweep (gsim; the log's in grey)", False)
            self.lidar_box.on_update(lambda _: self._draw_lidar())
            self.range_panel = gui.add_image(np.zeros((8, 64, 3), np.uint8), label="LiDAR range image (gsim)")
        self.side_by_side = None
        if self.scene is not None and self.log is not None and self.log.cameras:
            self.camera_pick = gui.add_dropdown("log camera", tuple(self.log.cameras))
            self.shift = gui.add_slider("lane shift (m)", -4.0, 4.0, 0.1, 0.0)
            gui.add_button("view from it").on_click(lambda ev: self.snap(ev.client))
            self.side_by_side = gui.add_image(np.zeros((8, 16, 3), np.uint8), label="gsim | recorded")
            self.camera_pick.on_update(lambda _: self._draw_side_by_side())
            self.shift.on_update(lambda _: self._draw_side_by_side())

    def _player(self) -> None:
        span = self.time_slider.max
        while not self._stopped.wait(0.1):
            if self.play.value:
                self.time_slider.value = (self.time_slider.value + 0.1 * PLAY_RATE) % span

    def _time_changed(self) -> None:
        self._draw_actors()
        self._draw_frusta()
        self._draw_side_by_side()
        if self.lidar_box is not None and self.lidar_box.value:
            self._draw_lidar()
        for c in self.server.get_clients().values():
            self._dirty(c)

    # ------------------------------------------------------------------ overlays
    def _draw_overlays(self) -> None:
        if self.log is not None:
            path = self.log.ego_poses[:, :3, 3]
            if len(path) > 1:
                self.server.scene.add_line_segments("/ego_path", np.stack([path[:-1], path[1:]], 1).astype(np.float32),
                                                    colors=(255, 200, 0), thickness=3.0,
                                                    thickness_units="screen")
        self._draw_actors()
        self._draw_frusta()
        self._draw_side_by_side()

    def _metrics_plot(self) -> None:
        """A closed-loop run's speed and time to collision over its steps, and its first collision marked."""
        from viser import uplot
        m = [(r["t_us"], r["metrics"]) for r in self.steps if r.get("metrics")]
        if not m:
            return
        t0 = self.times[0] if self.times is not None else m[0][0]
        x = np.array([(t - t0) * 1e-6 for t, _ in m])
        speed = np.array([r["speed_mps"] for _, r in m], float)
        ttc = np.array([min(r["ttc_s"] if r["ttc_s"] is not None else 10.0, 10.0) for _, r in m], float)
        self.server.gui.add_uplot((x, speed, ttc), (uplot.Series(label="t (s)"),
                                                    uplot.Series(label="speed (m/s)", stroke="#3b82f6"),
                                                    uplot.Series(label="TTC (s, <= 10)", stroke="#f97316")),
                                  title="run metrics", aspect=2.0)
        hit = next((r for r in self.steps if (r.get("metrics") or {}).get("collision")), None)
        if hit is not None:
            b = hit["ego_box"]
            self.server.scene.add_box("/collision", color=(255, 30, 30), dimensions=tuple(b["size"]),
                                      position=tuple(b["xyz"]), wxyz=_yaw_quat(b["yaw"]))
            self.server.scene.add_label("/collision/label", f"collision at {(hit['t_us'] - t0) * 1e-6:.1f} s with "
                                        f"{', '.join(hit['metrics']['collision_with'])}", position=(0.0, 0.0, 2.0))
            self.server.gui.add_markdown(f"**collision** at {(hit['t_us'] - t0) * 1e-6:.1f} s with "
                                         f"{', '.join(hit['metrics']['collision_with'])}")

    def _draw_actors(self) -> None:
        """Boxes with ids and classes at the current time: a run's ego and every actor (SUMO's too) where its step
        recorded them; else the scene's actors on their tracks (a scenario output's inserted ones green) and the
        removed ones the source log tracks (red). Boxes no longer there (a vehicle that left a run) are removed."""
        t = self.time_us or 0
        boxes = []  # (id, label, size, position, wxyz, colour)
        if self.steps:
            step = min(self.steps, key=lambda r: abs(r["t_us"] - t))
            for b, color in [(step["ego_box"], (255, 220, 0))] + [(a, (60, 160, 255)) for a in step["actors"]]:
                boxes.append(("ego" if b is step["ego_box"] else b["id"], f"{b['id']} ({b['category']})", b["size"],
                              b["xyz"], _yaw_quat(b["yaw"]), color))
        else:
            placed = [(a, (60, 220, 90) if a.id in self.target.inserted else (60, 160, 255), a.category)
                      for a in self.scene.actors]
            placed += [(r, (230, 40, 40), f"{r.category}, removed") for r in self.target.removed
                       if not isinstance(r, str)]
            for a, color, category in placed:
                T = a.pose_at(t)
                boxes.append((a.id, f"{a.id} ({category})", a.size, T[:3, 3], rotmat_to_quat(T[:3, :3][None])[0],
                              color))
        drawn = {}
        for aid, label, size, position, wxyz, color in boxes:
            node = f"/actors/{aid}"
            drawn[node] = self.server.scene.add_box(node, color=color, dimensions=tuple(size), wxyz=wxyz,
                                                    position=tuple(position), wireframe=True)
            self.server.scene.add_label(f"{node}/label", label, position=(0.0, 0.0, 0.5 * size[2] + 0.3))
        for node, handle in self._boxes.items():
            if node not in drawn:
                handle.remove()
        self._boxes = drawn

    def _frame(self):
        """The log frame nearest the current time."""
        t = self.time_us or 0
        return min(self.log.frames, key=lambda f: abs(f.timestamp_us - t))

    def _draw_frusta(self) -> None:
        if self.log is None or not self.log.frames:
            return
        frame = self._frame()
        for name, obs in frame.cameras.items():
            cam = self.log.cameras[name].camera
            T = self.log.T_world_camera(obs)
            image = self.log.image(obs)
            step = max(1, image.shape[1] // 160)  # a thumbnail
            self.server.scene.add_camera_frustum(
                f"/log_cameras/{name}", fov=fov_y(cam), aspect=cam.width / cam.height, scale=0.6,
                wxyz=rotmat_to_quat(T[:3, :3][None])[0], position=T[:3, 3], image=to_uint8(image[::step, ::step]),
                color=(255, 120, 0))

    def _log_camera_pose(self, name: str):
        """(the log camera's observation nearest the current time, its pose as the scene places it, moved by the
        lane-shift slider along the camera's x axis), or None where that frame has no image of it."""
        obs = self._frame().cameras.get(name)
        if obs is None:
            return None
        T = self.scene.log_pose(self.log.T_world_camera(obs), obs.timestamp_us)
        T[:3, 3] += T[:3, 0] * float(self.shift.value)
        return obs, T

    def _draw_side_by_side(self) -> None:
        """The selected log camera at the current frame: gsim's render at its pose (and lane shift) beside the
        recorded image."""
        if self.side_by_side is None:
            return
        name = self.camera_pick.value
        got = self._log_camera_pose(name)
        if got is None:
            return
        obs, T = got
        with self.render_lock:
            f = self.renderer.camera(self.log.cameras[name].camera, T, obs.timestamp_us, name, numpy=True)
        self.side_by_side.image = np.concatenate([to_uint8(f.rgb), to_uint8(self.log.image(obs))], 1)

    def _lidar(self):
        """(name, LidarSpec) of the log's first LiDAR with a beam model, or None."""
        if self.log is None:
            return None
        from gsim.editing.outputs import lidar_spec
        for name in self.log.lidars:
            spec = lidar_spec(self.log, name)
            if spec is not None:
                return name, spec
        return None

    def _draw_lidar(self) -> None:
        """gsim's sweep at the current time from the log's LiDAR pose (coloured by intensity, else range) and the
        log's own sweep of the nearest frame (grey), with gsim's range image in the panel."""
        empty = np.zeros((0, 3), np.float32)
        if not self.lidar_box.value:
            for node in ("/lidar/gsim", "/lidar/log"):
                self.server.scene.add_point_cloud(node, empty, np.zeros((0, 3), np.uint8))
            return
        name, spec = self._lidar()
        t = self.time_us
        T = self.scene.log_pose(self.log.T_world_vehicle(t) @ self.log.lidars[name].T_vehicle_lidar, t)
        with self.render_lock:
            f = self.renderer.lidar(spec, T, t, rolling=False)
        v = f.intensity if f.intensity is not None else np.clip(f.ranges / 60.0, 0, 1)
        colors = np.stack([v, 0.4 + 0.6 * v, 1.0 - v], 1)
        self.server.scene.add_point_cloud("/lidar/gsim", (f.points @ T[:3, :3].T + T[:3, 3]).astype(np.float32),
                                          (colors * 255).astype(np.uint8), point_size=0.05)
        obs = self._frame().lidars.get(name)
        if obs is not None:
            pts = self.log.sweep(obs)[:, :3].astype(np.float64)
            Tl = self.scene.log_pose(self.log.T_world_lidar(obs), obs.timestamp_us)
            self.server.scene.add_point_cloud("/lidar/log", (pts @ Tl[:3, :3].T + Tl[:3, 3]).astype(np.float32),
                                              (150, 150, 150), point_size=0.04)
        rng = np.clip(f.range_image / max(spec.max_range_m, 1e-6), 0, 1)
        img = np.stack([rng, 1 - np.abs(2 * rng - 1), 1 - rng], -1) * (f.range_image > 0)[..., None]
        self.range_panel.image = (np.repeat(img, max(1, 256 // img.shape[0] // 4), 0) * 255).astype(np.uint8)

    # ------------------------------------------------------------------ the view
    def snap(self, client, name: Optional[str] = None) -> None:
        """Put ``client``'s view at a log camera (the dropdown's, or ``name``) at the current time, shifted by the
        lane-shift slider along the camera's x axis."""
        name = name or self.camera_pick.value
        got = self._log_camera_pose(name)
        if got is None:
            return
        cam = self.log.cameras[name].camera
        self.look(client, got[1], fov_y(cam))

    @staticmethod
    def look(client, T_world_camera: np.ndarray, fov_y: float) -> None:
        """Set a browser's camera (viser's API): pose (OpenCV axes) and vertical field of view."""
        with client.atomic():
            client.camera.fov = float(fov_y)
            client.camera.wxyz = rotmat_to_quat(T_world_camera[:3, :3][None])[0]
            client.camera.position = T_world_camera[:3, 3]

    def preview_renderer(self, width: int):
        """The renderer of a preview ``width`` pixels wide: on a CPU, of the scene thinned to the largest of
        PREVIEW_FRACTIONS within (width / FULL_WIDTH)^2 (the smallest below them all); the full scene on a GPU."""
        if not self._previews:
            return self.renderer
        need = (width / FULL_WIDTH) ** 2
        return self._previews[max([f for f in PREVIEW_FRACTIONS if f <= need], default=min(PREVIEW_FRACTIONS))]

    def render_view(self, T_world_camera: np.ndarray, fov_y: float, aspect: float, width: int,
                    preview: bool = False):
        """(rgb uint8 (H,W,3), depth (H,W) m) of the scene at the current time, as a browser view of that pose,
        vertical field of view and aspect sees it (``preview``: drawn by the preview renderer)."""
        height = max(1, int(round(width / aspect)))
        renderer = self.preview_renderer(width) if preview else self.renderer
        with self.render_lock:
            f = renderer.camera(browser_camera(width, height, fov_y), T_world_camera, self.time_us, numpy=True)
        depth = np.where(f.alpha > 0.5, f.depth, 0.0).astype(np.float32)  # 0: nothing there, overlays show
        return to_uint8(f.rgb), depth

    def _connect(self, client) -> None:
        if self.renderer is None:  # nothing to render: the recorded images and boxes are the view
            return
        self._clients[client.client_id] = {"dirty": threading.Event(), "full": None, "preview": PREVIEW_WIDTH}
        client.camera.on_update(lambda _: self._dirty(client))
        threading.Thread(target=self._serve_client, args=(client,), daemon=True,
                         name=f"gsim-view-{client.client_id}").start()

    def _dirty(self, client) -> None:
        state = self._clients.get(client.client_id)
        if state is not None:
            state["full"] = None
            state["dirty"].set()

    def _serve_client(self, client) -> None:
        """Render this browser's view whenever its camera or the time changes: a preview at once, the full
        resolution once the camera rests."""
        state = self._clients[client.client_id]
        ev = state["dirty"]
        ev.set()
        while client.client_id in self.server.get_clients():
            if not ev.wait(0.1) and state["full"] is not None:
                continue
            ev.clear()
            try:
                cam = client.camera
                still = time.time() - cam.update_timestamp >= SETTLE_S
                T, fov, aspect = pose_of(cam.wxyz, cam.position), cam.fov, cam.aspect
            except (AssertionError, AttributeError):  # no camera state from this browser yet
                time.sleep(0.05)
                ev.set()
                continue
            key = (T.tobytes(), fov, aspect, self.time_us)
            if still and state["full"] == key:
                continue
            t0 = time.perf_counter()
            rgb, depth = self.render_view(T, fov, aspect, FULL_WIDTH if still else state["preview"], not still)
            client.scene.set_background_image(rgb, format="jpeg", jpeg_quality=90, depth=depth)
            self.renders += 1
            if not still:  # the next preview's width: (time ~ fixed + width^2) nudged towards PREVIEW_HZ
                took, goal = time.perf_counter() - t0, 1.0 / PREVIEW_HZ
                scale = 0.85 if took > goal else (1.1 if took < 0.7 * goal else 1.0)
                state["preview"] = int(min(PREVIEW_WIDTH, max(MIN_PREVIEW_WIDTH, state["preview"] * scale)))
            if still:
                state["full"] = key
            else:
                threading.Timer(SETTLE_S, ev.set).start()  # then the full resolution, if it has rested

    def stop(self) -> None:
        self._stopped.set()
        self.server.stop()


def _check_port(host: str, port: int) -> None:
    """InputError when ``host:port`` cannot be bound (in use, or not this machine's address)."""
    import socket
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise InputError(f"--port {port}: cannot serve on {host}:{port} ({e.strerror or e}); choose another "
                             f"port (0: any free one)") from None


def serve_forever(viewer: Viewer) -> None:
    print(f"gsim view: {viewer.url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        viewer.stop()
