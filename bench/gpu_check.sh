#!/bin/bash
# The GPU checks in one run, for a CUDA machine lent for minutes: gsplat's kernel build, the CUDA tests, the 1080p
# camera benchmark (numpy API and resident), LiDAR on the GPU against numba (speed, parity), the cuda preset on a
# log, then on its reconstruction: the CUDA LiDAR, the loop's sensor step, a scenario, gsim serve with 4 workers
# and a profile of a training step. BENCHMARKS.md's H200 numbers (2026-11-26) came from it.
#
#   [WHEELS=DIR] [LOG=DIR] [ITERS=3000] [DOWNSCALE=2] [LIMIT=540] [OUT=DIR] bash bench/gpu_check.sh
#
# WHEELS: wheels to install first where the machine has no network (gsplat==1.5.3, py3-none-any); gsim itself
# is installed editable without dependencies (torch, numba, numpy, scipy, pillow, imageio, tqdm must be there;
# the scenario step also needs the editing extra: `pip download -d DIR trimesh==5.2.0 pydantic pyyaml`; the serve
# step grpcio's reflection and health packages: `pip download -d DIR --no-deps grpcio-reflection==1.85.1
# grpcio-health-checking==1.85.1`).
# LOG: a gsim log, or one packed by bench/pack_log.py (its sweeps xz-compressed: KITTI's 96 MB log packs to 50);
# without it the reconstruction is skipped. LIMIT: seconds the whole run may take (the reconstruction gets what
# is left and is stopped there). Results: OUT (default out/gpu_check) gets results.tgz (a device call brings back
# at most 8 files) and the first reconstruction view; in the archive: the build log, the LiDAR, loop, scenario
# and serve JSONs, the reconstruction's log, bench.json, train.json and metrics.json.
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
OUT=${OUT:-out/gpu_check}
RES=/tmp/gpu_check_results  # everything but the picture, archived into $OUT/results.tgz at the end
mkdir -p "$RES"
RECON=/tmp/gpu_check_recon
mkdir -p "$OUT"
S=$(date +%s); el(){ echo "=== [$(( $(date +%s)-S ))s] $*"; }
el setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import os, sys, torch, numba, numpy
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numba', numba.__version__,
      'numpy', numpy.__version__, 'cpus', os.cpu_count())"
if [ -n "$WHEELS" ]; then python3 -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl || exit 1; fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
el "gsplat build"
if [ -n "$LOG" ] && [ ! -f "$LOG/log.json" ]; then python3 bench/pack_log.py unpack "$LOG" /tmp/gpu_check_log & fi
python3 -c "from gsplat.cuda._backend import _C; print('gsplat', _C)" > "$RES/gsplat_build.txt" 2>&1
tail -3 "$RES/gsplat_build.txt"
wait
[ -n "$LOG" ] && [ ! -f "$LOG/log.json" ] && LOG=/tmp/gpu_check_log
el backends
python3 -c "import gsim; print(gsim.backend_report())"
el "camera benchmark"
timeout 120 python3 bench/bench_camera.py --surfels 1000000 --width 1920 --height 1080 --frames 50 \
  --backends gsplat --resident 2>&1 | tail -4
el "LiDAR: the CUDA kernel against numba on the demo street (1M surfels)"
python3 -c "import numba.cuda as c; print('numba.cuda', c.__file__, c.is_available())"
timeout 180 python3 bench/bench_lidar_cuda.py --surfels 1000000 --sweeps 4 --out "$RES/lidar_cuda_street.json" \
  2>&1 | grep -v '^{' | tail -4
if [ -n "$LOG" ]; then
  el "cuda preset on $LOG (the CUDA tests run beside it)"
  LEFT=$(( ${LIMIT:-540} - ($(date +%s)-S) - 10 ))
  ( timeout $LEFT python3 bench/bench_reconstruct.py --log "$LOG" --out $RECON --preset cuda \
      --iterations "${ITERS:-3000}" --downscale "${DOWNSCALE:-2}" > $RECON.log 2>&1
    echo "reconstruction exit $?" >> $RECON.log ) &
fi
el "CUDA tests"
timeout 240 python3 -m pytest -p no:cacheprovider -q -rA -m cuda 2>&1 | tail -25
wait
if [ -n "$LOG" ]; then
  tr '\r' '\n' < $RECON.log | grep -v '^\s*$' > "$RES/recon_log.txt"
  tail -12 "$RES/recon_log.txt" | cut -c1-240
  cp $RECON/bench.json $RECON/recon/train.json $RECON/eval/metrics.json "$RES"/ 2>/dev/null
  cp "$(ls $RECON/eval/views/*.png 2>/dev/null | head -1)" "$OUT/recon_view.png" 2>/dev/null  # (beside the archive)
  if [ -d $RECON/recon/scene ] && [ $(( ${LIMIT:-540} - ($(date +%s)-S) )) -gt 60 ]; then
    el "LiDAR: the CUDA kernel against numba on the reconstruction, from the log's LiDAR poses"
    timeout 60 python3 bench/bench_lidar_cuda.py --scene $RECON/recon/scene --log "$LOG" --specs velodyne-hdl64e \
      --sweeps 5 --out "$RES/lidar_cuda_log.json" 2>&1 | grep -v '^{' | tail -3
    # no SUMO: the libraries libsumo loads are 230 MB (111 files), more than a device call carries
    el "the closed loop's sensor step on the reconstruction (three cameras, HDL-64E)"
    timeout 60 python3 bench/bench_loop_sensors.py $RECON/recon/scene "$LOG" --steps 40 \
      --out "$RES/loop_sensors.json" 2>&1 | grep -v '^{' | tail -2
  fi
  if [ -d $RECON/recon/scene ] && [ $(( ${LIMIT:-540} - ($(date +%s)-S) )) -gt 120 ]; then
    el "a scenario rendered on the reconstruction with gsplat, then numba (issue 12)"
    timeout 90 python3 bench/bench_scenario.py $RECON/recon/scene "$LOG" --backends gsplat,numba --every 4 \
      --out /tmp/gpu_check_scenario 2>&1 | grep -v "frame/s" | tail -4
    cp /tmp/gpu_check_scenario/scenario_bench.json "$RES"/ 2>/dev/null
  fi
  if [ -d $RECON/recon/scene ] && [ $(( ${LIMIT:-540} - ($(date +%s)-S) )) -gt 60 ]; then
    el "gsim serve with gsplat, 4 workers, on the reconstruction (no sessions: SUMO is not there)"
    timeout 60 python3 bench/bench_serve.py --scene $RECON/recon/scene --no-sessions --backend gsplat --workers 4 \
      --repeats 10 --out /tmp/gpu_check_serve 2>&1 | tail -7
    cp /tmp/gpu_check_serve/bench.json "$RES/serve_bench.json" 2>/dev/null
  fi
  if [ -f $RECON/recon/checkpoint.safetensors ] && [ $(( ${LIMIT:-540} - ($(date +%s)-S) )) -gt 60 ]; then
    el "where a training step's time goes (cProfile, 40 steps from the checkpoint)"
    timeout $(( ${LIMIT:-540} - ($(date +%s)-S) - 5 )) python3 -m cProfile -s cumtime bench/bench_scene_step.py \
      $RECON/recon --steps 40 2>&1 | grep -v "^\s*$" | head -45 | cut -c1-160
  fi
fi
tar -czf "$OUT/results.tgz" -C "$RES" .
el done
