"""Camera rendering benchmark: the demo street (ground, two facades, objects) along a drive.

Usage: python bench/bench_camera.py [--surfels 100000] [--width 640 --height 360]
       [--frames 20] [--backends numba,torch] [--torch-frames 3] [--resident [--profile]]
Prints per-backend median frame time and frames/s, and the numba/torch speed-up. Through the numpy API
(`gsim.render_camera`: surfels uploaded, outputs downloaded per frame) and, with --resident, through a
`gsim.resident.Renderer` (the scene on the backend's device once; rgb, alpha and depth left there; the GPU
synchronised before each frame's clock stops), also with the three cameras of a rig in one call, and its `images`
(rgb alone, 8-bit images brought to the host). --profile (gsplat):
where a resident frame's GPU time goes, and gsplat's own call with one option changed at a time.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import gsim
from gsim.street import demo_camera, drive_trajectory, street_surfels


def time_backend(surfels, camera, poses, backend: str) -> list:
    gsim.render_camera(surfels, camera, poses[0], backend=backend)  # warm-up: JIT / caches
    times = []
    for T in poses:
        t0 = time.perf_counter()
        gsim.render_camera(surfels, camera, T, backend=backend)
        times.append(time.perf_counter() - t0)
    return times


def time_resident(surfels, camera, poses, backend: str, cameras: int = 1, images: bool = False) -> list:
    """Frame times through a resident renderer: ``cameras`` views per call (a rig: the pose and two turned 50
    degrees either side), outputs left on the device; with ``images`` `Renderer.images` (rgb alone, 8-bit numpy
    images on the host: what a camera sensor gives)."""
    from gsim.resident import Renderer
    r = Renderer(gsim.Scene(background=surfels), backend)
    sync = (lambda: __import__("torch").cuda.synchronize()) if backend == "gsplat" else (lambda: None)

    from bench_loop_sensors import turned  # (the loop benchmark's rig: the same three cameras)

    def rig(T):
        return [(camera, turned(T, yaw), None) for yaw in (0.0, -50.0, 50.0)[:cameras]]
    call = r.images if images else r.cameras
    call(rig(poses[0]))
    sync()
    times = []
    for T in poses:
        t0 = time.perf_counter()
        call(rig(T))
        sync()
        times.append(time.perf_counter() - t0)
    return times


def profile_resident(surfels, camera, poses, backend: str, rows: int = 15) -> str:
    """torch.profiler's table of one-camera resident calls on the GPU (the kernels by their own CUDA time): where
    a resident frame's time goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gsim.resident import Renderer
    r = Renderer(gsim.Scene(background=surfels), backend)
    r.cameras([(camera, poses[0], None)])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for T in poses:
            r.cameras([(camera, T, None)])
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)


