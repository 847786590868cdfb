"""Kernels on operands that reach past 2**31 elements with few elements of their own, on a GPU:
the first columns of a tall bf16 matrix (ROWS x 4096, more than 2**31 elements), through a
pointwise, a reduction, a scan and a matrix-product kernel generated at small shapes, against
eager on the same view. Before the launches asked for 64-bit offsets by each operand's span
(knowledge/templates/_runtime.py _egg_far), these read other memory (32-bit offsets wrapped).

    python scripts/gpu_far_offsets.py OUT.json [ROWS]
"""
from __future__ import annotations

import json
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from codegen.pipeline import compile_problem  # noqa: E402
from harness.problem import load_problem  # noqa: E402

HEAD = "import torch\nimport torch.nn as nn\n\n"
CASES = {
    "pointwise": ("return torch.relu(x) * 2.0", None),
    "reduction": ("return x.float().sum(-1)", None),
    "scan": ("return torch.cumsum(x.float(), dim=-1)", None),
    "matmul": ("return torch.relu(x @ self.w)", "self.w = nn.Parameter(torch.randn(COLS, 64, dtype=torch.bfloat16))"),
}


class _Counted:
    """A generated kernel that records its launches (the call took the kernels)."""

    def __init__(self, kernel, name, seen):
        self.kernel, self.name, self.seen = kernel, name, seen

    def __getitem__(self, grid):
        self.seen.append(self.name)
        return self.kernel[grid]


def source(body: str, member: str | None, cols: int) -> str:
    init = f"        {member.replace('COLS', str(cols))}\n" if member else "        pass\n"
    return (HEAD + "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n" + init
            + f"    def forward(self, x):\n        {body}\n\n"
            + f"def get_inputs():\n    return [torch.randn(64, {cols}, dtype=torch.bfloat16)]\n\n"
            + "def get_init_inputs():\n    return []\n")


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 2**19 + 4096
    cols = 64
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (the CPU: the plumbing, at small ROWS)
    big = torch.randn(rows, 4096, device=dev, dtype=torch.bfloat16)
    x = big[:, :cols]
    # the last rows' values differ from the first ones': a wrapped offset reads the wrong ones
    big[-min(4096, rows // 2):, :cols] += 100.0
    res = {"rows": rows, "span": (rows - 1) * 4096 + cols, "cases": {}}
    tmp = pathlib.Path(tempfile.mkdtemp())
    for name, (body, member) in CASES.items():
        p = tmp / f"far_{name}.py"
        p.write_text(source(body, member, cols))
        prob = load_problem(p)
        comp = compile_problem(prob)
        if comp.emitted is None or not comp.emitted.groups:
            res["cases"][name] = {"error": comp.error or "no kernel"}
            continue
        gen = tmp / f"cand_{name}.py"
        gen.write_text(comp.emitted.source)
        import importlib.util

        spec = importlib.util.spec_from_file_location(f"cand_{name}", gen)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        launched = []
        for k in [k for k in vars(mod) if k.startswith("_egg_k_")]:
            setattr(mod, k, _Counted(getattr(mod, k), k, launched))
        model = prob.Model().to(dev)
        new = mod.ModelNew().to(dev)
        new.load_state_dict(model.state_dict())
        with torch.no_grad():
            ref = model(x)
            try:
                got = new(x)
                if dev == "cuda":
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - an illegal address is the wrapped offset's other face
                res["cases"][name] = {"error": f"{type(e).__name__}: {e}"[:300], "launched": launched}
                print(name, res["cases"][name], flush=True)
                break  # the CUDA context is gone after an illegal address
        err = (got.float() - ref.float()).abs().max().item()
        scale = ref.float().abs().max().item()
        res["cases"][name] = {"groups": [g["kind"] for g in comp.emitted.groups], "launched": launched,
                              "max_err": err,
                              "ref_max": scale, "ok": bool(launched) and err <= 2e-2 * max(1.0, scale)}
        print(name, res["cases"][name], flush=True)
    out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
