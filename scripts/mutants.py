"""Named mutants: does the test suite notice when the code everything rests on is broken?

Each mutant is one exact edit of one file (an original snippet and its replacement) plus the
tests that must notice it. For each mutant the script copies the repository (the files git
tracks, and untracked ones it does not ignore) into a temporary folder, applies the edit there
(never in the working tree), runs the mutant's tests with a time limit and reports:

- ``killed``: a test failed (what should happen);
- ``timeout``: the tests ran past the limit (counted as killed: the change was noticed, slowly);
- ``survived``: every test passed on the broken code: a hole in the suite (docs/mutation.md
  explains each one or names the test that now kills it);
- ``no longer applies``: the original snippet is not in the file (exactly once): the code was
  refactored under the mutant. A loud failure: re-target the snippet in MUTANTS, so that a
  refactor cannot make a mutant vanish silently.

Before the mutants, each distinct test selection runs once on the unmutated copy (``baseline``):
a selection that fails there would "kill" every mutant for nothing, so its mutants are not run.

    python scripts/mutants.py --list
    python scripts/mutants.py --jobs 2                 # all of them (slow: outside CI)
    python scripts/mutants.py --only checkpoints-no-ProblemSpec --only 'reduction-*'
    python scripts/mutants.py --check                  # every snippet still applies (seconds)

Exit code: 0 every mutant killed, 1 a mutant survived, 2 a mutant no longer applies, 3 a
baseline failed. ``--markdown FILE`` writes the results table (docs/mutation.md keeps the last).
"""

import argparse
import concurrent.futures as cf
import dataclasses
import fnmatch
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: the test files of the verifier (slow: every case spawns a judge and a candidate process)
VERIFIER = ("tests/test_verifier_suite.py",)
COMPARE = "tests/test_compare.py"  # harness.compare alone (seconds)
#: the templates' identities: the one-sign rows first (seconds), then every template case
TEMPLATES = ("tests/test_templates.py::test_max_min_of_all_negative_and_all_positive_rows",
             "tests/test_templates.py")
CASE = "tests/test_templates.py::test_template_matches_torch"  # one template case: CASE[name]
STATE = ("tests/test_state_roundtrip.py",)


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    original: str  # must occur exactly once in the file
    replacement: str
    #: pytest selections (files or node ids), each run as its own pytest in this order until
    #: one fails: the fast, precise test first, the broad file after it
    tests: tuple[str, ...]
    why: str  # what the broken code would mean for a user


def _no_record(t: str) -> Mutant:
    """One record type left off the checkpoint serializer's allow-list."""
    return Mutant(
        f"checkpoints-no-{t}", "graph/checkpoints.py",
        "allowed = [(t.__module__, t.__name__) for t in RECORD_TYPES]",
        f"allowed = [(t.__module__, t.__name__) for t in RECORD_TYPES if t.__name__ != {t!r}]",
        STATE, f"{t} blocked on reload: checkpoints come back as dicts")


