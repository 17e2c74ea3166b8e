"""`gsim view` in a real browser: view updates per second while the camera moves, and the time to full resolution
once it stops.

Usage: python bench/bench_viewer.py SCENE_OR_DIR [--seconds 6] [--rate 30] [--backend auto]
A headless Chromium (Debian's chromium and chromium-driver, driven by selenium) opens the viewer at 800x600; the
camera is moved through viser's API along a 2 m/s path at --rate updates per second for --seconds; the viewer's
renders sent in that time give updates/s (previews, whose width the viewer adapts, and the width they settled at);
then the camera stops and the time from its last move until the full-resolution view (FULL_WIDTH) has been sent is
measured, five times (it includes SETTLE_S, the rest the viewer waits for). The browser shares the machine's cores
(software WebGL without a GPU). Prints one JSON line, with the median render times without the browser (a preview,
the same width with every surfel, the full width) and the preview's PSNR against drawing every surfel.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gsim.bridges.browser.viewer import FULL_WIDTH, PREVIEW_WIDTH, Viewer, open_target, pose_of  # noqa: E402
from gsim.images import psnr  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rate", type=float, default=30.0)
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args(argv)
    from test_viewer import chromium  # the tests' headless Chromium
    v = Viewer(open_target(a.path), port=0, backend=a.backend)
    d = chromium()
    try:
        d.get(v.url)
        while not v._clients or all(s["full"] is None for s in v._clients.values()):
            time.sleep(0.1)
        client = next(iter(v.server.get_clients().values()))
        if v.log is not None:
            v.snap(client, next(iter(v.log.cameras)))
            time.sleep(1.0)
        T0 = pose_of(client.camera.wxyz, client.camera.position)
        n0, t0 = v.renders, time.time()
        while time.time() - t0 < a.seconds:
            client.camera.position = T0[:3, 3] + T0[:3, 2] * 2.0 * (time.time() - t0)
            time.sleep(1.0 / a.rate)
        moving = (v.renders - n0) / (time.time() - t0)
        preview = v._clients[client.client_id]["preview"]
        settle = []
        state = v._clients[client.client_id]
        for k in range(5):
            time.sleep(1.0)
            client.camera.position = T0[:3, 3] + T0[:3, 0] * 0.2 * (k + 1)
            t1 = time.time()
            while state["full"] is not None and time.time() - t1 < 2.0:  # the browser's camera update arrives
                time.sleep(0.002)
            while state["full"] is None:
                time.sleep(0.002)
            settle.append(time.time() - t1)
        alone = {}
        for w, thin in ((PREVIEW_WIDTH, True), (PREVIEW_WIDTH, False), (FULL_WIDTH, False)):
            times = []
            for _ in range(5):
                t1 = time.perf_counter()
                rgb, _ = v.render_view(T0, client.camera.fov, client.camera.aspect, w, thin)
                times.append(time.perf_counter() - t1)
            alone[f"render_ms_{w}{'_preview' if thin else ''}"] = round(1e3 * statistics.median(times), 1)
            if thin:
                shown = rgb
            elif w == PREVIEW_WIDTH:  # what the preview loses against drawing every surfel at its width
                alone["preview_psnr_db"] = round(psnr(shown / 255.0, rgb / 255.0), 2)
        result = {"path": a.path, "backend": v.renderer.backend, **alone, "canvas": [client.camera.image_width,
                  client.camera.image_height], "preview_width_settled": preview, "full_width": FULL_WIDTH,
                  "updates_per_s_moving": round(moving, 2),
                  "median_s_to_full_resolution": round(statistics.median(settle), 3)}
        print(json.dumps(result))
        return result
    finally:
        d.quit()
        v.stop()


if __name__ == "__main__":
    main()
