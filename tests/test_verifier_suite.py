"""The verifier under attack: every cheating candidate rejected for the right reason, every honest
one passed (tests/verifier_cases/cases.py lists them), plus the pieces the suite relies on.

Each process-level verification spawns a judge and a candidate process (a few seconds on the
CPU); they run two at a time in a module-wide pool while the tests wait on their own results.
"""
from __future__ import annotations

import concurrent.futures as cf
import pathlib
import pickle

import pytest

from harness.trials import plan
from harness.verify import verify
from tests.verifier_cases import cases as C

def _run(case: C.Case, gen: pathlib.Path) -> dict:
    prob = case.problem_path()
    cand = C.materialize(case, gen)
    return verify(str(prob), str(cand), device="cpu", trials=case.trials,
                  problem_source=prob.read_text(), static=case.static, **case.opts)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Start every verification of the suite at once (2 workers); tests wait on their own."""
    gen = tmp_path_factory.mktemp("generated")
    pool = cf.ThreadPoolExecutor(max_workers=2)
    # the slow ones first, so that they overlap with the rest
    order = sorted(C.ALL, key=lambda c: -c.opts.get("timeout_s", 0) - (c.candidate == "<generated:egg>"))
    futs = {c.id: pool.submit(_run, c, gen) for c in order}
    yield futs
    pool.shutdown(wait=True, cancel_futures=True)


def _check(case: C.Case, res: dict) -> None:
    assert C.matches(case, res), f"{case.id}: expected {case.expect} ({case.reason!r}), got {C.outcome(res)}: {res['reason']}"
    if case.expect == "passed":
        assert res["trials"] == len(res["trial_log"]) >= len(plan(case.trials)) - 2 and res["reason"] == ""
        assert {"parameters", "random-state", "tolerance", "inputs-unchanged", "recall-same-buffers",
                "partial-change", "train-eval", "grad-mode", "distributions", "shape-variants",
                "lower-precision-guard", "state-after-call", "layouts", "outputs-kept"} <= set(res["checks"])
        log = res["trial_log"]
        assert {t["mode"] for t in log} == {"train", "eval"} and any(t["grad"] for t in log)
        assert {"x3", "x0.01", "negated", "large", "recall", "partial"} <= {t["inputs"] for t in log}
        assert any(t["shape_variant"].startswith("batch") for t in log)
        assert {"padded", "transposed"} <= {t.get("layout") for t in log}
        assert res["outputs"] and all(o["passed_by"] in ("tolerance", "fp64") for o in res["outputs"])
    else:
        assert not res["passed"]


@pytest.mark.parametrize("case", C.HONEST, ids=lambda c: c.id)
def test_honest_candidate_passes(case, verdicts):
    _check(case, verdicts[case.id].result(timeout=300))


@pytest.mark.parametrize("case", C.DYNAMIC, ids=lambda c: c.id)
def test_cheat_rejected_at_run_time(case, verdicts):
    _check(case, verdicts[case.id].result(timeout=300))


@pytest.mark.parametrize("case", C.DROPIN, ids=lambda c: c.id)
def test_not_a_drop_in_rejected(case, verdicts):
    """Right at the problem's own call, wrong in one a user makes: each caught by its trial."""
    res = verdicts[case.id].result(timeout=300)
    _check(case, res)
    assert res["trial_log"] and not res["trial_log"][-1]["passed"]


@pytest.mark.parametrize("case", C.STATIC, ids=lambda c: c.id)
def test_cheat_rejected_statically(case, verdicts):
    res = verdicts[case.id].result(timeout=300)
    _check(case, res)
    assert res["checks"] == ["static"] and res["reason"].startswith("static check: line ")


def test_suite_size():
    cheats = [c for c in C.DYNAMIC + C.STATIC if c.expect != "passed"]
    assert len({c.candidate for c in cheats}) >= 12 and len(C.HONEST) >= 5


