#!/bin/bash
# The GPU checks in one run, for a CUDA machine rented for minutes: gsplat's kernel build, the 1080p camera benchmark
# (numpy API, resident, a profile of the resident call), the `cuda` preset on the demo street and on a log side by
# side with a wall-time budget each (the CUDA tests beside them), then LiDAR on the GPU against numba (speed,
# parity) on the street, the loop's sensor step, gsim serve with 4 workers, a profile of training steps, and the
# CUDA LiDAR on the log's reconstruction. The closed loop with SUMO itself: bench/gpu_loop.sh, right after it.
#
#   [WHEELS=DIR] [LOG=DIR] [TRAIN_S=240] [DOWNSCALE=2] [LIMIT=480] [SKIP_CAMERA=1] [OUT=DIR] bash bench/gpu_check.sh
#
# (bench/gpu_prepare.sh makes the WHEELS and LOG folders and gpu_loop.sh's SUMO parts here, in one command.)
# WHEELS: wheels to install first where the machine has no network (gsplat==1.5.3, py3-none-any); gsim itself
# is installed editable without dependencies (torch, numba, numba-cuda, numpy, scipy, pillow, imageio, tqdm,
# safetensors must be there); the serve step needs grpcio 1.85.1 (the generated modules refuse an older one),
# grpcio-reflection and grpcio-health-checking 1.85.1 and protobuf 7.35.1 there or among the wheels (grpcio's
# wheel is 7.3 MB: with KITTI's packed log it does not fit in one call).
# LOG: a gsim log, or one packed by bench/pack_log.py (its sweeps xz-compressed: KITTI's 96 MB log packs to 52);
# without it only the street trains. TRAIN_S: each training loop's budget (`max_train_s`: the rates decay over it;
# cut to what LIMIT leaves); the whole reconstruction (movers, initialisation, training, scene) is timed too. LIMIT:
# seconds the whole run may take (a step starts only with time left for it). Results: OUT (default out/gpu_check)
# gets results.tgz (rewritten after every step: a device call brings back at most 8 files) and the first held-out
# view of each reconstruction; in the archive: the versions, the build log, the camera output and profile, each
# reconstruction's log, bench.json, train.json and metrics.json, the CUDA tests', the LiDAR, loop and serve JSONs
# and the training profile.
# gsplat builds its CUDA code on first import (about a minute on 16 cores): two processes importing it at once
# collide (seen: 171 s and a failed object file), so nothing else imports it until the build is done.
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-out/gpu_check}
LIMIT=${LIMIT:-480}
RES=/tmp/gpu_check_results  # everything but the pictures, archived into $OUT/results.tgz
mkdir -p "$RES" "$OUT"
S=$(date +%s); el(){ echo "=== [$(( $(date +%s)-S ))s] $*"; }
left(){ echo $(( LIMIT - ($(date +%s)-S) )); }
pack(){ tar -czf "$OUT/results.tgz" -C "$RES" .; }
el setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RES/gpu.txt"
if [ -n "$WHEELS" ]; then python3 -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl || exit 1; fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
python3 -c "import os, sys, torch; from importlib.metadata import version as v
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cpus', os.cpu_count(),
      *[f'{p} {v(p)}' for p in ('numba', 'numba-cuda', 'gsplat', 'numpy', 'grpcio', 'protobuf')])" | tee -a "$RES/gpu.txt"
python3 -m pip list --format=freeze > "$RES/pip_list.txt" 2>/dev/null  # (the image's packages: what to pack)
el "gsplat build (beside it: the log unpacked)"
PACKED=$([ -n "$LOG" ] && find "$LOG" -name '*.xz' -print -quit)  # a packed log holds .xz sweeps
if [ -n "$PACKED" ]; then python3 bench/pack_log.py unpack "$LOG" /tmp/gpu_check_log; fi &
UNPACK=$!
python3 -c "from gsplat.cuda._backend import _C; print('gsplat', _C)" > "$RES/gsplat_build.txt" 2>&1
tail -2 "$RES/gsplat_build.txt"
python3 -m gsim.cli synth /tmp/gpu_check_street > /tmp/gpu_check_synth.log 2>&1 &
SYNTH=$!
wait $UNPACK
[ -n "$PACKED" ] && LOG=/tmp/gpu_check_log
python3 -c "import gsim; print(gsim.backend_report())"
if [ -z "$SKIP_CAMERA" ]; then
  el "camera benchmark, 1920x1080, 1M surfels"
  timeout 90 python3 bench/bench_camera.py --surfels 1000000 --width 1920 --height 1080 --frames 30 \
    --backends gsplat --resident --profile > "$RES/camera.txt" 2>&1
  grep -v '^-\|^{' "$RES/camera.txt" | tail -30 | cut -c1-200
  pack
