#!/usr/bin/env bash
# Measurement checks and the dev40 bench on a GPU machine (run from the project root, after
# `source scripts/gpu_env.sh`).
#
#   bash scripts/measure_gpu.sh KERNELBENCH_DIR [OUT=bench-dev40] [JOBS=4]
#
# KERNELBENCH_DIR is the folder holding materialize.py and dev40.txt. Writes under OUT:
#   peaks.json            this GPU's measured ceilings (also cached in ~/.cache/egg/peaks-*.json)
#   profile_*.json        egg profile --json of two examples (eager/compile/candidate, roofline)
#   results.jsonl, report.json, report.md, bench.png, runs/, logs/   egg bench of dev40
#   crosscheck.md         EGG's eager/compile times against plain do_bench in fresh processes
#   timing.txt            wall time of the bench (target: under 20 minutes for dev40)
set -uo pipefail
KB=${1:?usage: measure_gpu.sh KERNELBENCH_DIR [OUT] [JOBS]}
OUT=${2:-bench-dev40}
JOBS=${3:-4}
mkdir -p "$OUT"
python3 -m harness.peaks --force > "$OUT/peaks.json" || echo "peaks failed"
for ex in conv_tail row_softmax; do
  python3 -m graph.cli profile "examples/$ex.py" --device cuda --json > "$OUT/profile_$ex.json" \
    || echo "profile $ex failed"
done
[ -d "$OUT/problems" ] || python3 "$KB/materialize.py" "$OUT/problems"
start=$(date +%s)
python3 -m graph.cli bench "$OUT/problems" --list "$KB/dev40.txt" --out "$OUT" --device cuda \
  --jobs "$JOBS" --resume
end=$(date +%s)
echo "dev40 bench: $((end - start)) s with --jobs $JOBS" | tee "$OUT/timing.txt"
python3 scripts/crosscheck_baselines.py "$OUT/results.jsonl" "$OUT/problems" --out "$OUT/crosscheck.md"
