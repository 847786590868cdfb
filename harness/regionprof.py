"""Where eager's time goes, measured: each node of the captured graph timed on a real run.

The planner (policies.expert) runs this in a child process on a GPU machine
(``python -m harness.regionprof PROBLEM --device cuda``): the problem's Model is built on the
device with real inputs, captured exactly as the planner captures it (harness.capture: the same
graph breaks, so the same regions), and the graph runs node by node with CUDA events around each
node (synchronised once per run, the median over runs), holding the machine's GPU lock
exclusively as a timing does (harness.gpulock). Run node by node, a launch-bound model's nodes
add up to the interpreter's host time: they are scaled to eager's own whole call (timed with
harness.timing.bench) when their sum is above it. The output is one JSON line: per region and per node,
milliseconds. On the CPU (tests) the nodes are timed with the wall clock.

It measures the captured graph before rewrites: eager's own ops, so the shares say where eager's
time goes (a graph break's statement is timed as one node).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch import fx

#: timed runs after one warm-up run; the median per node is kept
RUNS = 5


def measure(problem_path: str, device: str = "cpu", runs: int = RUNS) -> dict:
    """{"regions": [ms...], "nodes": {name: ms}, "total_ms", "eager_ms", "interpreted_ms",
    "method"} of one problem: the nodes' times scaled to eager's whole call when they add up to
    more (the interpreter's host time between nodes)."""
    from harness import capture as C
    from harness import gpulock
    from harness.problem import build_model, load_problem
    from harness.timing import bench

    prob = load_problem(problem_path)
    dev = torch.device(device)
    init = prob.init_inputs()

    def make():
        torch.manual_seed(0)
        return build_model(prob, init, dev)

    torch.manual_seed(1)
    inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in prob.inputs()]
    cap = C.capture_model(make, inputs)
    if cap.gm is None:
        raise RuntimeError(cap.error or "no graph")
    regions = _regions(cap.gm)
    samples: dict[str, list[float]] = {}
    with torch.no_grad():
        with gpulock.hold("shared", dev.type == "cuda"):
            _Timed(cap.gm, dev).run(*inputs)  # warm-up: first-call costs stay out
        with gpulock.hold("exclusive", dev.type == "cuda"):
            for _ in range(runs):
                t = _Timed(cap.gm, dev)
                t.run(*inputs)
                for name, ms in t.times().items():
                    samples.setdefault(name, []).append(ms)
        model = make()
        with gpulock.hold("exclusive", dev.type == "cuda"):
            whole = bench(lambda: model(*inputs), dev)["median_ms"]
    nodes = {k: statistics.median(v) for k, v in samples.items()}
    per = [0.0] * (1 + max(regions.values(), default=0))
    for name, ms in nodes.items():
        per[regions.get(name, 0)] += ms
    interpreted = sum(per)
    # node by node, every node waits for the interpreter's host work: a launch-bound model's
    # nodes sum to the interpreter's time, not eager's (ResNet-18 at batch 2 on the H200: 8.6 ms
    # against eager's 2.3 ms). The shares stay the nodes'; the scale is eager's own call.
    scale = whole / interpreted if interpreted > whole > 0 else 1.0
    per = [ms * scale for ms in per]
    nodes = {k: ms * scale for k, ms in nodes.items()}
    return {"regions": per, "nodes": nodes, "total_ms": sum(per), "eager_ms": whole,
            "interpreted_ms": interpreted, "method": cap.method,
            "timer": "cuda events" if dev.type == "cuda" else "wall clock"}


def _regions(gm: fx.GraphModule) -> dict[str, int]:
    from codegen.fusion import break_regions

    return {n.name: r for n, r in break_regions(list(gm.graph.nodes)).items()}


class _Timed(fx.Interpreter):
    """Runs the graph with a timer around every computing node."""

    def __init__(self, gm, dev):
        from harness.capture import propagation_interpreter

        super().__init__(gm)
        self.dev = dev
        self._prop = propagation_interpreter(gm)  # graph breaks, the root module reference
        self.marks: list[tuple[str, object, object]] = []

    def run_node(self, n):
        if n.op not in ("call_function", "call_method", "call_module"):
            return super().run_node(n)
        if self.dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = super().run_node(n)
            b.record()
        else:
            a = time.perf_counter()
            out = super().run_node(n)
            b = time.perf_counter()
        self.marks.append((n.name, a, b))
        return out

    def get_attr(self, target, args, kwargs):
        return self._prop.get_attr(target, args, kwargs)

    def call_function(self, target, args, kwargs):
        return self._prop.call_function(target, args, kwargs)

    def times(self) -> dict[str, float]:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            return {name: a.elapsed_time(b) for name, a, b in self.marks}
        return {name: (b - a) * 1e3 for name, a, b in self.marks}


def measure_in_child(problem_path: str, device: str, timeout_s: float) -> dict | None:
    """``measure`` in a child process (its own CUDA context, killed at ``timeout_s``); None when
    it fails or runs out of time (the planner keeps its estimate)."""
    import subprocess

    from harness.runner import child_env

    try:
        r = subprocess.run([sys.executable, "-m", "harness.regionprof", str(problem_path),
                            "--device", device], capture_output=True, text=True,
                           timeout=timeout_s, env=child_env(device))
    except subprocess.TimeoutExpired:
        return None
    for ln in reversed(r.stdout.splitlines()):
        try:
            out = json.loads(ln)
        except ValueError:
            continue
        return out if isinstance(out, dict) and "regions" in out else None
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--runs", type=int, default=RUNS)
    a = ap.parse_args(argv)
    try:
        out = measure(a.problem, a.device, a.runs)
    except Exception as e:  # noqa: BLE001 - the planner falls back to its estimate
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
