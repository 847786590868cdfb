#!/usr/bin/env bash
# Issue 20's timing comparison, in one device call on a 2-4 GPU host (< 9 min): a fixed subset
# through a Dask cluster of one GPU worker, then of N (`dask scheduler` + `dask worker` per GPU,
# scripts/dask_cluster.sh); scaling efficiency of the suite's wall time and per-problem agreement
# of eager / torch.compile / EGG within the noise model (scripts/compare_bench.py --scaling).
#
#   bash scripts/gpu_cluster_scaling.sh PROBLEMS OUT [LIST=scripts/cluster_scaling.txt] [N=all GPUs] [JOBS=1] [BUDGET_S=500]
#
# PROBLEMS: a folder of problems, or the folder holding materialize.py. The subset's size should
# be a multiple of N (8: for 2 and 4 GPUs). BUDGET_S is split between the phases as their times
# should be at 80% efficiency (one GPU: 308 s of 500 with N=2, 381 s with N=4); a phase cut short
# leaves problems missing, which the comparison reports. Both phases start cold: their own tuning, Triton and
# Inductor caches (a warm second phase would search and compile less and inflate the scaling);
# the GPU peaks are measured once before both.
# Writes to OUT (7 files): scaling.md + scaling.json (the table: wall times, efficiency, per-problem
# agreement), one.jsonl, many.jsonl (the records), one-report.json, many-report.json, summary.txt.
set -uo pipefail
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of the script's steps on a CPU machine (no GPU timings)
PROBLEMS=$1; OUT=$2; LIST=${3:-scripts/cluster_scaling.txt}; NG=${4:-}; JOBS=${5:-1}; BUDGET=${6:-500}
source scripts/gpu_env.sh
source scripts/dask_cluster.sh
NG=${NG:-$(python3 -c "import torch; print(torch.cuda.device_count())")}
ONE_S=$(python3 -c "print(round($BUDGET / (1 + 1 / (0.8 * $NG))))")
MANY_S=$(( BUDGET - ONE_S ))
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/egg-scaling-XXXX)
if [ -f "$PROBLEMS/materialize.py" ]; then python3 "$PROBLEMS/materialize.py" "$W/problems" >/dev/null; PROBLEMS=$W/problems; fi
python3 -m harness.peaks > "$W/peaks.json" 2>/dev/null || echo "peaks not measured"
S=$OUT/summary.txt
: > "$S"
phase() {  # NAME GPUS BUDGET_S
  local name=$1 gpus=$2 budget=$3 t0
  t0=$(date +%s)
  dask_start "$W/dask-$name" "$gpus" "$JOBS" >> "$S" 2>&1 || return 1  # not in a pipe: it sets DASK_ADDRESS
  EGG_TUNING_CACHE=$W/tuning-$name.json TRITON_CACHE_DIR=$W/triton-$name TORCHINDUCTOR_CACHE_DIR=$W/inductor-$name \
    timeout -s INT -k 60 "$budget" python3 -m graph.cli bench "$PROBLEMS" --list "$LIST" --out "$W/$name" \
    --device "$DEVICE" --scheduler "$DASK_ADDRESS" --jobs "$JOBS" --problem-timeout 240 > "$W/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s with the cluster's start and stop" | tee -a "$S"
  dask_stop "$W/dask-$name"
  cp "$W/$name/results.jsonl" "$OUT/$name.jsonl" 2>/dev/null
  cp "$W/$name/report.json" "$OUT/$name-report.json" 2>/dev/null
}
phase one "0" "$ONE_S"
phase many "$(seq -s ' ' 0 $((NG - 1)))" "$MANY_S"
python3 scripts/compare_bench.py "$W/one" "$W/many" --labels "1 GPU,$NG GPUs" --scaling --out "$OUT/scaling.md" > /dev/null
grep '^- ' "$OUT/scaling.md" | tee -a "$S"
for n in one many; do echo "== $n"; tail -n 4 "$W/$n.log"; done >> "$S"
ls -la "$OUT"