# ----------------------------------------------------------------------------- the table
# One table, in one file. A snippet that no longer applies is re-targeted here, not dropped.
MUTANTS: list[Mutant] = [
    # -- harness/compare.py: the precision contract
    Mutant("compare-lower-precision-factor", "harness/compare.py",
           "LOWER_PRECISION_FACTOR = 16.0", "LOWER_PRECISION_FACTOR = 1e12", (COMPARE, *VERIFIER),
           "a candidate computing with lower precision than eager passes inside tolerance"),
    Mutant("compare-fp64-door-widened", "harness/compare.py",
           'if chk.within_tol or c["max"] <= factor * e["max"]:',
           'if chk.within_tol or c["max"] <= 100 * factor * e["max"]:', (COMPARE, *VERIFIER),
           "a candidate 100x less accurate than eager against float64 passes"),
    Mutant("compare-tolerance-ignored", "harness/compare.py",
           "within &= bool((diff <= atol + rtol * r.abs().nan_to_num()).all())",
           "within &= True", (COMPARE, *VERIFIER), "any finite output matches eager"),
    Mutant("compare-nan-where-eager-finite", "harness/compare.py",
           "bad_nonfinite += int((~c_fin & r_fin).sum())", "bad_nonfinite += 0", (COMPARE, *VERIFIER),
           "NaN/Inf outputs where eager is finite pass"),
    Mutant("compare-decision-door-unbounded", "harness/compare.py",
           "if n_c > DECISION_DOOR_FACTOR * n_e or far:", "if far:", (COMPARE, *VERIFIER),
           "any pattern of infinities passes where eager's differs from float64's at all"),
    Mutant("compare-decision-kept-values-unchecked", "harness/compare.py",
           "far += int((d > atol + rtol * r[kept].abs()).sum())", "far += 0", (COMPARE,),
           "values kept finite where eager has -inf pass unchecked (any number)"),
    Mutant("compare-decision-nan-admitted", "harness/compare.py",
           'extra = {"inf_pattern": True} if differ_nonfinite and not new_nan else {}',
           'extra = {"inf_pattern": True} if differ_nonfinite else {}', (COMPARE,),
           "NaN outputs pass the decision regime"),
    Mutant("compare-integer-door-unbounded", "harness/compare.py",
           "if n_e and n_c <= DECISION_DOOR_FACTOR * n_e and d_c <= d_e:", "if n_e:",
           (COMPARE, *VERIFIER), "any integer output passes where eager's differ from float64's at all"),
    Mutant("compare-integer-door-for-all", "harness/compare.py",
           "if n_e and n_c <= DECISION_DOOR_FACTOR * n_e and d_c <= d_e:", "if True:",
           (COMPARE, *VERIFIER), "integer outputs are never compared"),
    Mutant("dropin-init-unchecked", "codegen/emit.py",
           'init.insert(0, "self._egg_built = _egg_built_with(_egg_init_args, args, kwargs, _EGG_INIT)")',
           'init.insert(0, "self._egg_built = True")',
           ("tests/test_dropin.py::test_constructor_arguments_and_attributes_the_trace_baked_in",),
           "a ModelNew built with another top-p or vocabulary size runs kernels baked for the old one"),
    Mutant("dropin-attrs-unchecked", "codegen/emit.py",
           'f"self.{a} != {_literal(v)}" for a, v in (dr.attrs or {}).items()]',
           'f"self.{a} != {_literal(v)}" for a, v in {}.items()]',
           ("tests/test_dropin.py::test_constructor_arguments_and_attributes_the_trace_baked_in",),
           "a temperature changed after construction is ignored by the kernels"),
    Mutant("fusion-recompute-equal-bytes", "codegen/fusion.py",
           "or sum(d.itemsize for d in dts) >= out.itemsize):", "or sum(d.itemsize for d in dts) > out.itemsize):",
           ("tests/test_rewrites.py::test_prologue_members_only_the_reduction_uses_move_into_it",),
           "a reduction recomputes chains that read as many bytes as their value: more work, nothing saved"),
    Mutant("round-half-away", "codegen/ops.py", '"round": "_egg_rint({0})",', '"round": "tl.floor({0} + 0.5)",',
           ("tests/test_codegen_families.py::test_round_is_ties_to_even_in_the_kernel",),
           "torch.round's ties go up, not to even: quantized values one step off eager's"),
    Mutant("to-int-unrounded", "codegen/ops.py",
           'STEP_OPS = COMPARISONS | {"floor", "ceil", "sign", "round", "to_int"}',
           'STEP_OPS = COMPARISONS | {"floor", "ceil", "sign", "round"}',
           ("tests/test_codegen_families.py::test_casts_to_and_from_integers_in_the_kernel",),
           "a bf16 value computed in a kernel is truncated to an integer unrounded: off by one where eager's bf16 crossed it"),
    Mutant("verifier-random-door-open", "harness/worker.py",
           "                door64 = None if tr.mode in random_modes else m64\n",
           "                door64 = m64\n", VERIFIER,
           "a model that draws random numbers is judged through the float64 door, whose reference drew "
           "other numbers: a candidate leaving the noise out passes as 'as accurate as eager'"),
    Mutant("candidate-call-unseeded", "harness/candidate_proc.py",
           "            torch.manual_seed(seed)  # the reference's call started from the same seed\n",
           "            pass\n", VERIFIER,
           "ModelNew's call does not start from the reference's seed: every honest candidate of a "
           "model with dropout is rejected in train()"),
    Mutant("dropin-autocast-ignored", "codegen/emit.py",
           '    lines += ["    if torch._C._is_any_autocast_enabled():", f"        return {amp_to}"]\n',
           '    pass\n',
           ("tests/test_matmul.py",),
           "a call under torch.autocast runs the kernels built for the traced dtypes: fp32 where "
           "Model returns bf16"),
    Mutant("verifier-no-batch-of-one", "harness/worker.py",
           "        return [] if b <= 1 else [", "        return [] if True else [", VERIFIER,
           "a candidate that squeezes the batch away at one request passes"),
    Mutant("capture-autocast-off-a-break", "harness/capture.py",
           "            if enabled is False:\n", "            if enabled is False and False:\n",
           ("tests/test_capture.py::test_autocast_turned_off_on_a_traced_device_is_traced_through",),
           "HF rotary's autocast-off block on a traced device is a graph break: its tables stay PyTorch"),
    Mutant("compare-structure-unchecked", "harness/compare.py",
           "    if tree[0] != tree[1]:\n", "    if False:\n", (COMPARE, *VERIFIER),
           "a tuple where Model returns a dict (or other keys) passes: a caller's out['probs'] fails"),
    Mutant("fusion-row-index-as-tuple-item", "codegen/fusion.py",
           "            if g is not None and g.red is src and slot is not None and tup:\n",
           "            if g is not None and g.red is src and slot is not None:\n",
           ("tests/test_capture.py::test_a_transformer_encoder_is_written_out_into_kernels",),
           "norm(x)[0], the first row, read as the norm's value: a kernel storing an undefined name"),
    Mutant("transformer-layer-dropout-dropped", "codegen/rewrites/modules.py",
           '                return call("dropout1", graph.call_function(operator.getitem, (att, 0)))\n',
           "                return graph.call_function(operator.getitem, (att, 0))\n",
           ("tests/test_capture.py::test_a_transformer_encoder_is_written_out_into_kernels",),
           "the attention's dropout left out of a written-out encoder layer: train() differs from eager"),
    Mutant("reference-on-relaid-weights", "knowledge/templates/_runtime.py",
           "                if not p.is_contiguous():\n                    swapped.append((p, p.data))\n",
           "                if False:\n                    swapped.append((p, p.data))\n",
           ("tests/test_layout.py::test_functional_conv_parameter_relaid_and_view_consumer_safe",),
           "Model's own code on channels-last weights: its view of a conv result raises at a batch of one"),
    Mutant("verifier-index-watch-blind", "harness/worker.py",
           "            self.seen = True\n", "            pass\n",
           ("tests/test_trials.py::test_a_forward_indexing_with_its_own_positions_gets_the_cpu_check",),
           "a forward scattering its own sort indices runs one more leading dim on the GPU unchecked: the judge dies"),
    Mutant("compare-integers-always-equal", "harness/compare.py",
           "same = bool(torch.equal(ref, cand))", "same = True", (COMPARE, *VERIFIER),
           "wrong integer outputs (argmax indices) pass"),
    Mutant("compare-shape-unchecked", "harness/compare.py",
           "            if tuple(c.shape) != tuple(r.shape):\n",
           "            if False:\n", (COMPARE, *VERIFIER), "an output of another shape is compared by broadcasting"),
    Mutant("compare-dtype-unchecked", "harness/compare.py",
           "            if c.dtype != r.dtype:\n", "            if False:\n", (COMPARE, *VERIFIER),
           "an output of another dtype passes"),
    # -- harness/verify.py: the EGG process's side
    Mutant("verify-nonce-unchecked", "harness/verify.py",
           'if isinstance(obj, dict) and obj.get("nonce") == nonce:', "if isinstance(obj, dict):",
           VERIFIER, "a verdict the candidate printed is taken for the judge's"),
    Mutant("verify-static-check-off", "harness/verify.py",
           "    if static:\n        findings", "    if False:\n        findings", VERIFIER,
           "monkey-patching, threads, file access are not looked for"),
    # -- harness/worker.py: the judge
    Mutant("worker-inputs-unchecked", "harness/worker.py",
           "                    if isinstance(a, torch.Tensor) and not _same(a, b):\n                        raise",
           "                    if False:\n                        raise", VERIFIER,
           "a candidate that writes into its inputs passes"),
    Mutant("trials-no-recall", "harness/trials.py",
           'Trial(0, "train", False, "recall"),', 'Trial(0, "train", False, "own"),', VERIFIER,
           "a candidate caching on buffer pointers passes"),
    Mutant("trials-no-partial", "harness/trials.py",
           "    for b in buffers:\n        if not isinstance(b, torch.Tensor) or b.numel() < 2:",
           "    for b in []:\n        if not isinstance(b, torch.Tensor) or b.numel() < 2:", VERIFIER,
           "a cache keyed on pointers and a few sampled elements passes"),
    Mutant("trials-no-layouts", "harness/worker.py",
           "                    if tr.layout:  # both models get",
           "                    if False:  # both models get", VERIFIER,
           "a kernel that indexes rows as if contiguous passes, wrong on a user's split or slice"),
    Mutant("worker-kept-outputs-unchecked", "harness/worker.py",
           "                if kept is not None:\n", "                if False:\n", VERIFIER,
           "a candidate writing every result into one kept tensor passes; a caller's earlier "
           "result is overwritten"),
    Mutant("trials-no-eval", "harness/worker.py",
           '    model.train(mode == "train")\n    before = _buffers(model)',
           '    model.train(True)\n    before = _buffers(model)', VERIFIER,
           "the reference always in train(): an eval()-only bug passes"),
    Mutant("worker-no-random-state", "harness/worker.py",
           "        model.load_state_dict(state, strict=False)\n",
           "        state = {}\n", VERIFIER, "a dropped LayerNorm weight or bias passes (seeded init 1 and 0)"),
    Mutant("worker-state-unchecked", "harness/worker.py",
           "                prev = _check_state(model, cstate, kmap, before, prev, tol, where,\n"
           "                                    _state_door(door64, model, before, priv, tr.mode))\n",
           "                pass\n", VERIFIER, "a forward that changes its parameters, or running stats off, pass"),
    Mutant("judge-keeps-candidate-statistics", "harness/worker.py",
           "                prev = _sync_updated(model, cand, kmap, before, tol, where) or prev\n",
           "                pass\n", VERIFIER,
           "the candidate carries its own running statistics into eval(): an honest float64 batch "
           "norm fails as lower precision"),
    Mutant("worker-buffer-door-open", "harness/worker.py",
           "                chk = fp64_door(chk, ref64, exp, c, tol)\n",
           "                chk.ok = True\n", VERIFIER,
           "a buffer Model updates passes however far it is from the float64 result"),
    Mutant("worker-raise-not-required", "harness/worker.py",
           "                if expect:\n                    raise _Verdict(\"mismatch\"",
           "                if False:\n                    raise _Verdict(\"mismatch\"", VERIFIER,
           "a result where PyTorch raises passes"),
    Mutant("timing-wall-bound-off", "harness/timing.py",
           "    if bound > med:\n", "    if False:\n", ("tests/test_timing_judge.py",),
           "times reported below the judge's wall clock count"),
    Mutant("graph-output-not-cloned", "knowledge/templates/_runtime.py",
           "        return _egg_graph_clone(out)\n", "        return out\n", ("tests/test_cuda_graph.py",),
           "a graphed module returns its static output: the next call overwrites what a caller kept"),
    Mutant("graph-buffers-not-restored", "knowledge/templates/_runtime.py",
           "                b.copy_(v)\n", "                pass\n", ("tests/test_cuda_graph.py",),
           "the capture's call updates running statistics a second time"),
    Mutant("graph-stale-state", "knowledge/templates/_runtime.py",
           "    if entry is None or not _egg_state_same(entry[0]):\n", "    if entry is None:\n",
           ("tests/test_cuda_graph.py",), "a graph keeps reading a replaced parameter or submodule"),
    Mutant("pointwise-rows-index-swapped", "knowledge/templates/pointwise.py",
           '        "    r1 = (row // D2) % D1",\n', '        "    r1 = (row // D1) % D2",\n',
           ("tests/test_codegen_families.py::test_pointwise_rows_of_the_inner_dim",),
           "a row's outer index split in the wrong order: broadcast operands read the wrong rows"),
    Mutant("timing-no-host-cover", "harness/timing.py",
           "            if calls == 1:\n                torch.cuda._sleep(cover)\n", "            pass\n",
           ("tests/test_timing.py::test_single_call_rounds_time_the_gpu_not_the_hosts_dispatch",),
           "a single-call round times the host's dispatch: honest sub-millisecond kernels rejected"),
    Mutant("timing-outputs-unchecked", "harness/worker.py",
           "                    self._verify(eo, co, priv, shared, what)\n", "                    pass\n",
           ("tests/test_timing_judge.py",), "a candidate wrong only in timed calls is timed"),
    Mutant("timing-hash-unchecked", "harness/worker.py",
           'if r.get("sha256") and r["sha256"] != sha:', "if False:", ("tests/test_timing_judge.py",),
           "a file changed after verification is timed"),
    Mutant("worker-params-unchecked", "harness/worker.py",
           "if not torch.equal(c.to(p.device), p.detach()):", "if False:", VERIFIER,
           "ModelNew's parameters may differ from Model's"),
    Mutant("worker-reference-determinism-off", "harness/worker.py",
           "            _check_reference_determinism(out, again, tol, mode)\n", "            pass\n", VERIFIER,
           "a random reference (dropout) judges candidates"),
    Mutant("worker-unpickler-open", "harness/worker.py",
           "        if (module, name) not in _ALLOWED:\n", "        if False:\n", VERIFIER,
           "the candidate can make the judge run code through pickle"),
    Mutant("worker-candidate-category-trusted", "harness/worker.py",
           'return c if c in ("candidate", "compile", "runtime", "memory") else "cheat"', "return c",
           VERIFIER, "the candidate process names its own failure category"),
    Mutant("worker-memory-unwatched", "harness/worker.py",
           "                if rss > self.mem:\n", "                if False:\n", VERIFIER,
           "a candidate may use all the host's memory"),
    Mutant("worker-no-fp64-reference", "harness/worker.py",
           "        ref64 = _fp64_outputs(m64, model, before, xs, mode)\n", "        ref64 = None\n", VERIFIER,
           "no float64 door and no lower-precision guard"),
    Mutant("worker-launches-uncounted", "harness/candidate_proc.py",
           "            def run_i(self, *a, **k):\n                counter[\"n\"] += 1\n",
           "            def run_i(self, *a, **k):\n                counter[\"n\"] += 0\n",
           ("tests/test_verifier_node.py", "tests/test_expert_stage2.py::test_memory_variant_draft_verifies"),
           "interpreted kernels are not counted: every CPU kernel candidate looks like plain torch"),
    # -- the templates' identities (masked lanes of a non-power-of-two tile)
    Mutant("reduction-amax-identity", "knowledge/templates/reduction.py",
           '"amax": \'float("-inf")\', "amin"', '"amax": "0.0", "amin"', TEMPLATES,
           "max of an all-negative row is 0"),
    Mutant("reduction-amin-identity", "knowledge/templates/reduction.py",
           '"amin": \'float("inf")\',\n            "argmax"', '"amin": "0.0",\n            "argmax"',
           TEMPLATES, "min of an all-positive row is 0"),
    Mutant("reduction-argmax-identity", "knowledge/templates/reduction.py",
           '"argmax": \'float("-inf")\'', '"argmax": "0.0"', TEMPLATES,
           "argmax of an all-negative row is 0"),
    Mutant("reduction-argmin-identity", "knowledge/templates/reduction.py",
           '"argmin": \'float("inf")\'', '"argmin": "0.0"', TEMPLATES,
           "argmin of an all-positive row is 0"),
    Mutant("reduction-sum-identity", "knowledge/templates/reduction.py",
           'IDENTITY = {"sum": "0.0"', 'IDENTITY = {"sum": "1.0"', (f"{CASE}[reduction_rows]", *TEMPLATES),
           "masked lanes add 1 to a sum"),
    Mutant("reduction-prod-identity", "knowledge/templates/reduction.py",
           '"prod": "1.0"', '"prod": "0.0"', (f"{CASE}[reduction_prod]", *TEMPLATES), "masked lanes zero a product"),
    Mutant("reduction-logsumexp-identity", "knowledge/templates/reduction.py",
           '"logsumexp": \'float("-inf")\'', '"logsumexp": "0.0"',
           (TEMPLATES[0], "tests/test_codegen_families.py::test_generated_model_matches_reference[long_row_softmax]",
            TEMPLATES[1]),
           "masked lanes add exp(0) to a logsumexp"),
    Mutant("reduction-split-merge-fill", "knowledge/templates/reduction.py",
           'fin += [f"pv = tl.load(W + {at}, mask={pm}, other={ident})"',
           'fin += [f"pv = tl.load(W + {at}, mask={pm}, other=0.0)"', TEMPLATES,
           "the split merge reads 0 for missing partials: max of all-negative rows is 0"),
    Mutant("softmax-broadcast-amax-fill", "knowledge/templates/softmax.py",
           '"amax": (NEG, "tl.max"', '"amax": ("0.0", "tl.max"', TEMPLATES,
           "x - amax(x) is wrong on all-negative rows"),
    Mutant("softmax-broadcast-amin-fill", "knowledge/templates/softmax.py",
           '"amin": (\'float("inf")\', "tl.min"', '"amin": ("0.0", "tl.min"', TEMPLATES,
           "x - amin(x) is wrong on all-positive rows"),
    Mutant("softmax-fill", "knowledge/templates/softmax.py",
           "fill = BROADCAST[spec.op][0] if bcast else NEG",
           'fill = BROADCAST[spec.op][0] if bcast else "0.0"', (f"{CASE}[softmax_one_pass]", *TEMPLATES),
           "masked lanes take part in a softmax's max and sum"),
    Mutant("scan-identity", "knowledge/templates/scan.py",
           'ident = "1.0" if prod else "0.0"', 'ident = "0.0"', (f"{CASE}[scan_exclusive]", *TEMPLATES),
           "exclusive cumprod starts at 0"),
    Mutant("scan-sum-identity", "knowledge/templates/scan.py",
           'ident = "1.0" if prod else "0.0"', 'ident = "1.0"', (f"{CASE}[scan]", *TEMPLATES),
           "masked lanes of a reverse cumsum add 1"),
    Mutant("pool-max-identity", "knowledge/templates/pool.py",
           'ident = \'float("-inf")\' if spec.op == "max" else "0.0"', 'ident = "0.0"', TEMPLATES,
           "max pooling over the padding of an all-negative window is 0"),
    Mutant("magic-division-short-shift", "knowledge/templates/_runtime.py",
           "return -(-(1 << (31 + l)) // d), l - 1", "return (1 << (31 + l)) // d, l - 1",
           ("tests/test_templates.py::test_magic_division_matches_floor_division",),
           "the magic multiplier rounded down: n // d one short at some multiples of d"),
    Mutant("step-ops-unrounded", "codegen/emit.py",
           'e = f"{e}.to({_HALF[O.node_dtype(o)]}).to(tl.float32)"', "e = e",
           ("tests/test_codegen_families.py::test_step_ops_read_16_bit_values_as_eager_rounds_them",),
           "a comparison reads a bf16 intermediate unrounded: x * 1.01 <= 1.0 flips at x = 0.992"),
    Mutant("step-literal-unrounded", "codegen/emit.py",
           "o = torch.tensor(o, dtype=half).item()", "o = o",
           ("tests/test_codegen_families.py::test_step_ops_read_16_bit_values_as_eager_rounds_them",),
           "a bf16 comparison's scalar kept in fp32: x * 0.5 <= 0.1 flips at x = 0.2002"),
    Mutant("take-negative-unwrapped", "knowledge/templates/__init__.py",
           'lines.append(f"t{i} = tl.where(t{i} < 0, t{i} + GS{i}, t{i})")', "pass",
           ("tests/test_take.py::test_indexed_reads_are_loads_in_one_kernel",),
           "x[ids] with a negative id reads 0 instead of the row counted from the end"),
    Mutant("far-operand-32-bit", "knowledge/templates/_runtime.py",
           "return any(sum((d - 1) * abs(s) for d, s in zip(dims, st) if d) >= _EGG_FAR for st in sts)",
           "return False",
           ("tests/test_far_offsets.py",),
           "a column of a tall matrix indexed with 32-bit offsets: the rows past 2**31 elements wrap"),
    Mutant("matmul-far-by-numel", "knowledge/templates/matmul.py",
           '"big = max(_egg_span(A3), _egg_span(B3), part.numel()"',
           '"big = max(A3.numel(), B3.numel(), part.numel()"',
           ("tests/test_far_offsets.py::test_launch_asks_for_64_bits_when_an_operand_reaches_far",),
           "a product's 64-bit flag by element counts: a sliced operand's rows wrap"),
    Mutant("helper-name-shadowed", "codegen/emit.py",
           "if n.op != \"placeholder\" and n.name in helpers:", "if False:",
           ("tests/test_backed_out.py",),
           "a value named after the runtime helper that made it: the backed-out module raises"),
    Mutant("fdiv-constexpr-shift", "knowledge/templates/_runtime.py",
           ">> (z + s).to(tl.uint32)", ">> s.to(tl.uint32)",
           ("tests/test_compile_check.py::test_a_pool_whose_division_shift_is_1_compiles",),
           "a pool's division shift of 1 (Triton's constexpr 1) fails to compile for sm_90"),
    Mutant("mask-blocks-all-read", "knowledge/templates/attention.py",
           "    if _hidden(spec) is None:\n        return [], f\"for n0", "    if True:\n        return [], f\"for n0",
           ("tests/test_mask_skip.py",),
           "every key block read: NaN in hidden blocks of K and V reaches the output"),
    Mutant("mask-scan-drops-last-block", "knowledge/templates/attention.py",
           'f"vhi = tl.minimum({hi}, vt + BLOCK_N)"', 'f"vhi = tl.minimum({hi}, vt)"',
           ("tests/test_mask_skip.py",),
           "the last block a tile sees is skipped with the hidden ones after it"),
    Mutant("int-compared-as-float", "knowledge/templates/__init__.py",
           'if dtype == "bool" or dtype.startswith("int"):', 'if dtype == "bool":',
           ("tests/test_int_compare.py",),
           "integer operands converted to fp32 before a comparison: 2**40 and 2**40 + 1 compare equal"),
    Mutant("masked-fill-swapped", "codegen/ops.py",
           'return NOp("pointwise", "where", node, [b["mask"], v, b["input"]])',
           'return NOp("pointwise", "where", node, [b["mask"], b["input"], v])',
           ("tests/test_int_compare.py",),
           "masked_fill keeps the masked values and fills the others"),
    Mutant("program-stack-swapped", "knowledge/templates/program.py",
           'expr = f"tl.where({sel.render()} == {k}, {vals[k]}, {expr})"',
           'expr = f"tl.where({sel.render()} != {k}, {vals[k]}, {expr})"',
           ("tests/test_quant_program.py",),
           "a stacked weight reads each nibble at the other's position"),
    Mutant("program-div-carries", "knowledge/templates/program.py",
           "return add(*[_divided(t, c) for t in mult], div(add(*rest), c))",
           "return add(*[_divided(t, c) for t in mult])",
           ("tests/test_quant_program.py",),
           "(a * c + r) // c taken as a, r's carry into the quotient dropped"),
    Mutant("program-cat-unclamped", "knowledge/templates/program.py",
           'return f"tl.minimum({inner}, {size - 1})"', 'return f"({e.render()} - {off})"',
           ("tests/test_quant_program.py",),
           "a cat's later pieces read at the unshifted index: loads past the stored tensor"),
    Mutant("program-packed-split-order", "knowledge/templates/program.py",
           "at[d] = r3 if d == ins[-1] else mod(div(flat_h, s // r), size)",
           "at[d] = r3 if d == ins[-1] else mod(div(flat_h, s), size)",
           ("tests/test_quant_program.py",),
           "a packed value's row read at the wrong k on the [BLOCK_N, BLOCK_K // R, R] tile"),
    Mutant("program-operand-dtype", "knowledge/templates/program.py",
           'if src == dt or (dt in FLOAT_DTYPES and src in ("int8", "uint8")):',
           "if True:",
           ("tests/test_quant_program.py",),
           "an int32 operand multiplied by bf16 scales unconverted: rounds once where eager rounds twice"),
    Mutant("program-take-unbounded", "codegen/rewrites/quant.py",
           "if lo < -size or hi >= size:", "if False:",
           ("tests/test_quant_program.py",),
           "a lookup whose index may leave its table is computed in the kernel (reads past the table)"),
    Mutant("program-and-range", "knowledge/templates/program.py",
           "got = (0, min(r[1] for r in (rx, ry) if r[0] >= 0))",
           "got = (0, min(r[1] for r in (rx, ry)))",
           ("tests/test_quant_program.py",),
           "x & c bounded by a negative operand's bound: a lookup past its table admitted"),
    Mutant("program-outer-split", "knowledge/templates/program.py",
           "            if probe.split:\n                return None", "            if False:\n                return None",
           ("tests/test_compile_check.py::test_packed_int4_weights_are_read_as_vectors",),
           "a view per group of 16 split instead of the nibbles' own pairs: the packed bytes loaded one a lane"),
    Mutant("program-signed-floordiv", "codegen/rewrites/quant.py",
           "or rx[0] < 0 or ry[0] <= 0:", "or ry[0] <= 0:",
           ("tests/test_quant_program.py",),
           "% and // of negative values computed with Triton's truncating ops (PyTorch floors)"),
    Mutant("program-cat-step-unwrapped", "knowledge/templates/program.py",
           'base = var(f"tl.multiple_of((({kb.render()} * {bk} + {(-off) % size}) % {size}), {bk})",',
           'base = var(f"tl.multiple_of(({kb.render()} * {bk} + {(-off) % size}), {bk})",',
           ("tests/test_quant_program.py",),
           "a cat's later piece read at the step's own k: past the piece (the next row's bytes)"),
    Mutant("program-leaves-unchecked", "knowledge/templates/_runtime.py",
           "        if v.shape != shape or v.dtype != dt:\n            raise ValueError(f\"a stored tensor",
           "        if False:\n            raise ValueError(f\"a stored tensor",
           ("tests/test_quant_program.py::test_the_wrapper_refuses_stored_tensors_and_inputs_it_was_not_built_for",),
           "a packed weight of another shape or dtype read by a kernel sized for the one it was built for"),
    Mutant("program-weight-read-elsewhere", "codegen/rewrites/quant.py",
           "or not isinstance(bias, (fx.Node, type(None))) or set(w.users) != {n}:",
           "or not isinstance(bias, (fx.Node, type(None))):",
           ("tests/test_quant_program.py",),
           "a weight the forward also returns is computed twice (kernel and torch)"),
    Mutant("plan-key-without-strides", "knowledge/templates/pointwise.py",
           '[f"a{i}.shape, a{i}.stride()" for i in range(n)]', '[f"a{i}.shape" for i in range(n)]',
           ("tests/test_plans.py",),
           "a pointwise call takes the plan of another layout of the same shapes"),
    Mutant("plan-of-copies", "knowledge/templates/pointwise.py",
           '"    plan = None",', '"    pass",',
           ("tests/test_plans.py",),
           "a call whose inputs the wrapper copied is planned: later calls launch the views uncopied"),
    Mutant("rec-key-without-strides", "knowledge/templates/__init__.py",
           'f"{a}.shape, {a}.stride(), {a}.dtype"', 'f"{a}.shape, {a}.dtype"',
           ("tests/test_plans.py",),
           "a reduction's call takes the plan recorded for another layout of the same shapes"),
    Mutant("rec-view-absolute-offset", "knowledge/templates/_runtime.py",
           "return t.as_strided(s[2], s[3], t.storage_offset() + s[4])", "return t.as_strided(s[2], s[3], s[4])",
           ("tests/test_plans.py",),
           "a replayed view of an argument reads where the first call's argument began, not this one's"),
    Mutant("rec-unknown-tensor-skipped", "knowledge/templates/_runtime.py",
           "                except _egg_NoPlan:\n                    self.ok = False",
           "                except _egg_NoPlan:\n                    pass",
           ("tests/test_plans.py",),
           "a launch on a copy the wrapper made is left out of the plan: replays return unwritten outputs"),
    Mutant("rec-alias-first-argument", "knowledge/templates/_runtime.py",
           '        if len(same) == 1:\n            return ("a", same[0])',
           '        if same:\n            return ("a", same[0])',
           ("tests/test_plans.py",),
           "a tensor passed as two arguments is recorded as the first: a replay reads it for both"),
    Mutant("program-shift-narrowed-past-width", "codegen/rewrites/quant.py",
           "if ry is None or isinstance(ry[0], float) or ry[0] < 0 or ry[1] > 31:",
           "if ry is None or isinstance(ry[0], float) or ry[0] < 0 or ry[1] > 63:",
           ("tests/test_quant_program.py::test_int32_nibbles_shifted_by_an_int64_table_are_shifted_in_int32",),
           "an int32 pack shifted by 32 or more is shifted in 32 bits, not as PyTorch's int64 shift"),
    Mutant("rec-output-view-dropped", "knowledge/templates/_runtime.py",
           "        return made[s[1]].as_strided(s[2], s[3], s[4])", "        return made[s[1]]",
           ("tests/test_plans.py",),
           "a replayed call returns the allocation a squeezed output was a view of: another shape"),
    Mutant("cat-piece-unshifted", "knowledge/templates/pointwise.py",
           'f"t{i} = c{q} - CO{q}_{k}"]', 'f"t{i} = c{q}"]',
           ("tests/test_cat.py::test_a_cat_and_the_kernels_of_its_pieces_are_one_kernel",),
           "a cat's later pieces read from their first column at the result's column"),
    Mutant("cat-boundary-column", "codegen/emit.py",
           'expr = f"tl.where(c{q} < CO{q}_{k + 1}, {args[k]}, {expr})"',
           'expr = f"tl.where(c{q} <= CO{q}_{k + 1}, {args[k]}, {expr})"',
           ("tests/test_cat.py::test_a_cat_and_the_kernels_of_its_pieces_are_one_kernel",),
           "the first column of each later piece taken from the piece before it"),
    Mutant("cat-rotation-sign-unplaced", "codegen/emit.py",
           'expr = f"tl.where((c{q} - CO{q}_{namer.g.placed[m][1]}) < {d // 2}, -({args[0]}), {args[0]})"',
           'expr = f"tl.where(c{q} < {d // 2}, -({args[0]}), {args[0]})"',
           ("tests/test_cat.py::test_a_cat_and_the_kernels_of_its_pieces_are_one_kernel",),
           "a rotate-half in a later piece negates by the result's column, not the piece's"),
    Mutant("take-index-once-per-row", "knowledge/templates/pointwise.py",
           '"if ROWS and B%d:" % i,', '"if ROWS:",',
           ("tests/test_take.py::test_indexed_reads_are_loads_in_one_kernel",),
           "an operand (a gather's index) read once per row where it changes along the row"),
    Mutant("row-operand-drops-r2", "knowledge/templates/pointwise.py",
           'return f"r0 * S{i}_0 + r1 * S{i}_1 + r2 * S{i}_2"', 'return f"r0 * S{i}_0 + r1 * S{i}_1"',
           ("tests/test_codegen_families.py::test_operands_constant_along_a_row_are_loaded_once_a_row",),
           "a per-row operand read at the wrong row (the innermost outer index left out)"),
    Mutant("amax-drops-nan", "knowledge/templates/reduction.py",
           "loop.append(f\"acc2 = {nan_max('acc2', 'v')}\")", 'loop.append("acc2 = tl.maximum(acc2, v)")',
           ("tests/test_codegen_families.py::test_max_min_and_arg_reductions_take_nan_as_torch_does",),
           "amax of a row holding NaN gives the largest number (torch gives NaN)"),
    Mutant("argmax-skips-nan", "knowledge/templates/reduction.py",
           'return [f"upd = (v {cmp} acc2) | ((v != v) & (acc2 == acc2))",', 'return [f"upd = v {cmp} acc2",',
           ("tests/test_codegen_families.py::test_max_min_and_arg_reductions_take_nan_as_torch_does",),
           "argmax of a row holding NaN gives the largest number's index (torch: the NaN's)"),
    Mutant("relu-drops-nan", "codegen/ops.py",
           '"relu": nan_max("{0}", "0.0"),', '"relu": "tl.maximum({0}, 0.0)",',
           ("tests/test_codegen_families.py::test_nan_passes_through_max_and_min_as_in_eager",),
           "relu turns a NaN activation into 0 (torch keeps the NaN)"),
    Mutant("guard-accumulate-none", "codegen/dropin.py",
           "free, lead = _accumulate(inputs, free, lead, same)", "free, lead = [], []",
           ("tests/test_dropin.py::test_sizes_valid_only_together_stay_free",),
           "sizes valid only together fix every dim: attention only at its traced length"),
    # -- graph/checkpoints.py: the state survives a checkpoint round trip typed
    # (the types that only ever sit inside another record, TensorSpec, OutputError, TrialRecord
    # and Attempt, are rebuilt by their parent's validation: leaving them off changes nothing,
    # docs/mutation.md)
    *[_no_record(t) for t in ("ProblemSpec", "HardwareInfo", "Analysis", "VerificationRecord",
                               "TimingRecord", "StageContext", "LLMUsage", "Candidate", "Plan")],
    Mutant("checkpoints-no-allow-list", "graph/checkpoints.py",
           "return JsonPlusSerializer(allowed_msgpack_modules=allowed)", "return JsonPlusSerializer()",
           STATE, "every record comes back with an 'unregistered type' warning"),
    # -- the rows of issue 22's table and its "Also" paragraph
    Mutant("expert-designer-declines", "policies/expert.py",
           "    def design(self, state: EggState, settings: Settings) -> Draft | Decline:\n        a = state.analysis\n",
           "    def design(self, state: EggState, settings: Settings) -> Draft | Decline:\n"
           "        return Decline('mutant')\n        a = state.analysis\n",
           ("tests/test_workloads.py::test_egg_run_through_the_graph_at_small_shapes",),
           "stage 1 never makes a kernel: every run returns the reference"),
    Mutant("memory-optimizer-declines", "policies/expert.py",
           "        tried = [c for c in state.candidates if c.stage == \"memory\"]\n",
           "        return Decline(\"every memory variant was tried\")\n",
           ("tests/test_expert_stage2.py::test_memory_optimizer_decides_per_kernel_kind",),
           "stage 2's memory variants are never tried"),
    Mutant("bench-kill-job-noop", "graph/bench.py",
           "    marker in their environment.\"\"\"\n    for _ in range(3):\n",
           "    marker in their environment.\"\"\"\n    return\n    for _ in range(3):\n",
           ("tests/test_bench.py::test_bench_hang_and_crash_are_failures",),
           "a timed-out problem's processes live on after egg bench moved on"),
    Mutant("problem-inputs-not-meta", "harness/problem.py",
           "        with torch.device(\"meta\"):\n            out = call_checked(prob, \"get_inputs\", True)\n",
           "        out = call_checked(prob, \"get_inputs\", True)\n",
           ("tests/test_workloads.py::test_large_variants_describe_without_allocating",),
           "describing a Llama-sized problem allocates its real inputs"),
    Mutant("problem-model-not-meta", "harness/problem.py",
           "        return build_model(prob, init, \"meta\")\n", "        return build_model(prob, init).to(\"meta\")\n",
           ("tests/test_workloads.py::test_large_variants_describe_without_allocating",),
           "describing a Llama-sized problem allocates its real weights"),
    Mutant("gpulock-enabled-ignored", "harness/gpulock.py",
           "path = lock_path() if enabled else None", "path = lock_path()",
           ("tests/test_gpulock.py",), "hold(enabled=False) still waits for the GPU lock"),
    Mutant("gpulock-off-ignored", "harness/gpulock.py",
           "    path = lock_path() if enabled else None\n    if path is None:\n",
           "    path = (lock_path() or pathlib.Path(tempfile.gettempdir()) / \"egg-gpu-off.lock\") "
           "if enabled else None\n    if path is None:\n",
           ("tests/test_gpulock.py",), "EGG_GPU_LOCK=off still takes a lock"),
    Mutant("judge-keeps-cpu-priority", "harness/child.py",
           "        gpulock.yield_cpu()\n", "        pass\n",
           ("tests/test_gpulock.py::test_verification_judge_yields_the_cpu_to_timings",),
           "verifications compete with a parallel problem's timing for the CPU and slow its "
           "wall-clock bound (a 2.69 ms matmul timed 3.06 ms)"),
    Mutant("judge-reuses-ipc-storages", "harness/worker.py",
           "        if self.dev.type == \"cuda\":\n            _fresh_ipc()\n", "",
           ("tests/test_ipc.py",),
           "the judge reads a candidate's CUDA tensors without waiting for the work that made them "
           "(an honest kernel failed 'changed its parameter gemm.weight' on the H200)"),
    Mutant("judge-trusts-a-dead-spare", "harness/worker.py",
           "        started = c is not None and c.proc.is_alive()\n", "        started = c is not None\n",
           ("tests/test_timing_judge.py::test_a_candidate_that_kills_the_spare_does_not_fail_the_next",),
           "a candidate that kills the timing judge's spare process fails the next candidate's timing"),
    Mutant("spare-takes-two-candidates", "harness/worker.py",
           "        if self.given:\n            raise RuntimeError", "        if False:\n            raise RuntimeError",
           ("tests/test_sandbox.py::test_a_spare_candidate_process_takes_one_candidate_after_its_sandbox_report",),
           "one candidate process could be handed a second candidate after the first ran in it"),
    Mutant("roofline-bmm-counted-once", "harness/roofline.py",
           "            self.cnt.counted_flops += delta\n",
           "            delta = delta / 2 if name == \"bmm\" else delta\n            self.cnt.counted_flops += delta\n",
           ("tests/test_roofline.py",), "batched matmuls counted at half their FLOPs"),
    Mutant("rewrite-softmax-size1-2d", "codegen/rewrites/attention.py",
           "or not isinstance(dim, int) or shape[dim % len(shape)] != 1:",
           "or not isinstance(dim, int) or shape[dim % len(shape)] != 1 or len(shape) == 2:",
           ("tests/test_rewrites.py::test_softmax_size1_keeps_eager_nan_for_infinite_inputs",),
           "softmax over a size-1 dim of a 2-d tensor is not rewritten"),
    Mutant("fusion-no-half-pointwise", "codegen/fusion.py",
           "            if shape is None or not typed:\n",
           "            if shape is None or not typed or node_dtype(n) in (torch.float16, torch.bfloat16):\n",
           ("tests/test_codegen_families.py::test_low_precision_inputs",), "fp16/bf16 pointwise ops stay PyTorch's"),
    Mutant("verifier-node-no-launch-flag", "nodes/verifier.py",
           "        flags.append(\"declares Triton kernels but launched none\")\n", "        pass\n",
           ("tests/test_verifier_node.py",), "a kernel candidate that runs plain torch is not flagged"),
    # -- the twenty-first and twenty-second sessions: LLM kernels and the launch path
    Mutant("softmax-split-no-rescale", "knowledge/templates/softmax.py",
           'f"s = tl.sum(tl.where(mp == {NEG}, 0.0, sp * tl.exp(mp - mx[:, None])), 1)"',
           'f"s = tl.sum(tl.where(mp == {NEG}, 0.0, sp), 1)"',
           ("tests/test_templates.py::test_softmax_of_few_long_rows_splits_them_into_chunks",),
           "a long row's chunk sums added without rescaling to the row's max: wrong probabilities"),
    Mutant("linear-ce-softcap-not-rounded", "knowledge/templates/linear_ce.py",
           'rnd = (lambda e: f"({e}).to({ety}).to(tl.float32)") if spec.softcap_16 else (lambda e: e)',
           "rnd = (lambda e: e)",
           ("tests/test_llm_kernels.py::test_lm_head_cross_entropy_with_gemmas_logit_soft_cap",),
           "Gemma-2's soft cap in fp32 where eager rounds each step to bf16: per-token losses differ"),
    Mutant("decode-one-row-tile", "knowledge/templates/attention.py",
           '"    rt = _egg_cdiv(G * M, BR)  # row tiles per (b, kv head)"',
           '"    rt = 1  # row tiles per (b, kv head)"',
           ("tests/test_llm_kernels.py::test_decode_rows_past_a_tile_are_split_kv_programs_per_row_tile",),
           "query heads past the first row tile of a key/value head never computed"),
    Mutant("pointwise-rolled-load-sign", "knowledge/templates/pointwise.py",
           '(("a", "+", f"lo{i}"), ("b", "-", f"(lo{i} == 0)"))',
           '(("a", "-", f"lo{i}"), ("b", "+", f"(lo{i} == 0)"))',
           ("tests/test_codegen_families.py::test_pointwise_rows_of_the_inner_dim",),
           "RoPE's rotate-half reads each half's column from the wrong side of the row"),
    Mutant("runtime-swap-pairs-identity", "knowledge/templates/_runtime.py",
           "        return tl.reshape(tl.join(b, a), (RB, BLOCK))\n",
           "        return tl.reshape(tl.join(a, b), (RB, BLOCK))\n",
           ("tests/test_codegen_families.py::test_pointwise_rows_of_the_inner_dim",),
           "interleaved RoPE's pairs not swapped: the rotation is a scaling"),
    Mutant("launcher-no-alignment", "knowledge/templates/_runtime.py",
           "        return (a.dtype, a.data_ptr() % 16 == 0)\n", "        return a.dtype\n",
           ("tests/test_launch.py",),
           "a kernel compiled for 16-byte-aligned pointers launched on a misaligned view"),
    Mutant("launcher-constexpr-by-type", "knowledge/templates/_runtime.py",
           "        parts += [a if const or type(a) is int else _egg_launch_key(a)\n",
           "        parts += [_egg_launch_key(a)\n",
           ("tests/test_launch.py",),
           "a kernel compiled for one constexpr value launched for another"),
    Mutant("launcher-keywords-frozen", "knowledge/templates/_runtime.py",
           "            return kernel, kernel[grid3](*args, *[kwargs[x] if by_name else x for x, by_name in tail])\n",
           "            return kernel, kernel[grid3](*args, *[x for x, by_name in tail])\n",
           ("tests/test_launch.py",),
           "a launch passes the parameter names, not this call's keyword tensors (workspaces)"),
    Mutant("verifier-runner-uncounted", "harness/candidate_proc.py",
           "            def getitem(self, grid):\n                counter[\"n\"] += 1\n",
           "            def getitem(self, grid):\n",
           ("tests/test_launch.py::test_the_verifier_counts_a_compiled_kernel_s_runner_as_a_launch",),
           "calls whose kernels the launcher ran directly counted as calls that launched nothing"),
    Mutant("read-flush-reads-nothing", "harness/timing.py",
           "        tl.store(OUT + tl.program_id(0), tl.sum(tl.load(P + offs, mask=offs < N, other=0), axis=0))\n",
           "        tl.store(OUT + tl.program_id(0), 0)\n",
           ("tests/test_timing.py::test_device_time_read_flush_reads_every_element_and_is_left_out_by_the_same_name",),
           "the clean-L2 device time with the L2 never emptied: kernels timed warm"),
    Mutant("broadcast-memo-first-shape", "knowledge/templates/_runtime.py",
           "    key = tuple(t.shape for t in ts)\n    got = _EGG_BSHAPES.get(key)\n",
           "    key = tuple(t.shape for t in ts)[:1]\n    got = _EGG_BSHAPES.get(key)\n",
           ("tests/test_layout.py::test_broadcast_shapes_remembered_per_operand_shapes",),
           "a pointwise domain remembered for another call whose first operand had the same shape"),
    Mutant("empty-ignores-walk-order", "knowledge/templates/_runtime.py",
           "    if order == sorted(order):\n        return torch.empty(shape, dtype=dtype, device=device)\n",
           "    if True:\n        return torch.empty(shape, dtype=dtype, device=device)\n",
           ("tests/test_layout.py::test_memory_format_walk_of_the_pointwise_runtime",),
           "outputs of a channels-last walk allocated in the standard order: written at the wrong offsets"),
    Mutant("prune-mask-below-dot-tile", "knowledge/pruning.py",
           "return eff(n, b) / eff(n, min(int(b), DOT_MIN))", "return eff(n, b)",
           ("tests/test_pruning.py::test_a_decode_gemv_has_tiles_to_search",),
           "every variant of a decode GEMV pruned as masked: the tiler never tunes one"),
    Mutant("capture-reserved-names-unaliased", "harness/capture.py",
           "        if gm_reserved(head):\n", "        if False:\n",
           ("tests/test_capture.py::test_state_named_like_a_graph_module_attribute",),
           "a model with a buffer named code (an NF4 table) or a submodule named graph gets no file"),
    Mutant("emit-alias-left-in-file", "codegen/emit.py",
           'forward = re.sub(rf"\\bself\\.{ATTR_ALIAS}(\\w)", r"self.\\1", forward)',
           "forward = forward",
           ("tests/test_capture.py::test_state_named_like_a_graph_module_attribute",),
           "the file reads self._egg_attr_code, which ModelNew does not have"),
    Mutant("program-period-ignored", "codegen/rewrites/quant.py",
           "            if period:\n                return (\"take\", shape, dt, si, ii, dim, False, period)\n",
           "", ("tests/test_compile_check.py::test_weights_packed_along_the_columns_are_read_once_per_pack",),
           "AWQ's column order read per column through the table: every int32 loaded once per column"),
    Mutant("program-period-block-dropped", "knowledge/templates/program.py",
           "return self.value(src, idx[:dim] + [add(mul(div(j, r), r), var(iv, r))] + idx[dim + 1:])",
           "return self.value(src, idx[:dim] + [var(iv, r)] + idx[dim + 1:])",
           ("tests/test_quant_program.py::test_the_computed_weight_is_eagers_to_the_bit",),
           "a reordering within blocks read from the first block only: a wrong weight"),
    Mutant("program-n-pack-off", "knowledge/templates/program.py",
           "            r = self._n_pack(idx) if ks else None\n",
           "            r = None\n",
           ("tests/test_compile_check.py::test_weights_packed_along_the_columns_are_read_once_per_pack",),
           "values packed along N loaded once per column, not once per pack"),
    Mutant("reduction-inner-const-off", "knowledge/templates/reduction.py",
           '    zkw = "".join(f", Z{i}=sts[{i}][4] == 0" for i in zs)\n',
           '    zkw = "".join(f", Z{i}=False" for i in zs)\n',
           ("tests/test_compile_check.py::test_an_moe_combine_reads_the_chosen_rows_as_vectors",),
           "an operand constant along the inner columns loaded per element: the gather by scalars"),
    Mutant("reduction-inner-const-always", "knowledge/templates/reduction.py",
           '    zkw = "".join(f", Z{i}=sts[{i}][4] == 0" for i in zs)\n',
           '    zkw = "".join(f", Z{i}=True" for i in zs)\n',
           ("tests/test_templates.py::test_template_matches_torch[reduction_cols_row_weights]",),
           "every operand read once per reduced index: an input varying along the columns is wrong"),
    Mutant("reduction-arg-split-last", "knowledge/templates/reduction.py",
           '                "acc_idx = " + ARG_PICK.format(a="pv", ex=ex, ix="pi", ax=ax)]\n',
           '                f"acc_idx = tl.max(tl.where(pv == {ex}, pi, -1), {ax})"]\n',
           ("tests/test_templates.py::test_max_min_of_all_negative_and_all_positive_rows[arg_split_ties_nan]",),
           "a split arg-reduction's merge takes the last chunk holding the extreme, and misses a NaN"),
    Mutant("reduction-layout-copy-unexpanded", "knowledge/templates/reduction.py",
           '(t.expand(shape) if k in {pro} else t).contiguous() "',
           't.contiguous() "',
           ("tests/test_templates.py::test_a_weight_per_reduced_index_serves_calls_as_the_module_does",),
           "a broadcast operand whose strides do not collapse copied at its own shape: the call raises"),

]


