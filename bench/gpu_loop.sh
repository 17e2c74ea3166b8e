#!/bin/bash
# The closed loop and gsim serve on a rented GPU, with SUMO itself (issue 32, item 4): SUMO's wheels are larger than a
# device call carries, so bench/pack_sumo.py packs what the loop loads (libsumo and its libraries, netconvert, SUMO's
# schemas) and the loop's pure-Python packages into 57 MB (.sumo/1: one call), and the server's grpcio 1.85.1 (the image
# has 1.84.0; the generated modules refuse it) and diffusers into .sumo/2 (another). Run it on the machine that
# bench/gpu_check.sh just ran on (its street reconstruction and gsplat build are still there), within the seconds the
# machine stays warm; folders carried earlier stay on the machine (ignored paths are kept between calls), and each call
# runs what the parts there so far allow and has not run yet (the loop: SUMO and the recording's packages; the server:
# grpcio 1.85.1). The image lacks libGL and libXrender, which libsumo's bundled libraries link for SUMO's GUI: the
# unpack builds stub libraries for them (functions that do nothing; never called here).
#
#   here:   python bench/pack_sumo.py pack .sumo --python 3.12     (once, or bench/gpu_prepare.sh; .sumo is ignored)
#   device: bash bench/gpu_loop.sh   carrying .sumo/1, then again carrying .sumo/2
#           ([STEPS=40] [SCENARIOS="stopped-car lead-car"] [OUT=DIR])
#
# The loop: `gsim closed-loop` with the lidar-aeb agent on the street reconstruction (the shipped scenarios' demo
# street, linked into out/demo), three cameras on the resident gsplat renderer, the LiDAR on the CUDA kernel,
# SUMO through libsumo, no video (no ffmpeg there); each run's steps/s and median stage times. The server:
# bench/bench_serve.py with gsplat and 4 workers, calls/s with 1, 2, 4 and 8 clients (no sessions: their video).
# The repair model (issue 36): bench/bench_repair_speed.py on CUDA (its training step and a 640x360 repair), with
# diffusers from .sumo/2.
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu_loop}
mkdir -p "$OUT"
S=$(date +%s); el(){ echo "=== [$(( $(date +%s)-S ))s] $*"; }
el "SUMO unpacked"
eval "$(python3 bench/pack_sumo.py unpack /tmp/gpu_loop_sumo .sumo/* | tail -1)" || exit 1
STREET=/tmp/gpu_check_street
if [ ! -f $STREET/recon/scene/scene.json ]; then
  echo "no street reconstruction at $STREET/recon: run bench/gpu_check.sh on this machine first"; exit 1
fi
mkdir -p out/demo && ln -sfn $STREET/recon out/demo/recon && ln -sfn $STREET out/demo/log
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
if [ ! -f /tmp/gpu_loop_done ] && python3 -c "import libsumo, sumolib, mcap, zstandard, gymnasium, pydantic, trimesh
print('libsumo', libsumo.__file__, 'netconvert', sumolib.checkBinary('netconvert'))"; then
  touch /tmp/gpu_loop_done
  for sc in ${SCENARIOS:-stopped-car lead-car}; do
    el "closed loop: $sc, lidar-aeb, ${STEPS:-40} steps"
    timeout 240 python3 -m gsim.cli closed-loop "$sc" --agent lidar-aeb --steps "${STEPS:-40}" --no-video \
      --out "$OUT/$sc" 2>&1 | grep -v "step/s\]$" | tail -3
    python3 -c "import json, sys; m = json.load(open(sys.argv[1])); t = m.get('timing_ms', {})
print({k: m.get(k) for k in ('steps', 'wall_s', 'score', 'collision')}, 'steps/s', round(m['steps'] / m['wall_s'], 2),
      'median ms a step by stage', {k: round(v, 1) for k, v in t.items()})" "$OUT/$sc/metrics.json"
  done
fi
if [ ! -f /tmp/gpu_serve_done ] && python3 -c "import grpc, sys; sys.exit(grpc.__version__ != '1.85.1')"; then
  touch /tmp/gpu_serve_done
  el "gsim serve with gsplat, 4 workers"
  timeout 150 python3 bench/bench_serve.py --scene $STREET/recon --no-sessions --backend gsplat --workers 4 \
    --repeats 10 --out "$OUT/serve" 2>&1 | tail -7
fi
if [ ! -f /tmp/gpu_repair_done ] && python3 -c "import diffusers"; then
  touch /tmp/gpu_repair_done
  el "the repair model on CUDA: a training step, a 640x360 repair"
  timeout 90 python3 bench/bench_repair_speed.py --device cuda --out "$OUT/repair_speed.json" 2>&1 | tail -2
fi
el done
