#!/usr/bin/env bash
# One resumable slice of a GPU benchmark spread over every visible GPU (for short GPU leases):
# the list is split round-robin into one part per GPU, each part benched by its own `egg bench`
# pinned to its GPU with its own GPU lock, and the parts' records are merged into one report.
#
#   bash scripts/gpu_bench_multi.sh PROBLEMS_DIR LIST_FILE STATE_DIR OUT_DIR BUDGET_S [JOBS_PER_GPU]
#
# LIST_FILE: problem paths relative to PROBLEMS_DIR, one per line; or a glob under PROBLEMS_DIR
# in quotes (e.g. 'level[12]/*.py': levels 1 and 2 of the materialized dev set).
#
# STATE_DIR/part<i>/ keeps each part's list, results.jsonl and run_alone.txt between slices
# (--resume); the merged results.jsonl, report.json and report.md go to STATE_DIR and OUT_DIR
# (bench.png to STATE_DIR), those per-part files to OUT_DIR/state.tgz (a machine that does not keep
# STATE_DIR between slices: `mkdir -p STATE_DIR && tar xzf OUT_DIR/state.tgz -C STATE_DIR` before
# the next one), the per-problem run folders (without checkpoints) to OUT_DIR/runs.tgz. One GPU:
# the same as scripts/gpu_bench.sh.
set -uo pipefail
PROBLEMS=$1; LIST=$2; STATE=$3; OUT=$4; BUDGET=$5; JOBS=${6:-4}
source scripts/gpu_env.sh
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
mkdir -p "$STATE" "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: used after a cd
start=$(date +%s)
pids=()
for ((i = 0; i < NG; i++)); do
  part="$STATE/part$i"
  mkdir -p "$part"
  if [ ! -f "$part/list.txt" ]; then
    if [ -f "$LIST" ]; then grep -v '^\s*$' "$LIST"; else (cd "$PROBLEMS" && ls -1 $LIST); fi \
      | awk -v n="$NG" -v i="$i" '(NR - 1) % n == i' > "$part/list.txt"
  fi
  CUDA_VISIBLE_DEVICES=$i EGG_GPU_LOCK="/tmp/egg-gpu-lock-$i" timeout -s INT "$BUDGET" \
    python3 -m graph.cli bench "$PROBLEMS" --list "$part/list.txt" --out "$part" --device cuda \
    --jobs "$JOBS" --resume --problem-timeout 360 > "$part/bench.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
cat "$STATE"/part*/results.jsonl > "$STATE/results.jsonl" 2>/dev/null
echo "slice: $(( $(date +%s) - start )) s on $NG GPU(s), $(wc -l < "$STATE/results.jsonl") problems done" \
  | tee -a "$STATE/slices.txt"
python3 -m graph.bench report "$STATE"
cp "$STATE"/results.jsonl "$STATE"/report.json "$STATE"/report.md "$STATE"/slices.txt "$OUT"/ 2>/dev/null
# each part's list, records and alone-list, to carry into the next slice
(cd "$STATE" && tar czf "$OUT/state.tgz" $(ls part*/list.txt part*/results.jsonl part*/run_alone.txt 2>/dev/null))
tail -n 3 "$STATE"/part*/bench.log
tar czf "$OUT/runs.tgz" --exclude='*.sqlite' --exclude='search' -C "$STATE" . 2>/dev/null
ls -la "$OUT"