def test_fp64_inside_passes_by_the_fp64_door(verdicts):
    case = next(c for c in C.HONEST if c.candidate == "honest_fp64_inside")
    res = verdicts[case.id].result(timeout=300)
    assert res["passed"]
    out = res["outputs"][0]
    # beyond the fp32 tolerance of eager, and more accurate than eager against float64
    assert out["max_abs"] > 1e-4 and out["passed_by"] == "fp64"
    assert out["cand_err_fp64"] < out["eager_err_fp64"]


def test_honest_llm_style_candidates_trip_no_static_rule():
    from harness.verify import static_findings

    for c in C.HONEST:
        if not c.candidate.startswith("<"):
            assert static_findings(str(C.CANDIDATES / f"{c.candidate}.py"), None) == []


def test_generated_candidates_trip_no_static_rule(tmp_path):
    """Every example's EGG-generated ModelNew passes the static check (problem prefix included)."""
    from codegen.pipeline import compile_problem
    from harness.problem import load_problem
    from harness.static_check import check_source

    for ex in sorted(C.EXAMPLES.glob("*.py")):
        comp = compile_problem(load_problem(ex))
        assert comp.emitted is not None, comp.error
        assert check_source(comp.emitted.source) == [], ex.name


# ----------------------------------------------------------------------------- pieces
try:
    import torch as _torch

    class _SubTensor(_torch.Tensor):
        pass
except ImportError:  # pragma: no cover
    pass


def test_judge_unpickler_refuses_code_and_classes():
    """What crosses from the candidate process is loaded by an allow-list: no __reduce__ code,
    no Tensor subclasses; plain tensors and numbers load."""
    import torch
    from multiprocessing.reduction import ForkingPickler

    from harness.worker import _Refused, safe_loads

    class Boom:
        def __reduce__(self):
            return (print, ("owned",))

    with pytest.raises(_Refused, match="builtins.print"):
        safe_loads(pickle.dumps(("out", [Boom()])))
    import torch.multiprocessing  # noqa: F401 - registers the shared-memory reductions

    with pytest.raises(_Refused):  # the subclass (or its rebuild hook) is not on the list
        safe_loads(bytes(ForkingPickler.dumps(("out", [torch.zeros(2).as_subclass(_SubTensor)]))))
    buf = bytes(ForkingPickler.dumps(("out", [torch.arange(6.0).view(2, 3).t(), 3, 2.5, True, None], 0.1, 1)))
    msg = safe_loads(buf)
    assert torch.equal(msg[1][0], torch.arange(6.0).view(2, 3).t()) and msg[1][1:] == [3, 2.5, True, None]


def test_static_check_skips_main_block_and_allows_plain_names():
    from harness.static_check import check_source

    src = ("import torch\n\ndef f(input, open_=None):\n    return input + 1\n\n"
           "if __name__ == '__main__':\n    import time\n    print(time.time())\n")
    assert check_source(src) == []
    bad = "import torch\nt = torch\nt.equal = None\ng = getattr(object(), 'x' + 'y')\nf = eval\n"
    whys = " | ".join(str(f) for f in check_source(bad))
    assert "monkey-patching" in whys and "computed name" in whys and "evaluates" in whys


def test_unusable_candidate_files_are_category_candidate(tmp_path):
    prob = C.PROBLEMS / "rowsum.py"
    nomodel = tmp_path / "nomodel.py"
    nomodel.write_text("import torch\nclass Other(torch.nn.Module):\n    pass\n")
    broken = tmp_path / "broken.py"
    broken.write_text("class ModelNew(\n")
    for path, why in ((nomodel, "defines no ModelNew"), (broken, "does not parse"),
                      (tmp_path / "missing.py", "no such file")):
        res = verify(str(prob), str(path), device="cpu", trials=1)
        assert res["category"] == "candidate" and why in res["reason"] and str(path) in res["reason"]
