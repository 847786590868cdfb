#!/usr/bin/env bash
# One resumable slice of a GPU benchmark inside a time budget (for short GPU leases).
#
#   bash scripts/gpu_bench.sh PROBLEMS_DIR LIST_FILE STATE_DIR OUT_DIR BUDGET_S [JOBS]
#
# PROBLEM_TIMEOUT (env, default 360 s) bounds each problem; its run gets graph.bench's share of it.
# STATE_DIR keeps results.jsonl between slices (bench --resume skips what is done); the slice
# stops itself after BUDGET_S seconds (SIGINT: the bench kills its jobs and keeps finished
# records), then copies report.json/report.md/results.jsonl/run_alone.txt/bench.png to OUT_DIR and packs the
# per-problem run folders (without checkpoints) into OUT_DIR/runs.tgz.
set -uo pipefail
PROBLEMS=$1; LIST=$2; STATE=$3; OUT=$4; BUDGET=$5; JOBS=${6:-4}
source scripts/gpu_env.sh
mkdir -p "$STATE" "$OUT"
start=$(date +%s)
timeout -s INT "$BUDGET" python3 -m graph.cli bench "$PROBLEMS" --list "$LIST" --out "$STATE" \
  --device cuda --jobs "$JOBS" --resume --problem-timeout "${PROBLEM_TIMEOUT:-360}"
echo "slice: $(( $(date +%s) - start )) s, $(wc -l < "$STATE/results.jsonl") problems done" | tee -a "$STATE/slices.txt"
python3 -m graph.bench report "$STATE"
cp "$STATE"/results.jsonl "$STATE"/run_alone.txt "$STATE"/report.json "$STATE"/report.md "$STATE"/bench.png \
  "$STATE"/slices.txt "$OUT"/ 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude='*.sqlite' --exclude='search' -C "$STATE" runs logs 2>/dev/null
ls -la "$OUT"
