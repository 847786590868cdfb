"""GPU smoke test of the LLM policy's four roles with real verification and timing.

No model is needed (the GPU machine reaches no network): a local scripted OpenAI-compatible
server (tests/llm_fake_server.py) answers by role - a plan, a correct kernel, a tiling proposal,
a memory revision with cache hints - through the real ChatOpenAI client. On the GPU the tiler and
memory optimizer are asked (on the CPU interpreter they decline), so this exercises the stage-2
paths end to end: proposals applied to EGG_CONFIGS, verified, timed, kept or rejected by the
profiler's noise-aware verdict.

Usage (project root, after `source scripts/gpu_env.sh`):

    python3 scripts/gpu_llm_smoke.py [OUT_DIR]

Writes OUT_DIR/runs/llm-smoke/ (report.md, report.json, llm/*.json, candidates) and prints a
summary; exits 1 when a check fails. Takes about a minute.
"""
from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.llm_fake_server import FakeOpenAI  # noqa: E402
from tests.llm_scripts import GOOD, PLAN, PROBLEM  # noqa: E402

# a bigger instance of the test problem, so the GPU timings mean something
SMOKE_PROBLEM = PROBLEM.replace("torch.randn(37, 301)", "torch.randn(8192, 4099)")
REVISED = GOOD.replace("x = tl.load(X + offs, mask=mask, other=0)",
                       'x = tl.load(X + offs, mask=mask, other=0, eviction_policy="evict_first")')
assert REVISED != GOOD


def responder():
    asked: dict[str, int] = {}
    tilings = [(1024, 4), (2048, 8), (512, 4)]

    def reply(body: dict) -> dict:
        system = body["messages"][0]["content"]
        role = next(r for r in ("planner", "algorithm designer", "tiler", "memory optimizer")
                    if f"You are the {r}" in system)
        n = asked[role] = asked.get(role, 0) + 1
        if role == "planner":
            return {"tool_args": PLAN}
        if role == "algorithm designer":
            return {"content": GOOD}
        if role == "tiler":
            block, warps = tilings[min(n, len(tilings)) - 1]
            return {"tool_args": {"change": True, "rationale": "tile-block-size: fill 132 SMs",
                                  "kernels": [{"kernel": "_egg_k_g0", "params": [
                                      {"name": "BLOCK", "value": block},
                                      {"name": "num_warps", "value": warps}]}]}}
        if n == 1:
            return {"content": "Stream x once (mem-eviction-hints).\n" + REVISED.split("\n", 2)[2]}
        return {"content": "NO_CHANGE: nothing else to save"}

    return reply


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-llm-smoke").resolve()
    out.mkdir(parents=True, exist_ok=True)
    prob = out / "relu_scale_big.py"
    prob.write_text(SMOKE_PROBLEM)
    from typer.testing import CliRunner

    from graph.cli import app

    with FakeOpenAI(responder()) as srv:
        res = CliRunner().invoke(app, ["run", str(prob), "--device", "cuda", "--policy", "llm",
                                       "--model", "scripted", "--base-url", srv.base_url,
                                       "--runs-dir", str(out / "runs"), "--run-id", "llm-smoke"])
        n_requests = len(srv.requests)
    print(res.output)
    run = out / "runs" / "llm-smoke"
    checks = []
    if res.exit_code != 0 or not (run / "report.json").exists():
        print(f"FAILED: exit code {res.exit_code}")
        return 1
    rep = json.loads((run / "report.json").read_text())
    by_stage: dict[str, list] = {}
    for c in rep["candidates"]:
        by_stage.setdefault(c["stage"], []).append(c)
    checks.append(("a stage-1 kernel verified", any(c["verified"] for c in by_stage.get("algorithm", []))))
    checks.append(("the tiler proposed candidates", bool(by_stage.get("tiling"))))
    checks.append(("every tiling candidate verified", all(c["verified"] for c in by_stage.get("tiling", []))))
    checks.append(("the memory optimizer's revision verified",
                   any(c["verified"] for c in by_stage.get("memory", []))))
    checks.append(("timed on the GPU", rep["timing"].get("interpreter") is False))
    roles = set(rep["llm_usage"])
    checks.append(("usage of all four roles", {"planner", "algorithm_designer", "tiler", "memory_optimizer"} <= roles))
    print(f"{n_requests} LLM requests; best {rep['best_id']} (stage {rep['best_stage']}); "
          f"speedup vs eager {rep['timing'].get('speedup_eager')}")
    for c in rep["candidates"]:
        print(f"  {c['id']:4s} {c['stage']:9s} verified={c['verified']} ms={c['ms']} verdict={c['verdict']}")
    ok = True
    for name, passed in checks:
        print(f"{'ok  ' if passed else 'FAIL'} {name}")
        ok &= bool(passed)
    print(f"report: {run / 'report.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
