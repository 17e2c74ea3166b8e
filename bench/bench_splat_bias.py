"""The camera renderer's bias on surfaces seen at grazing angles, and the pitch it asks of a camera.

Splatting composites a pixel's surfels front to back in the order of their centres' depth, and a surfel thinner
than a pixel on screen reaches it through 2DGS's screen-space low-pass (about 0.7 px, its centre depth). On a road
seen at a grazing angle one pixel row spans metres of road, many coplanar surfels reach it, and the nearer ones
take its transmittance first: the pixel shows the road's near side, where the image (a box filter over the pixel)
shows its average. Part 1 measures that on a flat road of coplanar surfels whose colour encodes their x: at each
distance, the rendered depth over the exact one and how far nearer the rendered colour comes from. Part 2 renders
the synthetic street's exact road (seed 0: surfels on a grid, coloured with the street's own shading from above)
from the log's exact pose of one front-camera frame, pitched up and raised, against the log's image on the road
pixels: the best pitch is what a reconstruction's view pose refinement learns to undo the bias (BENCHMARKS.md).
--surfaces EPS: both parts again with coplanar surfels composited as one surface (`RenderOptions.surface_eps`,
the torch backend: minutes at 5 cm spacing), where the road keeps its depth and asks for no pitch.

    .venv/bin/python bench/bench_splat_bias.py [--log DIR] [--frame 16] [--spacing 0.025] [--surfaces 0.01] [--out DIR]

--log: the synthetic log of seed 0 (default: made under --out); --out: where the picture goes (render | best
pitch | image, road pixels only).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from gsim.cameras import PinholeCamera
from gsim.render import render_camera
from gsim.render.common import RenderOptions
from gsim.scenes.log import load_log
from gsim.scenes.synth import _shade_kernel, build_street, reuse_or_synthesize
from gsim.surfels import Surfels

T_FORWARD = np.array([[0.0, 0, 1, 0], [-1, 0, 0, 0], [0, -1, 0, 1.6], [0, 0, 0, 1]])  # a camera 1.6 m up, along x


def road(xy: np.ndarray, rgb: np.ndarray, sigma: float, opacity: float = 0.95) -> Surfels:
    """Surfels lying on z = 0 at ``xy`` (N,2) with colours ``rgb`` (N,3)."""
    n = len(xy)
    return Surfels(np.c_[xy, np.zeros(n)].astype(np.float32), np.tile([1.0, 0, 0, 0], (n, 1)).astype(np.float32),
                   np.full((n, 2), sigma, np.float32), np.full(n, opacity, np.float32), rgb.astype(np.float32))


def flat_road(spacing: float = 0.05, sigma: float = 0.04, surfaces: float = 0.0) -> dict:
    """Part 1: {distance m: (rendered / exact depth, metres nearer the colour comes from)} at the image's centre
    column, a 320x200 pinhole (f 228.5 px) 1.6 m above the road; ``surfaces``: `RenderOptions.surface_eps`."""
    cam = PinholeCamera(320, 200, 228.5, 228.5, 160, 100)
    x, y = (a.ravel() for a in np.meshgrid(np.arange(1, 80, spacing), np.arange(-2, 2, spacing), indexing="ij"))
    f = render_camera(road(np.c_[x, y], np.repeat((x / 80)[:, None], 3, 1), sigma), cam, T_FORWARD, **_backend(surfaces))
    rgb, alpha, depth = (np.asarray(a).reshape(200, 320, -1)[:, 155:165].mean(1) for a in (f.rgb, f.alpha, f.depth))
    out = {}
    for row in (190, 160, 130, 115, 108):
        exact = 1.6 * cam.fy / (row + 0.5 - cam.cy)
        out[round(exact, 1)] = (float(depth[row, 0] / exact), float(exact - rgb[row, 0] / alpha[row, 0] * 80))
    return out


def _backend(surfaces: float) -> dict:
    """render_camera's backend and options: numba, or the torch backend compositing surfaces."""
    return ({"backend": "torch", "options": RenderOptions(surface_eps=surfaces)} if surfaces
            else {"backend": "numba"})


def pitched(T: np.ndarray, deg: float, rise_m: float) -> np.ndarray:
    """``T`` (a camera along the world's x) with its forward axis tilted up by ``deg`` and raised by ``rise_m``."""
    a = math.radians(deg)
    R = np.array([[math.cos(a), 0, -math.sin(a)], [0, 1, 0], [math.sin(a), 0, math.cos(a)]])  # about y by -a
    out = T.copy()
    out[:3, :3] = R @ T[:3, :3]
    out[2, 3] += rise_m
    return out


