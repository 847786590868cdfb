#!/usr/bin/env bash
# Source this on a GPU machine whose Python already has torch and triton but not the LangGraph
# stack: installs the wheels in .whl/ (see docs/gpu.md) into a temp folder and puts it and the
# project on PYTHONPATH. Usage: source scripts/gpu_env.sh
S=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" .whl/*.whl || return 1
fi
export PYTHONPATH="$S:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/egg-triton-cache}"
export PYTHONUNBUFFERED=1
egg() { python3 -m graph.cli "$@"; }
export -f egg 2>/dev/null || true
