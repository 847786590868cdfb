"""Entry point of the harness's child processes: ``python -m harness.child MODE REQUEST_JSON``.

MODE is ``verify`` (a judge process: writes one verdict) or ``profile`` (a timing server that
reads JSON requests on stdin). The original stdout is the protocol channel; anything the
problem or candidate prints goes to stderr. In verify mode the first line of stdin is a nonce
that the verdict line carries back: the EGG process only believes a verdict that has it (a
candidate cannot forge one by writing to the judge's stdout); the second line is the candidate's
source as the EGG process read and statically checked it (the judge runs that text, not the
file, which may have changed since).
"""
import json
import os
import sys


def main() -> int:
    mode, req = sys.argv[1], json.loads(sys.argv[2])
    chan = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if req.get("device") == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    if req.get("triton_cache"):
        os.environ["TRITON_CACHE_DIR"] = req["triton_cache"]
    if mode == "verify":
        # untimed work: a timing of a parallel problem gets the CPU first (harness.gpulock); the
        # candidate processes this judge starts inherit the priority
        from harness import gpulock

        gpulock.yield_cpu()
        req["nonce"] = sys.stdin.readline().strip()
        req["candidate_source"] = json.loads(sys.stdin.readline())  # the text that was checked
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the candidate process inherits /dev/null, not the nonce's pipe
        os.close(null)
    from harness import worker  # imported only now: the environment above must be in place

    if mode == "verify":
        # on GPUs only when asked: CUDA IPC may need the candidate to reach the judge's /proc
        if req.get("device") == "cpu" or os.environ.get("EGG_HARDEN_JUDGE") == "1":
            worker.harden_judge()
        worker.judge(req, chan)
    elif mode == "profile":
        worker.profile_server(req, chan, sys.stdin)
    else:
        raise SystemExit(f"unknown mode {mode}")
    chan.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