# ----------------------------------------------------------------------------- mechanics
def repo_files(root: pathlib.Path) -> list[str]:
    """The working tree's files as git sees them (tracked, and untracked ones not ignored)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (root / f).is_file()})
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but caches
        skip = {".git", "__pycache__", ".venv", ".venv-ci", ".pytest_cache", "runs"}
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not skip & set(p.relative_to(root).parts))


def copy_repo(root: pathlib.Path, dest: pathlib.Path, files: list[str]) -> None:
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)


def applies(m: Mutant, root: pathlib.Path = ROOT) -> str | None:
    """None when the mutant applies; else why not."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    n = path.read_text().count(m.original)
    if n != 1:
        return f"the original snippet occurs {n} times in {m.file} (must be exactly once)"
    if m.original == m.replacement:
        return "the replacement equals the original"
    return None


#: test runs in flight (their process groups are killed when the script is interrupted)
RUNNING: set = set()
STOP = threading.Event()


def _kill(proc: subprocess.Popen) -> None:
    """Kill the run's process group, only while its leader is not reaped (its pid is ours)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tests(tests: tuple[str, ...], cwd: pathlib.Path, timeout_s: float) -> tuple[str, float, str]:
    """(passed | failed | timeout | no tests, seconds, output tail): one pytest per selection of
    ``tests`` in ``cwd``, in order, up to the first that does not pass; ``timeout_s`` for all."""
    t0 = time.time()
    status, tail = "passed", ""
    for sel in tests:
        status, _secs, tail = _pytest(sel, cwd, timeout_s - (time.time() - t0))
        if status != "passed":
            break
    return status, time.time() - t0, tail


def _pytest(sel: str, cwd: pathlib.Path, timeout_s: float) -> tuple[str, float, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "EGG_DEVICE": "cpu",
           "PYTHONPATH": str(cwd), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", sel]
    t0 = time.time()
    if timeout_s <= 0:
        return "timeout", 0.0, ""
    if STOP.is_set():
        return "interrupted", 0.0, ""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    RUNNING.add(proc)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)  # pytest and everything it started (judges, candidates, bench jobs)
        out, _ = proc.communicate()
        return "timeout", time.time() - t0, (out or "")[-2000:]
    finally:  # (not killed after it was reaped: its pid could be another process's by then)
        RUNNING.discard(proc)
    status = "passed" if proc.returncode == 0 else "failed"
    if proc.returncode == 5:  # pytest: no test was collected: a selection that vanished
        status = "no tests"
    return status, time.time() - t0, (out or "")[-2000:]


def _failed_test(tail: str) -> str:
    for ln in tail.splitlines():
        if ln.startswith("FAILED ") or ln.startswith("ERROR "):
            return ln.split(" ", 1)[1].split(" - ")[0]
    return ""


def run_mutant(m: Mutant, root: pathlib.Path, files: list[str], timeout_s: float) -> dict:
    why = applies(m, root)
    if why:
        return {"name": m.name, "status": "no longer applies", "detail": why, "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix=f"egg-mutant-{m.name}-") as tmp:
        dest = pathlib.Path(tmp)
        copy_repo(root, dest, files)
        path = dest / m.file
        path.write_text(path.read_text().replace(m.original, m.replacement, 1))
        status, secs, tail = run_tests(m.tests, dest, timeout_s)
    status = {"failed": "killed", "passed": "survived"}.get(status, status)
    detail = _failed_test(tail) if status == "killed" else tail.strip().splitlines()[-1:] or [""]
    return {"name": m.name, "status": status, "seconds": round(secs, 1),
            "detail": detail if isinstance(detail, str) else detail[0]}


def baseline(tests: tuple[str, ...], root: pathlib.Path, files: list[str], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="egg-mutant-baseline-") as tmp:
        dest = pathlib.Path(tmp)
        copy_repo(root, dest, files)
        status, secs, tail = run_tests(tests, dest, timeout_s)
    return {"tests": tests, "status": status, "seconds": round(secs, 1),
            "detail": tail.strip().splitlines()[-1] if tail.strip() else ""}


def select(patterns: list[str] | None, table: list[Mutant] = MUTANTS) -> list[Mutant]:
    if not patterns:
        return list(table)
    chosen = [m for m in table if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(m.name, p) for m in table)]
    if unknown:
        raise SystemExit(f"no mutant named {', '.join(unknown)} (see --list)")
    return chosen


def markdown(results: list[dict], table: list[Mutant] = MUTANTS) -> str:
    by = {m.name: m for m in table}
    rows = ["| mutant | file | status | test that failed / last line | s |", "|---|---|---|---|---|"]
    for r in results:
        m = by[r["name"]]
        detail = str(r.get("detail", "")).replace("|", "\\|")
        rows.append(f"| `{m.name}` | {m.file} | {r['status']} | {detail} | {r['seconds']:g} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--check", action="store_true", help="check that every mutant applies; run nothing")
    ap.add_argument("--only", action="append", metavar="NAME", help="a mutant name or glob (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (each runs pytest)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per test run")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--markdown", metavar="FILE", help="write the results table as markdown")
    args = ap.parse_args(argv)
    chosen = select(args.only)
    if args.list:
        for m in chosen:
            print(f"{m.name:40s} {m.file:36s} {' '.join(m.tests)}\n{'':40s} {m.why}")
        return 0
    gone = [(m.name, why) for m in chosen if (why := applies(m))]
    for name, why in gone:
        print(f"NO LONGER APPLIES {name}: {why}", file=sys.stderr)
    if args.check:
        print(f"{len(chosen) - len(gone)}/{len(chosen)} mutants apply")
        return 2 if gone else 0
    files = repo_files(ROOT)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    pool = cf.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        return _run_all(pool, chosen, files, args)
    except KeyboardInterrupt:
        STOP.set()
        for proc in list(RUNNING):
            _kill(proc)
        pool.shutdown(wait=True, cancel_futures=True)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        pool.shutdown(wait=True)


def _run_all(pool, chosen: list, files: list[str], args) -> int:
    results: list[dict] = []
    broken: set[tuple[str, ...]] = set()
    if not args.no_baseline:
        sels = sorted({m.tests for m in chosen if not applies(m)})
        for b in pool.map(lambda t: baseline(t, ROOT, files, args.timeout), sels):
            print(f"baseline {' '.join(b['tests'])}: {b['status']} ({b['seconds']:g} s)", flush=True)
            if b["status"] != "passed":
                broken.add(b["tests"])
                print(f"  {b['detail']}", flush=True)
    todo = [m for m in chosen if m.tests not in broken]
    futs = {pool.submit(run_mutant, m, ROOT, files, args.timeout): m for m in todo}
    for fut in cf.as_completed(futs):
        r = fut.result()
        results.append(r)
        print(f"{r['status']:18s} {r['name']:40s} {r['seconds']:7.1f} s  {r['detail']}", flush=True)
    order = {m.name: i for i, m in enumerate(MUTANTS)}
    results.sort(key=lambda r: order[r["name"]])
    counts = {s: sum(r["status"] == s for r in results)
              for s in ("killed", "timeout", "survived", "no longer applies", "no tests")}
    print(" ".join(f"{v} {k}" for k, v in counts.items() if v) or "no mutant ran")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))
    if args.markdown:
        pathlib.Path(args.markdown).write_text(markdown(results))
    if broken:
        return 3
    if counts["no longer applies"] or counts["no tests"]:
        return 2
    return 1 if counts["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