def gsplat_variants(surfels, camera, poses) -> str:
    """gsim's gsplat rasterization of the resident surfels (`gsplat_backend.rasterize`), gsplat's own
    `rasterization_2dgs` as gsim called it before (with its host waits and normals from depth), and that call with
    one option changed at a time (what an option would buy towards the 150 frames/s aim): median ms a frame (the GPU
    synchronised around each), the surfels in view and tile intersections of the first frame (gsplat's calls), and
    the largest rgb change against gsim's."""
    import gsplat
    import torch

    from gsim.render.common import RenderOptions
    from gsim.render.gsplat_backend import rasterize
    from gsim.transforms import invert
    from gsim.resident import Renderer
    s = Renderer(gsim.Scene(background=surfels), "gsplat").surfels_at(None)
    scales3 = torch.cat([s.scales, torch.ones_like(s.scales[:, :1])], 1)
    on = lambda x: torch.as_tensor(np.asarray(x), dtype=torch.float32, device="cuda")  # noqa: E731
    K, options = on(camera.K)[None], RenderOptions()
    bg = on(options.background)

    views = [(on(invert(T))[None], on(T[:3, 3])[None]) for T in poses]  # (view matrix, centre)

    def theirs(**change):
        kw = {**dict(render_mode="RGB+ED", packed=False, tile_size=16, radius_clip=0.0), **change}
        return lambda V, c: gsplat.rasterization_2dgs(s.means, s.quats, scales3, s.opacities, s.colors, V, K,
                                                      camera.width, camera.height, near_plane=options.near,
                                                      far_plane=options.far, sh_degree=surfels.sh_degree,
                                                      backgrounds=bg[None], **kw)
    calls = {"gsim's composition": lambda V, c: rasterize(s, surfels.sh_degree, V, K, c,
                                                            (camera.width, camera.height), bg, options),
             "  rgb alone (Renderer.images)": lambda V, c: rasterize(s, surfels.sh_degree, V, K, c,
                                                                      (camera.width, camera.height), bg, options,
                                                                      depth=False),
             # (no packed variant: gsplat 1.5.3's rasterization_2dgs does not index the colours by the packed ids,
             # its code for that is commented out, so SH colours fail its spherical_harmonics' shape assert, as on the
             # H200 on 2026-11-28, and plain colours would be the wrong length)
             "rasterization_2dgs": theirs(), "  RGB only": theirs(render_mode="RGB"), "  tile 8": theirs(tile_size=8),
             "  radius_clip 1 px": theirs(radius_clip=1.0), "  radius_clip 2 px": theirs(radius_clip=2.0)}
    rows, ref = [], None
    for name, call in calls.items():
        first = call(*views[0])
        rgb = first[0][0, ..., :3]
        ref = rgb if ref is None else ref
        meta = first[-1] if isinstance(first[-1], dict) else None
        seen = (f"in view {int((meta['radii'] > 0).all(-1).sum())}  intersections {len(meta['isect_ids'])}"
                if meta else "")
        times = []
        for V, c in views:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call(V, c)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        rows.append(f"{name:20s} {med * 1e3:7.2f} ms ({1 / med:6.1f} frames/s)  max rgb change "
                    f"{float((rgb - ref).abs().max()):.4f}  {seen}")
    return "gsplat 2DGS, one frame a call:\n" + "\n".join(rows)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=100_000)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--torch-frames", type=int, default=3, help="frames for the (slow) torch reference")
    ap.add_argument("--backends", default="numba,torch")
    ap.add_argument("--resident", action="store_true", help="also through a resident Renderer (1 and 3 cameras)")
    ap.add_argument("--profile", action="store_true", help="with --resident on gsplat: a torch.profiler table of "
                    "10 resident calls, and gsplat's rasterization timed with its options changed one at a time")
    args = ap.parse_args(argv)
    surfels = street_surfels(args.surfels)
    camera = demo_camera(args.width, args.height)
    poses = drive_trajectory(args.frames)
    result = {"surfels": len(surfels), "resolution": f"{args.width}x{args.height}",
              "machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cpus",
              "backends": {}}
    for b in args.backends.split(","):
        if b not in gsim.available_backends():
            result["backends"][b] = {"unavailable": gsim.backend_report()[b]}
            continue
        n = args.torch_frames if b == "torch" else args.frames
        idx = np.linspace(0, len(poses) - 1, n).round().astype(int)
        t = time_backend(surfels, camera, poses[idx], b)
        med = statistics.median(t)
        result["backends"][b] = {"frames": n, "median_ms": round(med * 1e3, 2), "fps": round(1 / med, 2)}
        print(f"{b:7s} {len(surfels)} surfels {args.width}x{args.height}: median {med * 1e3:.1f} ms "
              f"({1 / med:.1f} frames/s) over {n} frames", flush=True)
        for k, images in (((1, False), (3, False), (1, True), (3, True)) if args.resident and b != "numba" else ()):
            med = statistics.median(time_resident(surfels, camera, poses[idx], b, k, images))
            what = "images (rgb alone, 8 bits to the host)" if images else "frames (rgb, alpha, depth left there)"
            result["backends"][b][f"resident_{k}cam{'_images' if images else ''}_median_ms"] = round(med * 1e3, 2)
            print(f"{b:7s} resident {what}, {k} camera(s) a call: median {med * 1e3:.2f} ms a call "
                  f"({k / med:.1f} images/s)", flush=True)
        if args.profile and args.resident and b == "gsplat":
            print(profile_resident(surfels, camera, poses[idx[:10]], b), flush=True)
    r = result["backends"]
    if "median_ms" in r.get("numba", {}) and "median_ms" in r.get("torch", {}):
        result["numba_speedup_over_torch"] = round(r["torch"]["median_ms"] / r["numba"]["median_ms"], 1)
        print(f"numba speed-up over torch: {result['numba_speedup_over_torch']}x")
    print(json.dumps(result), flush=True)
    if args.profile and args.resident and "median_ms" in r.get("gsplat", {}):  # (last: an experiment, not the result)
        print(gsplat_variants(surfels, camera, poses[np.linspace(0, len(poses) - 1, args.frames).round().astype(int)]))
    return result


if __name__ == "__main__":
    main()
