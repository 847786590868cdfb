#!/usr/bin/env bash
# One resumable slice of a GPU benchmark over every visible GPU, on Dask distributed (for short
# GPU leases): `egg bench --scheduler local` starts a local cluster with one worker per visible
# GPU (each pinned to its GPU, offering the resource GPU=1); a problem goes to whichever GPU is
# free, and the records stream into one results.jsonl (docs/cluster.md).
#
#   bash scripts/gpu_bench_multi.sh PROBLEMS LIST STATE OUT BUDGET_S [JOBS_PER_GPU=1] [STATE_TGZ]
#
# PROBLEMS: a folder of problem files, or the folder holding materialize.py (the dev set is then
#   written out under STATE/problems).
# LIST: problem paths relative to PROBLEMS, one per line; or a glob under PROBLEMS in quotes
#   (e.g. 'level[12]/*.py': levels 1 and 2 of the dev set).
# STATE: results.jsonl, run_alone.txt, slices.txt and the run folders, kept between slices
#   (--resume skips what is done). On a fresh machine give the previous slice's OUT/state.tgz as
#   STATE_TGZ: it is unpacked into STATE first.
# BUDGET_S: the slice stops itself after that long (SIGINT: finished records are kept, running
#   problems are cancelled on their workers); keep it ~60 s under the call's limit for the
#   cluster's shutdown and the packing.
# JOBS_PER_GPU: problems at once on each GPU (each task asks for GPU=1/JOBS; timings never overlap).
# Writes to OUT (7 files at most): results.jsonl, report.json, report.md, bench.png (GPU runs),
#   slices.txt, state.tgz (what the next slice needs), runs.tgz (run folders without checkpoints).
set -uo pipefail
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of the script's steps on a CPU machine (no GPU timings)
PROBLEMS=$1; LIST=$2; STATE=$3; OUT=$4; BUDGET=$5; JOBS=${6:-1}; FROM=${7:-}
source scripts/gpu_env.sh
mkdir -p "$STATE" "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ -n "$FROM" ] && [ ! -f "$STATE/results.jsonl" ] && [ -f "$FROM" ]; then tar xzf "$FROM" -C "$STATE"; fi
if [ -f "$PROBLEMS/materialize.py" ]; then
  [ -d "$STATE/problems" ] || python3 "$PROBLEMS/materialize.py" "$STATE/problems" >/dev/null
  PROBLEMS=$STATE/problems
fi
if [ -f "$LIST" ]; then grep -v '^\s*\(#\|$\)' "$LIST" > "$STATE/list.txt"; else (cd "$PROBLEMS" && ls -1 $LIST) > "$STATE/list.txt"; fi
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
start=$(date +%s)
timeout -s INT -k 90 "$BUDGET" python3 -m graph.cli bench "$PROBLEMS" --list "$STATE/list.txt" --out "$STATE" \
  --device "$DEVICE" --scheduler local --jobs "$JOBS" --resume --problem-timeout 360 > "$STATE/bench.log" 2>&1
rc=$?
done_n=$(grep -c . "$STATE/results.jsonl" 2>/dev/null || echo 0)
echo "slice: $(( $(date +%s) - start )) s on $NG GPU(s), exit $rc, $done_n of $(grep -c . "$STATE/list.txt") problems done" \
  | tee -a "$STATE/slices.txt"
tail -n 5 "$STATE/bench.log"
# an interrupted bench wrote no reports: write them from its records
[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || python3 -m graph.bench report "$STATE" >/dev/null
cp "$STATE"/results.jsonl "$STATE"/report.json "$STATE"/report.md "$STATE"/slices.txt "$OUT"/ 2>/dev/null
[ -f "$STATE/bench.png" ] && cp "$STATE/bench.png" "$OUT/"
(cd "$STATE" && tar czf "$OUT/state.tgz" $(ls results.jsonl run_alone.txt slices.txt 2>/dev/null))
tar czf "$OUT/runs.tgz" --exclude='*.sqlite' --exclude='search' -C "$STATE" runs logs 2>/dev/null
ls -la "$OUT"
