#!/usr/bin/env bash
# gsim quick start. Sets up ./.venv on first use (and again when pyproject.toml changes), then:
#   ./quickstart.sh demo [gsim demo options]   build the demo street and render a drive to out/demo
#   ./quickstart.sh test [pytest options]      run the test suite
# PyTorch is installed first and explicitly (GSIM_TORCH, default the CPU build torch==2.13.0),
# so that no other requirement can resolve an unpinned torch with several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${GSIM_VENV:-.venv}
TORCH_SPEC=${GSIM_TORCH:-torch==2.13.0}
EXTRAS=${GSIM_EXTRAS:-test,lidar,editing,sumo,dynamics,alpasim,scenarios,serve,diffusion,viewer,formats,cluster,ros2}

setup() {
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  local stamp="$VENV/.gsim-setup" want
  want="$TORCH_SPEC|$EXTRAS|$(sha1sum pyproject.toml | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (an index for CUDA builds)
    "$VENV/bin/pip" install -q $TORCH_SPEC
    "$VENV/bin/pip" install -q -e ".[$EXTRAS]"
    echo "$want" > "$stamp"
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) setup; exec "$VENV/bin/gsim" demo "$@" ;;
  test) setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  setup) setup ;;
  *) echo "usage: $0 demo|test|setup [options]" >&2; exit 2 ;;
esac
