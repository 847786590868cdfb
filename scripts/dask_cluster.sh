#!/usr/bin/env bash
# A Dask cluster on this host, started as a user starts one (docs/cluster.md): `dask scheduler`
# and one `dask worker` per GPU, each pinned to its GPU (CUDA_VISIBLE_DEVICES) and offering it as
# the resource GPU=1, with JOBS threads (egg bench --jobs JOBS: problems at once per GPU) and no
# memory limit; the scheduler gives up on a task after 2 worker deaths (= egg bench --retries 1).
# The GPU image has no `dask` script on PATH: the same commands run as python3 -m distributed.cli.*
#
#   source scripts/dask_cluster.sh
#   dask_start DIR GPUS [JOBS=1]   # GPUS: "0 1 2 3"; sets DASK_ADDRESS, waits for every worker
#   egg bench ... --scheduler "$DASK_ADDRESS"
#   dask_stop DIR                  # stops the processes it started (their PIDs are in DIR/pids)
dask_start() {
  local dir=$1 gpus=$2 jobs=${3:-1} n=0 g
  mkdir -p "$dir"
  : > "$dir/pids"
  rm -f "$dir/scheduler.json"
  DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=1 python3 -m distributed.cli.dask_scheduler \
    --host 127.0.0.1 --port 0 --no-dashboard --scheduler-file "$dir/scheduler.json" \
    > "$dir/scheduler.log" 2>&1 &
  echo $! >> "$dir/pids"
  for _ in $(seq 120); do [ -s "$dir/scheduler.json" ] && break; sleep 0.5; done
  for g in $gpus; do
    CUDA_VISIBLE_DEVICES=$g python3 -m distributed.cli.dask_worker --scheduler-file "$dir/scheduler.json" \
      --name "gpu$g" --nthreads "$jobs" --resources GPU=1 --memory-limit 0 --no-dashboard \
      --local-directory "$dir/gpu$g" > "$dir/worker-gpu$g.log" 2>&1 &
    echo $! >> "$dir/pids"
    n=$((n + 1))
  done
  DASK_ADDRESS=$(python3 - "$dir/scheduler.json" "$n" <<'PY'
import json, sys
from distributed import Client
addr = json.load(open(sys.argv[1]))["address"]
with Client(addr, timeout=60) as c:
    c.wait_for_workers(int(sys.argv[2]), timeout=120)
print(addr)
PY
  ) || { echo "dask_start: the cluster did not come up (see $dir/*.log)"; return 1; }
  export DASK_ADDRESS
  echo "dask cluster at $DASK_ADDRESS: $n worker(s) on GPU(s) $gpus, $jobs thread(s) each"
}

dask_stop() {
  local dir=$1 p
  [ -f "$dir/pids" ] || return 0
  for p in $(tac "$dir/pids"); do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 30); do  # up to 15 s for the workers to close, then kill what is left
    local alive=0
    for p in $(cat "$dir/pids"); do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for p in $(cat "$dir/pids"); do kill -KILL "$p" 2>/dev/null; done
  rm -f "$dir/pids"
}
