#!/usr/bin/env bash
# Stage-2 measurements on the GPU machine (H200). From the project root, after the wheels of
# scripts/gpu_env.sh are in .whl/:
#
#   bash scripts/gpu_stage2.sh              # every workload of workloads/llm
#   FILTER='0[1245]*' bash scripts/gpu_stage2.sh   # a subset (egg bench --filter glob)
#
# Writes docs/results/stage2/:
#   compile_check.json  pruning estimates next to the cubins' registers / shared memory, the
#                       compile time per kernel, one process vs 16 (no GPU used)
#   bench-cold/         egg bench of workloads/llm with an empty tuning cache (the tiler searches)
#   bench-warm/         the same again: every kernel must come from the tuning cache
#                       (report.md column "tuning": "N hit / 0 searched") and the tiler times nothing
#   tuning.json         the tuning cache the two runs shared
set -euo pipefail
source scripts/gpu_env.sh
OUT=docs/results/stage2
mkdir -p "$OUT"
export EGG_TUNING_CACHE="$PWD/$OUT/tuning.json"
rm -f "$EGG_TUNING_CACHE" "$EGG_TUNING_CACHE.lock"
FILT=()
if [ -n "${FILTER:-}" ]; then FILT=(--filter "$FILTER"); fi

python3 scripts/stage2_measure.py --workloads workloads/llm --hardware h200 --jobs 16 \
  --out "$OUT/compile_check.json"
python3 -m graph.cli bench workloads/llm --device cuda --out "$OUT/bench-cold" "${FILT[@]}"
python3 -m graph.cli bench workloads/llm --device cuda --out "$OUT/bench-warm" "${FILT[@]}"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for run in ("bench-cold", "bench-warm"):
    recs = [json.loads(l) for l in (out / run / "results.jsonl").read_text().splitlines() if l.strip()]
    print(run, "wall s:", round(sum(r["wall_s"] for r in recs), 1),
          "cache hits:", sum((r.get("tuning") or {}).get("cache_hits", 0) for r in recs),
          "searched:", sum((r.get("tuning") or {}).get("searched", 0) for r in recs))
PY
