#!/usr/bin/env bash
# One device call of a resumable benchmark, packed into a single archive (for leases that bring
# back only a few files per call):
#
#   OUT=DIR [STATE=.state] [LIST=KB_DIR/dev40.txt] [KB=KB_DIR] [END=575] [JOBS=4] \
#     [PRE="command"] [BENCH=1] bash scripts/gpu_slice.sh
#
# PRE (optional) runs first (at most PRE_MAX s, its output in pre.log); then one slice of
# scripts/gpu_bench.sh on STATE until END seconds after the call started (30 s kept for the
# report and the archive). Everything lands in OUT/all.tgz: bench/ (results.jsonl,
# run_alone.txt, slices.txt, report, runs.tgz with the run folders and logs), pre.log, smi.txt. To resume in
# the next call, unpack it and copy bench/results.jsonl AND bench/run_alone.txt back into STATE
# (the problems queued to run alone are started alone only if run_alone.txt comes along).
T0=$(date +%s)
: "${OUT:?set OUT to the folder the archive goes to}"
STATE=${STATE:-.state}; KB=${KB:-.kb}; LIST=${LIST:-$KB/dev40.txt}; END=${END:-575}; JOBS=${JOBS:-4}
W=$(mktemp -d); mkdir -p "$W/bench" "$OUT"
source scripts/gpu_env.sh
nvidia-smi > "$W/smi.txt" 2>&1
if [ -n "${PRE:-}" ]; then
  timeout "${PRE_MAX:-200}" bash -c "$PRE" > "$W/pre.log" 2>&1
  echo "pre rc=$? $(( $(date +%s) - T0 )) s" >> "$W/pre.log"
fi
LEFT=$(( END - ($(date +%s) - T0) - 30 ))
if [ "${BENCH:-1}" = 1 ] && [ "$LEFT" -gt 60 ]; then
  bash scripts/gpu_bench.sh "$KB" "$LIST" "$STATE" "$W/bench" "$LEFT" "$JOBS" > "$W/bench.log" 2>&1
fi
echo "total $(( $(date +%s) - T0 )) s" >> "$W/pre.log"
tar czf "$OUT/all.tgz" -C "$W" .
ls -la "$OUT"
