"""Verify one LLM workload's stage-1 candidate on the GPU and print the verifier's whole verdict
(the crash reason unabridged): python scripts/verify_probe.py workloads/llm/06_gqa_decode_attention.py"""
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gpu_llm_kernels import _egg_source  # noqa: E402

from harness.hardware import detect  # noqa: E402
from harness.problem import load_problem  # noqa: E402
from harness import runner, verify as V  # noqa: E402
from harness.verify import verify  # noqa: E402

if hasattr(V, "log_tail"):  # the crash reason with 40 lines of the judge's log, not 8
    V.log_tail = lambda log, n=40: runner.log_tail(log, 40)

path = pathlib.Path(sys.argv[1])
hw = detect("cuda")
src, kinds, why = _egg_source(load_problem(path), hw.sm_count or 132, {})
cand = pathlib.Path(tempfile.mkdtemp()) / "cand.py"
cand.write_text(src)
res = verify(str(path), str(cand), device="cuda", trials=int(sys.argv[2]) if len(sys.argv) > 2 else 8,
             problem_source=load_problem(path).source)
print(json.dumps({k: v for k, v in res.items() if k != "checks"}, default=str, indent=1)[:6000])
for c in res.get("checks", [])[-12:]:
    print(str(c)[:400])