def street_road(log_dir: Path, frame: int, spacing: float, pitches, rises, surfaces: float = 0.0):
    """Part 2: ({rise cm: {pitch deg: road PSNR dB}}, the pictures at 0 and at the best, the image, the road mask)."""
    log = load_log(log_dir)
    st = build_street(0)
    obs = log.frames[frame].cameras["front"]
    cam, T = log.cameras["front"].camera, log.T_world_camera(obs)
    cars = st.car_poses([obs.timestamp_us])
    x, y = (a.ravel() for a in np.meshgrid(np.arange(T[0, 3] + 1.5, T[0, 3] + 70, spacing),
                                           np.arange(-6.5, 6.5, spacing), indexing="ij"))
    above = np.tile(np.eye(4), (len(x), 1, 1))
    above[:, 0, 3], above[:, 1, 3], above[:, 2, 3] = x, y, 20.0
    down = np.tile([0.0, 0.0, -1.0], (len(x), 1))
    hits = st._cast(above, down, np.arange(len(x)), np.repeat(cars, len(x), 0))  # each point from above it
    rgb = _shade_kernel(hits.prim, hits.normal, hits.local, np.ascontiguousarray(above[:, :3]), down, 1, True,
                        st._textures)
    ground = hits.prim == 0  # (not under a car, a tree or the sidewalk)
    surfels = road(np.c_[x, y][ground], np.clip(rgb[ground], 0, 1), 0.6 * spacing)
    rays = np.c_[cam.ray_table().reshape(-1, 2), np.ones(cam.width * cam.height)]
    seen = st._cast(T[None], rays, np.zeros(len(rays), np.int64), cars)
    world = rays @ T[:3, :3].T * seen.t[:, None] + T[:3, 3]
    mask = ((seen.prim == 0) & (world[:, 0] < T[0, 3] + 60)).reshape(cam.height, cam.width)
    image = np.asarray(log.image(obs), np.float32)
    image = image / 255 if image.max() > 1.5 else image
    table, renders = {}, {}
    for rise in rises:
        for deg in pitches:
            img = np.asarray(render_camera(surfels, cam, pitched(T, deg, rise), **_backend(surfaces)).rgb)
            img = img.reshape(cam.height, cam.width, 3)
            table.setdefault(round(rise * 100), {})[deg] = float(-10 * math.log10(((img - image) ** 2)[mask].mean()))
            renders[(rise, deg)] = img
    best = max(renders, key=lambda k: table[round(k[0] * 100)][k[1]])
    return table, best, (renders[(0.0, 0.0)], renders[best], image), mask


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path)
    ap.add_argument("--frame", type=int, default=16)
    ap.add_argument("--spacing", type=float, default=0.025)
    ap.add_argument("--surfaces", type=float, default=0.0, metavar="EPS",
                    help="composite coplanar surfels as one surface (the torch backend)")
    ap.add_argument("--out", type=Path, default=Path("out/bench/splat_bias"))
    a = ap.parse_args(argv)
    result = {"surfaces": a.surfaces, "flat_road": flat_road(surfaces=a.surfaces)}
    for d, (ratio, nearer) in result["flat_road"].items():
        print(f"flat road at {d:5.1f} m: depth x{ratio:.3f}, colour from {nearer:+.2f} m nearer")
    log_dir = a.log or reuse_or_synthesize(a.out / "log", seed=0)
    table, best, pictures, mask = street_road(log_dir, a.frame, a.spacing, (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7),
                                              (0.0, 0.01), a.surfaces)
    result.update(street_road_psnr=table, best={"rise_cm": round(best[0] * 100), "pitch_deg": best[1]})
    for rise, row in table.items():
        print(f"street {log_dir.name} frame {a.frame}, road PSNR, raised {rise} cm: "
              + "  ".join(f"{deg:+.1f} deg {p:.2f}" for deg, p in row.items()))
    from PIL import Image
    a.out.mkdir(parents=True, exist_ok=True)
    strip = np.concatenate([p * mask[..., None] for p in pictures], 1)
    Image.fromarray((np.clip(strip, 0, 1) * 255).astype(np.uint8)).save(a.out / "street_road.png")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
