#!/bin/bash
# What the device calls carry, made on this machine (the folders are ignored by git: a fresh checkout has none of
# them), in one command after ./quickstart.sh setup:
#   .whl          gsplat 1.5.3's wheel (py3-none-any: it builds its CUDA code on the GPU machine's first use)
#   .packed/kitti the KITTI raw sample as a gsim log, packed by bench/pack_log.py (52 MB: one call with .whl)
#   .sumo/1, 2    SUMO's libsumo and netconvert with the loop's packages, and grpcio 1.85.1 with diffusers, for
#                 the GPU image's Python 3.12 (bench/pack_sumo.py; each part one call)
# Then: bench/gpu_check.sh carrying .whl and .packed, bench/gpu_loop.sh carrying .sumo/1, then .sumo/2 (their
# headers say how). About 5 minutes; parts already made are kept (delete one to remake it).
#
#   bash bench/gpu_prepare.sh   [PY=.venv/bin/python]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! ls .whl/gsplat-1.5.3-*.whl > /dev/null 2>&1; then
  "$PY" -m pip download -q --no-deps gsplat==1.5.3 -d .whl
fi
if [ ! -d .packed/kitti ]; then
  LOG=out/gpu_prepare/kitti-log
  [ -f $LOG/log.json ] || "$PY" -m gsim.cli convert kitti-raw ../shared/data/kitti_raw/2011_09_26 $LOG
  "$PY" bench/pack_log.py pack $LOG .packed/kitti
fi
[ -d .sumo/1 ] && [ -d .sumo/2 ] || "$PY" bench/pack_sumo.py pack .sumo --python 3.12
du -sh .whl .packed/kitti .sumo/* | sed 's/^/made: /'
