#!/usr/bin/env bash
# Issue 19's check on one GPU, in one device call (< 9 min): a small suite through the local
# bench and through a local Dask cluster with one GPU worker (`egg bench --scheduler local:1`):
# the same verdicts, eager / torch.compile / EGG figures within the noise model
# (scripts/compare_bench.py); then the cluster once more on the tuning cache its run filled: the
# tiler must search nothing.
#
#   [PHASE_S=200] bash scripts/gpu_cluster_check.sh PROBLEMS OUT [LIST=scripts/cluster_check.txt] [JOBS=1]
#
# PROBLEMS: a folder of problems, or the folder holding materialize.py (the dev set is written
# out). Each phase has its own fresh tuning cache (both search), the warm phase the cluster's.
# Writes to OUT (6 files): compare.md + compare.json (the table and its summary: same verdicts,
# figures within noise), local.jsonl, cluster.jsonl, warm.jsonl (the records), summary.txt
# (wall time per phase, the warm run's cache hits and searches, each bench's last lines).
set -uo pipefail
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a smoke run of the script's steps on a CPU machine (no GPU timings)
PROBLEMS=$1; OUT=$2; LIST=${3:-scripts/cluster_check.txt}; JOBS=${4:-1}
source scripts/gpu_env.sh
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/egg-check-XXXX)
if [ -f "$PROBLEMS/materialize.py" ]; then python3 "$PROBLEMS/materialize.py" "$W/problems" >/dev/null; PROBLEMS=$W/problems; fi
python3 -m harness.peaks > "$W/peaks.json" 2>/dev/null || echo "peaks not measured"  # once, outside the phases
S=$OUT/summary.txt
: > "$S"
phase() {  # NAME BUDGET_S TUNING_CACHE [egg bench options]
  local name=$1 budget=$2 cache=$3 t0; shift 3
  t0=$(date +%s)
  EGG_TUNING_CACHE=$cache timeout -s INT -k 60 "$budget" python3 -m graph.cli bench "$PROBLEMS" --list "$LIST" \
    --out "$W/$name" --device "$DEVICE" --jobs "$JOBS" --problem-timeout 180 "$@" > "$W/$name.log" 2>&1
  echo "$name: exit $?, $(( $(date +%s) - t0 )) s" | tee -a "$S"
  cp "$W/$name/results.jsonl" "$OUT/$name.jsonl" 2>/dev/null
}
B=${PHASE_S:-200}  # each of the two phases' time limit (the warm phase gets half)
phase local "$B" "$W/tuning-local.json"
phase cluster "$B" "$W/tuning-cluster.json" --scheduler local:1
phase warm $(( B / 2 + 10 )) "$W/tuning-cluster.json" --scheduler local:1
python3 scripts/compare_bench.py "$W/local" "$W/cluster" --labels "local bench,Dask local:1" --out "$OUT/compare.md" > /dev/null
grep '^- ' "$OUT/compare.md" | tee -a "$S"
python3 - "$W/warm/results.jsonl" <<'PY' | tee -a "$S"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
hits = sum((r.get("tuning") or {}).get("cache_hits", 0) for r in recs)
searched = sum((r.get("tuning") or {}).get("searched", 0) for r in recs)
print(f"warm cluster run: {len(recs)} problems, {hits} kernel(s) from the tuning cache, {searched} searched"
      + (" (OK: nothing searched)" if recs and hits and not searched else " (NOT OK)"))
PY
for n in local cluster warm; do echo "== $n"; tail -n 4 "$W/$n.log"; done >> "$S"
ls -la "$OUT"