fi
wait $SYNTH
tail -1 /tmp/gpu_check_synth.log
BUDGET=$(( $(left) - 130 ))  # what the reconstructions may take: the steps after them need about 130 s
TRAIN_S=$(( ${TRAIN_S:-240} < BUDGET - 80 ? ${TRAIN_S:-240} : BUDGET - 80 ))  # loading, movers, init, eval: ~80 s
el "cuda preset, ${TRAIN_S} s training budget each, side by side: the street and ${LOG:-no log} (in ${BUDGET} s)"
recon(){  # NAME LOG [ARGS]: bench_reconstruct under the budget, its log and results kept
  local name=$1 log=$2; shift 2
  ( NUMBA_NUM_THREADS=6 timeout $BUDGET python3 bench/bench_reconstruct.py --log "$log" --out /tmp/gpu_check_$name \
      --preset cuda --set "{\"max_train_s\": $TRAIN_S}" "$@" > /tmp/gpu_check_$name.log 2>&1
    echo "$name exit $?" >> /tmp/gpu_check_$name.log ) &
}
recon street /tmp/gpu_check_street
[ -n "$LOG" ] && recon log "$LOG" --downscale "${DOWNSCALE:-2}"
el "CUDA tests (beside the reconstructions)"
NUMBA_NUM_THREADS=2 timeout $BUDGET python3 -m pytest -p no:cacheprovider -q -rA -m cuda \
  $(grep -l "mark.cuda" tests/*.py) > "$RES/cuda_tests.txt" 2>&1
grep -v "^PASSED\|^SKIPPED\|^\s*$" "$RES/cuda_tests.txt" | tail -25 | cut -c1-240
wait
for name in street log; do
  [ -f /tmp/gpu_check_$name.log ] || continue
  tr '\r' '\n' < /tmp/gpu_check_$name.log | grep -v '^\s*$' > "$RES/recon_$name.txt"
  tail -5 "$RES/recon_$name.txt" | cut -c1-240
  mkdir -p "$RES/$name"
  cp /tmp/gpu_check_$name/bench.json /tmp/gpu_check_$name/recon/train.json /tmp/gpu_check_$name/eval/metrics.json \
    "$RES/$name"/ 2>/dev/null
  cp "$(ls /tmp/gpu_check_$name/eval/views/*.png 2>/dev/null | head -1)" "$OUT/view_$name.png" 2>/dev/null
done
pack
if [ $(left) -gt 60 ]; then
  el "LiDAR: the CUDA kernel against numba on the street (1M surfels)"
  timeout 60 python3 bench/bench_lidar_cuda.py --surfels 1000000 --sweeps 4 --out "$RES/lidar_cuda_street.json" \
    --profile > "$RES/lidar_cuda_street.txt" 2>&1
  grep -v '^-\|^{\|Warning\|warn(' "$RES/lidar_cuda_street.txt" | tail -20 | cut -c1-200
  pack
fi
R=/tmp/gpu_check_log/recon L=$LOG
[ -n "$LOG" ] && [ -d $R/scene ] || R=/tmp/gpu_check_street/recon L=/tmp/gpu_check_street
if [ -d $R/scene ] && [ $(left) -gt 45 ]; then
  # no SUMO here (bench/gpu_loop.sh runs the loop with it); the profile: ten more steps, host and GPU
  el "the closed loop's sensor step on $R (three cameras, HDL-64E)"
  timeout 45 python3 bench/bench_loop_sensors.py $R/scene "$L" --steps 40 --out "$RES/loop_sensors.json" \
    --profile "$RES/loop_profile.txt" 2>&1 | grep -v '^{' | tail -2
  pack
fi
if [ -d $R/scene ] && [ $(left) -gt 35 ] && python3 -c "import grpc, sys; sys.exit(grpc.__version__ < '1.85.1')"; then
  el "gsim serve with gsplat, 4 workers (no sessions: SUMO is not there)"
  timeout 35 python3 bench/bench_serve.py --scene $R/scene --no-sessions --backend gsplat --workers 4 \
    --repeats 10 --out /tmp/gpu_check_serve 2>&1 | tail -7
  cp /tmp/gpu_check_serve/bench.json "$RES/serve_bench.json" 2>/dev/null
  pack
fi
if [ -f $R/checkpoint.safetensors ] && [ $(left) -gt 70 ]; then
  # (the log's load, its movers and the first LiDAR batch's compilation come first: 35 s were too few)
  el "where a training step's time goes (cProfile of 30 steps from the checkpoint, after its warm-up)"
  timeout 70 python3 bench/bench_scene_step.py $R --steps 30 --profile "$RES/profile.txt" 2>&1 | grep '^{'
  grep -v "^\s*$" "$RES/profile.txt" | head -30 | cut -c1-160
  pack
fi
if [ -d $R/scene ] && [ $(left) -gt 20 ]; then
  el "LiDAR: the CUDA kernel against numba on $R, from the log's LiDAR poses"
  timeout $(( $(left) - 3 )) python3 bench/bench_lidar_cuda.py --scene $R/scene --log "$L" --specs velodyne-hdl64e \
    --sweeps 5 --out "$RES/lidar_cuda_log.json" 2>&1 | grep -v '^{' | tail -3
  pack
fi
el done
