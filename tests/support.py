"""Helpers that several test modules share (plain functions and constants; the fixtures are in conftest.py).
Only light imports at module level: the tests that need an extra skip before they call what needs it."""
import numpy as np

import gsim
from gsim.surfels import rgb_to_sh
from gsim.transforms import rotmat_to_quat

# cameras for the renderers' parity tests: each model, with off-centre principal points
PIN = gsim.PinholeCamera(64, 64, 100.0, 100.0, 32.0, 32.0)
CAMERAS = [
    gsim.PinholeCamera(48, 32, 40.0, 42.0, 24.5, 15.5),
    gsim.OpenCVCamera(48, 32, 40.0, 42.0, 23.0, 17.0, k1=-0.2, k2=0.05, p1=0.002, p2=-0.001),
    gsim.FisheyeCamera(48, 32, 20.0, 20.0, 24.0, 16.0, k1=0.02, k2=-0.005),
]

# a sedan standing across the ego's lane of `loop_street`, 15 m ahead (a closed-loop scenario's edits)
ACROSS = [{"kind": "insert", "asset": "sedan", "id": "across",
           "track": {"poses": [{"t_us": 0, "xyz": [15.0, -1.75, 0.0], "yaw_deg": 90.0}]}}]


def plane(slope: float = 0.0, extent: float = 30.0, spacing: float = 0.25, hole=None) -> gsim.Surfels:
    """A ground plane z = slope * x over |x|, |y| <= extent (grey), tiled by overlapping surfels;
    ``hole``: (xmin, xmax, ymin, ymax) left empty."""
    xs, ys = np.meshgrid(np.arange(-extent, extent, spacing), np.arange(-extent, extent, spacing), indexing="ij")
    x, y = xs.ravel(), ys.ravel()
    if hole is not None:
        keep = ~((x > hole[0]) & (x < hole[1]) & (y > hole[2]) & (y < hole[3]))
        x, y = x[keep], y[keep]
    n = np.array([-slope, 0.0, 1.0]) / np.hypot(slope, 1.0)
    ax = np.array([1.0, 0.0, slope]) / np.hypot(slope, 1.0)
    R = np.stack([ax, np.cross(n, ax), n], axis=1)
    m = len(x)
    rgb = 0.35 + 0.1 * ((np.floor(x) + np.floor(y)) % 2)[:, None] * np.ones(3)
    return gsim.Surfels(np.c_[x, y, slope * x], np.tile(rotmat_to_quat(R), (m, 1)), np.full((m, 2), 0.8 * spacing),
                        np.full(m, 0.95), rgb_to_sh(rgb)[:, None, :])


def pose(x, y, yaw=0.0, z=0.0):
    T = np.eye(4)
    c, s = np.cos(yaw), np.sin(yaw)
    T[:3, :3] = [[c, -s, 0], [s, c, 0], [0, 0, 1]]
    T[:3, 3] = (x, y, z)
    return T


def loop_street(root, options):
    """A synthetic log of ``options`` (seed 0: the ego drives along +x in the lane at y = -1.75) at root/log and a
    scene at root/scene: a ground plane with a parked sedan in the parking lane (x = 12, y = 4.75), actor 'parked',
    over the log's span; returns root."""
    from gsim.editing import AssetLibrary, insert_actor
    from gsim.scenes.synth import FRAME_PERIOD_US, synthesize
    synthesize(root / "log", seed=0, options=options, progress=False)
    scene = insert_actor(gsim.Scene(background=plane(extent=70.0, spacing=0.5)), AssetLibrary.builtin().get("sedan"),
                         [0, options.n_frames * FRAME_PERIOD_US], [pose(12.0, 4.75)] * 2, actor_id="parked")
    scene.save(root / "scene")
    return root


def one_surfel(center, quat=(1, 0, 0, 0), scales=(0.2, 0.2), opacity=0.9, rgb=(1.0, 0.2, 0.1)):
    return gsim.Surfels(np.array([center], float), np.array([quat], float), np.array([scales], float),
                        np.array([opacity], float), np.array([rgb], float))


def random_scene(n, seed, sh_degree=1, spread=(2.0, 1.5, 1.0), z=6.0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k = (sh_degree + 1) ** 2
    colors = rng.normal(size=(n, k, 3)) * 0.3
    colors[:, 0] += 0.5
    return gsim.Surfels(rng.normal(size=(n, 3)) * spread + [0, 0, z], q, rng.uniform(0.05, 0.5, (n, 2)),
                        rng.uniform(0.1, 1.0, n), colors)


def scenario_dict(root, **over):
    d = {"schema_version": 1, "name": "t", "scene": str(root / "scene"), "log": str(root / "log"),
         "edits": [{"kind": "insert", "asset": "sedan", "id": "ahead",
                    "track": {"path": [[10.0, -1.75], [30.0, -1.75]], "speed_mps": 5.0}},
                   {"kind": "remove", "actor": "parked_a"}],
         "sensors": {"cameras": ["front"], "lidars": ["top"]},
         "output": str(root / "out")}
    d.update(over)
    return d


def scenario(root, name: str, edits=(), ego=None, **closed_loop) -> str:
    """A closed-loop scenario file on `loop_street` (root), written beside it (``ego``: its ego section); returns
    its path."""
    import yaml
    d = {"schema_version": 1, "name": name, "scene": str(root / "scene"), "log": str(root / "log"),
         "edits": list(edits), "sensors": {"cameras": ["front"], "lidars": ["top"]}, "closed_loop": closed_loop,
         **({} if ego is None else {"ego": ego})}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


def start_server(root, *extra, env=None):
    """A real `gsim serve` subprocess serving `loop_street` (root) and the ACROSS scenario."""
    from gsim.bridges.api.server import ServerProcess
    path = scenario(root, "across", ACROSS)
    return ServerProcess([str(root / "scene"), path, "--sessions-dir", str(root / "sessions"), *extra], env=env)


def own_device_waits(fn) -> list:
    """Where gsim's own code made the host wait for a CUDA GPU while ``fn()`` ran ("file:line" each): torch's sync
    debug mode warns at every such operation (a value read, a data-dependent size, a blocking copy either way),
    from the Python line that called it; lines in installed packages (gsplat's, torch's) are not gsim's."""
    import warnings
    from pathlib import Path

    import torch
    root = Path(__file__).resolve().parents[1]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    own = lambda f: Path(f).resolve().is_relative_to(root) and "site-packages" not in f  # noqa: E731
    return [f"{w.filename}:{w.lineno}" for w in seen if "synchroniz" in str(w.message) and own(w.filename)]
