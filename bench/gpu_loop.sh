#!/bin/bash
# The closed loop on a lent GPU with SUMO itself (issue 32, item 4): SUMO's wheels are larger than a device call
# carries, so bench/pack_sumo.py packs what the loop loads (libsumo and its libraries, netconvert, SUMO's schemas)
# and the loop's pure-Python packages into about 57 MB: one carried folder. Run it on the machine that
# bench/gpu_check.sh just ran on (its street reconstruction and the gsplat build are still there), within the
# seconds the machine stays warm:
#
#   here:   python bench/pack_sumo.py pack .sumo --python 3.12     (once; .sumo is ignored by git)
#   device: bash bench/gpu_loop.sh     (carry .sumo/1; [STEPS=40] [SCENARIOS="stopped-car lead-car"] [OUT=DIR])
#
# Runs `gsim closed-loop` with the lidar-aeb agent on the street reconstruction (the shipped scenarios' demo
# street, linked into out/demo) with three cameras on the resident gsplat renderer and the LiDAR on the CUDA
# kernel, SUMO through libsumo, no video (no ffmpeg there), and prints each run's steps/s and stage times.
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu_loop}
mkdir -p "$OUT"
S=$(date +%s); el(){ echo "=== [$(( $(date +%s)-S ))s] $*"; }
el "SUMO unpacked"
eval "$(python3 bench/pack_sumo.py unpack /tmp/gpu_loop_sumo .sumo/* | tail -1)" || exit 1
python3 -c "import libsumo, sumolib; print('libsumo', libsumo.__file__); print('netconvert', sumolib.checkBinary('netconvert'))"
STREET=/tmp/gpu_check_street
if [ ! -f $STREET/recon/scene/scene.json ]; then
  echo "no street reconstruction at $STREET/recon: run bench/gpu_check.sh on this machine first"; exit 1
fi
mkdir -p out/demo && ln -sfn $STREET/recon out/demo/recon && ln -sfn $STREET out/demo/log
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
for sc in ${SCENARIOS:-stopped-car lead-car}; do
  el "closed loop: $sc, lidar-aeb, ${STEPS:-40} steps"
  timeout 240 python3 -m gsim.cli closed-loop "$sc" --agent lidar-aeb --steps "${STEPS:-40}" --no-video \
    --out "$OUT/$sc" 2>&1 | grep -v "step/s\]$" | tail -3
  python3 -c "import json, sys; m = json.load(open(sys.argv[1])); t = m.get('timing_ms', {})
print({k: m.get(k) for k in ('steps', 'wall_s', 'score', 'collision')}, 'steps/s', round(m['steps'] / m['wall_s'], 2),
      'median ms a step by stage', {k: round(v, 1) for k, v in t.items()})" "$OUT/$sc/metrics.json"
done
el done
