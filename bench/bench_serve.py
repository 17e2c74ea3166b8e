"""Network sensor API benchmark: `gsim serve` on the demo street over loopback against the same work in
process: RenderCamera latency at 640x360 (raw and PNG), RenderLidar for a 64-beam sweep, RenderCamera
throughput with 1, 2, 4 and 8 concurrent clients, and a remote closed-loop session's step rate.

    .venv/bin/python bench/bench_serve.py [--out out/bench/serve] [--repeats 15] [--steps 20]
        [--scene out/demo] [--backend auto] [--workers 1] [--no-sessions]

Needs the demo street at out/demo (`./quickstart.sh demo`) or another --scene (then its log's first camera and
LiDAR); the session needs SUMO (--no-sessions leaves it out, as on a GPU machine). Writes OUT/bench.json and prints
the tables (medians). The server and this process share the machine's cores: run nothing else meanwhile.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

import gsim  # noqa: E402
from gsim.bridges.closed_loop.agents import load_agent  # noqa: E402
from gsim.bridges.api.client import SensorClient  # noqa: E402
from gsim.bridges.closed_loop.runner import run  # noqa: E402
from gsim.bridges.api.server import ServerProcess  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up (JIT, caches)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def _throughput(address: str, clients: int, calls: int, request) -> dict:
    """``clients`` threads with a channel each, ``calls`` RenderCamera calls each: calls/s and refusals."""
    ok, refused, failed = [0], [0], []
    lock = threading.Lock()

    def worker():
        with SensorClient(address) as c:
            for _ in range(calls):
                try:
                    request(c)
                    with lock:
                        ok[0] += 1
                except grpc.RpcError as e:
                    with lock:
                        (refused.__setitem__(0, refused[0] + 1) if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                         else failed.append(e.code().name))
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return {"clients": clients, "calls": clients * calls, "ok": ok[0], "resource_exhausted": refused[0],
            "failed": failed, "wall_s": round(wall, 2), "calls_per_s": round(ok[0] / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/bench/serve")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--scene", default="out/demo", help="the scene or reconstruction directory served (its log's "
                                                        "first camera and LiDAR are used)")
    ap.add_argument("--backend", default="auto", help="the server's camera backend")
    ap.add_argument("--workers", type=int, default=1, help="the server's render workers (>1: gsplat)")
    ap.add_argument("--no-sessions", action="store_true", help="leave out the closed-loop session (it needs SUMO)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from gsim.scenes.log import scene_and_log_dirs
    scene = gsim.load_scene(scene_and_log_dirs(Path(a.scene))[0])
    sid = Path(a.scene).resolve().name  # the served id: the folder's name
    res = {"scene": a.scene, "backend": a.backend, "workers": a.workers}
    served = [a.scene] + ([] if a.no_sessions else ["stopped-car"])
    with ServerProcess(served + ["--sessions-dir", str(out / "sessions"), "--backend", a.backend, "--workers",
                                 str(a.workers)]) as srv, SensorClient(srv.address) as c:
        d = c.describe_scene(sid)
        front, T_vc = next(iter(d.cameras.values()))
        cam = gsim.PinholeCamera(640, 360, 2 * front.fx, 2 * front.fy, 320.0, 180.0)  # the first camera at 640x360
        spec, T_vl = next(iter(d.lidars.values()))
        hdl = gsim.LidarSpec.preset("velodyne-hdl64e")
        t = d.start_us + 1_000_000
        T = d.ego_pose(t) @ T_vc
        TL = d.ego_pose(t) @ T_vl
        local = lambda: gsim.render_camera(scene, cam, T, timestamp_us=t, backend=a.backend)  # noqa: E731
        res["camera"] = {"size": f"{cam.width}x{cam.height}", "in_process_ms": _median_ms(local, a.repeats),
                         "remote_raw_ms": _median_ms(lambda: c.render_camera(sid, cam, T, timestamp_us=t), a.repeats),
                         "remote_png_ms": _median_ms(lambda: c.render_camera(sid, cam, T, timestamp_us=t,
                                                                             encoding="png"), a.repeats),
                         "remote_rgb_only_raw_ms": _median_ms(lambda: c.render_camera(
                             sid, cam, T, timestamp_us=t, depth=False, alpha=False), a.repeats),
                         "in_process_again_ms": _median_ms(local, a.repeats)}  # (the order's effect)
        n = max(3, a.repeats // 3)
        res["lidar"] = {"spec": hdl.name, "rays": hdl.lasers * hdl.columns,
                        "in_process_ms": _median_ms(lambda: gsim.render_lidar(scene, hdl, TL, timestamp_us=t), n),
                        "remote_ms": _median_ms(lambda: c.render_lidar(sid, hdl, TL, timestamp_us=t), n)}
        res["throughput"] = [_throughput(srv.address, k, max(4, 24 // k),
                                         lambda cl: cl.render_camera(sid, cam, T, timestamp_us=t, depth=False,
                                                                     alpha=False)) for k in (1, 2, 4, 8)]
        if a.no_sessions:
            return _report(res, out)
        agent = load_agent("lidar-aeb")
        with c.session("stopped-car", agent_name="lidar-aeb", max_steps=a.steps) as s:
            agent.reset(s.info)
            obs, times = s.observation, []
            while not s.done:
                t0 = time.perf_counter()
                obs, _, _ = s.step(agent.act(obs))
                times.append(time.perf_counter() - t0)
        res["session_remote"] = {"steps": len(times), "step_ms": float(np.median(times) * 1e3),
                                 "steps_per_s": float(1 / np.median(times))}
    local = run("stopped-car", "lidar-aeb", out / "in_process", progress=False, max_steps=a.steps)
    res["session_in_process"] = {"steps": local["steps"], "step_ms": local["timing_ms"]["step"],
                                 "steps_per_s": 1e3 / local["timing_ms"]["step"]}
    return _report(res, out)


def _report(res: dict, out: Path) -> int:
    (out / "bench.json").write_text(json.dumps(res, indent=1))
    cam_r, li = res["camera"], res["lidar"]
    print(f"| RenderCamera {cam_r['size']} | in process {cam_r['in_process_ms']:.1f} / "
          f"{cam_r['in_process_again_ms']:.1f} ms (before / after) | remote raw "
          f"{cam_r['remote_raw_ms']:.1f} ms (rgb only {cam_r['remote_rgb_only_raw_ms']:.1f}) | remote PNG "
          f"{cam_r['remote_png_ms']:.1f} ms |")
    print(f"| RenderLidar {li['spec']} ({li['rays']} rays) | in process {li['in_process_ms']:.1f} ms | remote "
          f"{li['remote_ms']:.1f} ms |")
    for r in res["throughput"]:
        print(f"| {r['clients']} clients | {r['calls_per_s']:.2f} calls/s | {r['ok']}/{r['calls']} ok, "
              f"{r['resource_exhausted']} RESOURCE_EXHAUSTED, failed {r['failed']} |")
    if "session_remote" not in res:
        return 0
    print(f"| closed-loop step | remote {res['session_remote']['step_ms']:.0f} ms "
          f"({res['session_remote']['steps_per_s']:.2f} steps/s) | in process {res['session_in_process']['step_ms']:.0f} "
          f"ms ({res['session_in_process']['steps_per_s']:.2f} steps/s) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
