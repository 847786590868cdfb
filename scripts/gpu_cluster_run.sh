#!/usr/bin/env bash
# Issue 20: dev levels 1-2 (or a list) over every GPU of a 2-4 GPU host, through a Dask cluster
# started as a user starts one (`dask scheduler`, one `dask worker` per GPU: scripts/dask_cluster.sh)
# and `egg bench --scheduler tcp://...`, in resumable slices for short GPU leases.
#
#   bash scripts/gpu_cluster_run.sh PROBLEMS STATE OUT BUDGET_S [LIST='level[12]/*.py'] [JOBS_PER_GPU=1] [STATE_TGZ]
#
# PROBLEMS, STATE, OUT, BUDGET_S, JOBS_PER_GPU, STATE_TGZ: as in scripts/gpu_bench_multi.sh (OUT gets the same
# files, plus cluster.txt: the scheduler's and workers' last log lines).
set -uo pipefail
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of the script's steps on a CPU machine (no GPU timings)
PROBLEMS=$1; STATE=$2; OUT=$3; BUDGET=$4; LIST=${5:-'level[12]/*.py'}; JOBS=${6:-1}; FROM=${7:-}
source scripts/gpu_env.sh
source scripts/dask_cluster.sh
mkdir -p "$STATE" "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ -n "$FROM" ] && [ ! -f "$STATE/results.jsonl" ] && [ -f "$FROM" ]; then tar xzf "$FROM" -C "$STATE"; fi
if [ -f "$PROBLEMS/materialize.py" ]; then
  [ -d "$STATE/problems" ] || python3 "$PROBLEMS/materialize.py" "$STATE/problems" >/dev/null
  PROBLEMS=$STATE/problems
fi
if [ -f "$LIST" ]; then grep -v '^\s*\(#\|$\)' "$LIST" > "$STATE/list.txt"; else (cd "$PROBLEMS" && ls -1 $LIST) > "$STATE/list.txt"; fi
NG=$(python3 -c "import torch; print(torch.cuda.device_count())")
start=$(date +%s)
python3 -m harness.peaks > "$STATE/peaks.json" 2>/dev/null || echo "peaks not measured"
dask_start /tmp/egg-dask "$(seq -s ' ' 0 $((NG - 1)))" "$JOBS" || exit 1
left=$(( BUDGET - ($(date +%s) - start) ))
timeout -s INT -k 60 "$left" python3 -m graph.cli bench "$PROBLEMS" --list "$STATE/list.txt" --out "$STATE" \
  --device "$DEVICE" --scheduler "$DASK_ADDRESS" --jobs "$JOBS" --resume --problem-timeout 360 > "$STATE/bench.log" 2>&1
rc=$?
{ for f in /tmp/egg-dask/*.log; do echo "== $f"; tail -n 5 "$f"; done; } > "$OUT/cluster.txt"
dask_stop /tmp/egg-dask
done_n=$(grep -c . "$STATE/results.jsonl" 2>/dev/null || echo 0)
echo "slice: $(( $(date +%s) - start )) s on $NG GPU(s) (dask workers), exit $rc, $done_n of $(grep -c . "$STATE/list.txt") problems done" \
  | tee -a "$STATE/slices.txt"
tail -n 5 "$STATE/bench.log"
# an interrupted bench wrote no reports: write them from its records
[ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || python3 -m graph.bench report "$STATE" >/dev/null
cp "$STATE"/results.jsonl "$STATE"/report.json "$STATE"/report.md "$STATE"/slices.txt "$OUT"/ 2>/dev/null
(cd "$STATE" && tar czf "$OUT/state.tgz" $(ls results.jsonl run_alone.txt slices.txt 2>/dev/null))
tar czf "$OUT/runs.tgz" --exclude='*.sqlite' --exclude='search' -C "$STATE" runs logs 2>/dev/null
ls -la "$OUT"
