"""Which protections of the candidate sandbox (harness.sandbox) hold on this machine, on a GPU.

    python scripts/gpu_sandbox_check.py docs/results/sandbox_gpu.md [--device cuda] [--workers 4]

One call, four parts, a short table each (printed, and written as markdown to the given path):

1. the machine: uid, capabilities, kernel, Landlock ABI, seccomp, container hints, GPU;
2. a sandboxed process started the way the judge starts a candidate (``sandbox.prepare``, a
   spawned process that calls ``sandbox.enter`` before importing torch): what held, what did not
   and why (including what the GPU probe gave up to keep CUDA IPC working), then inside it:
   CUDA, a Triton kernel compiled and run there (ptxas, the C launcher, the sandbox's cache),
   and a few escapes (a write outside the scratch folder, a socket, the judge's /proc memory,
   a signal to the judge, a shell command);
3. honest candidates through ``harness.verify.verify(device="cuda")`` (CUDA IPC between the judge
   and the sandboxed candidate both ways): they must pass, and the verdict lists the sandbox;
4. the escapes of tests/verifier_cases/escapes.py through ``verify`` with the static check off:
   their side effects must not happen; and the cost: an honest verification with
   ``EGG_SANDBOX=off`` and ``auto``.

Exit code 0 when every honest candidate passed and every escape was contained. Needs only torch
and triton. ``--device cpu`` is a dry run of the plumbing on a machine without a GPU.
This module's top level imports no torch: the spawned check process must start the way a
candidate process does.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import sandbox  # noqa: E402  (standard library only)

TRITON_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)
'''


def _outside(plan: dict) -> str:
    """A file next to the scratch folder (where nothing of the candidate may be written)."""
    return os.path.join(os.path.dirname(plan["scratch"]), "egg-sandbox-check-escape")


def _inside(conn, plan: dict, kernel_file: str) -> None:
    """The check process: enter the sandbox first, then try things and report each."""
    out: dict = {}
    try:
        held, missing = sandbox.enter(plan)
        out.update(held=held, missing=missing)
    except Exception as e:  # noqa: BLE001
        out.update(held=[], missing=[f"enter raised {type(e).__name__}: {e}"])
    checks: dict = {}

    def attempt(name, fn):
        try:
            checks[name] = f"ok: {fn()}"[:200]
        except BaseException as e:  # noqa: BLE001
            checks[name] = f"refused: {type(e).__name__}: {e}"[:200]

    import torch

    dev = plan["device"]
    attempt("cuda matmul", lambda: float((torch.ones(64, 64, device=dev) @ torch.ones(64, 64, device=dev)).sum()))

    def triton_run():
        import importlib.util

        spec = importlib.util.spec_from_file_location("egg_check_kernel", kernel_file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        x = torch.zeros(1000, device=dev)
        mod.add_one[(4,)](x, 1000, BLOCK=256)
        return float(x.sum())

    attempt("triton compile+run", triton_run)
    attempt("write outside scratch", lambda: open(_outside(plan), "w").write("x"))
    attempt("write in scratch", lambda: open(os.path.join(plan["scratch"], "ok"), "w").write("x"))

    def sock():
        import socket

        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(("1.1.1.1", 53))
        return "connected"

    attempt("TCP socket out", sock)
    attempt("judge /proc mem", lambda: open(f"/proc/{plan['judge']}/mem", "rb").read(1))
    attempt("judge /proc fd link", lambda: os.readlink(f"/proc/{plan['judge']}/fd/0"))
    attempt("signal 0 to judge", lambda: os.kill(plan["judge"], 0))
    attempt("shell writes a file", lambda: (os.system("echo x > /tmp/egg-sandbox-check-shell"),
                                            os.path.exists("/tmp/egg-sandbox-check-shell")))
    out["checks"] = checks
    conn.send(json.dumps(out))


def machine() -> list[tuple[str, str]]:
    st = sandbox._status()
    rows = [("uid / euid", f"{os.getuid()} / {os.geteuid()}"),
            ("CapEff", st.get("CapEff", "?")), ("kernel", platform.release()),
            ("Landlock ABI", str(sandbox.landlock_abi())),
            ("Seccomp (this process)", st.get("Seccomp", "?")),
            ("NoNewPrivs (this process)", st.get("NoNewPrivs", "?"))]
    try:
        rows.append(("LSMs", open("/sys/kernel/security/lsm").read().strip()))
    except OSError:
        rows.append(("LSMs", "(securityfs not mounted)"))
    hints = [h for h in ("/.dockerenv", "/run/.containerenv") if os.path.exists(h)]
    try:
        cg = open("/proc/1/cgroup").read()
        hints += [w for w in ("docker", "kubepods", "containerd", "lxc") if w in cg]
    except OSError:
        pass
    rows.append(("container hints", ", ".join(hints) or "none"))
    try:
        rows.append(("uid_map", open("/proc/self/uid_map").read().split("\n")[0].strip()))
    except OSError:
        pass
    try:
        import torch

        rows.append(("torch", torch.__version__))
        if torch.cuda.is_available():
            rows.append(("GPU", torch.cuda.get_device_name()))
        rows.append(("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")))
        import triton

        rows.append(("triton", triton.__version__))
    except Exception as e:  # noqa: BLE001
        rows.append(("torch", f"{type(e).__name__}: {e}"))
    rows.append(("EGG_SANDBOX / _SKIP", f"{os.environ.get('EGG_SANDBOX', 'auto')} / "
                                        f"{os.environ.get('EGG_SANDBOX_SKIP', '')}"))
    return rows


def sandboxed_process(device: str, folder: pathlib.Path) -> dict:
    import multiprocessing as mp

    kernel = folder / "egg_check_kernel.py"
    kernel.write_text(TRITON_KERNEL)
    os.chmod(folder, 0o755)
    os.chmod(kernel, 0o644)
    plan = sandbox.prepare(device, paths=(str(kernel),))
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    t0 = time.time()
    p = ctx.Process(target=_inside, args=(b, plan, str(kernel)))
    p.start()
    b.close()
    out = {"error": "the check process sent nothing"}
    if a.poll(600):
        try:
            out = json.loads(a.recv())
        except EOFError:
            out = {"error": f"the check process died (exit code {p.exitcode})"}
    p.join(10)
    if p.is_alive():
        p.kill()
    out["start_s"] = round(time.time() - t0, 1)
    out["plan_notes"] = plan.get("notes", [])
    out["left_behind"] = sandbox.cleanup(plan)
    for f in ("/tmp/egg-sandbox-check-shell", _outside(plan)):
        if os.path.exists(f):
            out.setdefault("escaped_files", []).append(f)
            os.unlink(f)
    return out


def run_verify(cand: pathlib.Path, prob: pathlib.Path, device: str, static: bool, trials: int) -> dict:
    from harness.verify import verify

    t0 = time.time()
    res = verify(str(prob), str(cand), device=device, trials=trials, problem_source=prob.read_text(),
                 static=static, timeout_s=300)
    res["elapsed_s"] = round(time.time() - t0, 1)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=pathlib.Path, help="markdown file to write")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from tests.verifier_cases import escapes as E
    from tests.verifier_cases.cases import CANDIDATES, PROBLEMS

    t_start = time.time()
    md = [f"# The candidate sandbox on this machine ({datetime.date.today()})", "",
          f"`python scripts/gpu_sandbox_check.py {args.out} --device {args.device}`", ""]
    ok = True

    # 1. the machine
    rows = machine()
    md += ["## Machine", "", "| | |", "|---|---|"] + [f"| {k} | `{v}` |" for k, v in rows] + [""]
    for k, v in rows:
        print(f"{k:28s} {v}")

    # 2. a sandboxed process
    work = pathlib.Path(tempfile.mkdtemp(prefix="egg-sandbox-check-"))
    inside = sandboxed_process(args.device, work)
    print("\nheld:", ", ".join(inside.get("held", [])))
    notes = list(dict.fromkeys(inside.get("missing", []) + inside.get("plan_notes", [])))
    for m in notes:
        print("  not:", m)
    md += ["## Inside a sandboxed process", "",
           f"Held: `{', '.join(inside.get('held', [])) or 'nothing'}` (started in {inside.get('start_s')} s, "
           f"GPU probe included the first time)", ""]
    md += [f"- not held / note: {m}" for m in notes]
    md += ["", "| attempt | outcome | as expected |", "|---|---|---|"]
    want_ok = {"cuda matmul", "triton compile+run", "write in scratch"}  # (on --device cpu: the CPU)
    for name, got in inside.get("checks", {}).items():
        good = got.startswith("ok") if name in want_ok else (
            got.startswith("refused") or got.endswith("False)"))
        if name == "shell writes a file":
            good = "True)" not in got
        ok &= good
        md.append(f"| {name} | {got.replace('|', '/')} | {'yes' if good else '**NO**'} |")
        print(f"  {name:24s} {'ok ' if good else 'BAD'} {got[:110]}")
    if inside.get("error"):
        ok = False
        md.append(f"\n**{inside['error']}**")
        print("ERROR", inside["error"])
    if inside.get("escaped_files") or inside.get("left_behind"):
        ok = False
        md.append(f"\n**escaped: files {inside.get('escaped_files')}, processes left {inside.get('left_behind')}**")
    md.append("")

    # 3. honest candidates, 4. escapes, through verify()
    honest = [("honest_triton_pointwise", "pointwise"), ("honest_triton_reduction", "rowsum"),
              ("honest_autotune", "rowsum"), ("honest_computed_getattr", "pointwise")]
    with E.Arena(work / "arena") as arena, cf.ThreadPoolExecutor(args.workers) as pool:
        hf = [(c, pool.submit(run_verify, CANDIDATES / f"{c}.py", PROBLEMS / f"{p}.py", args.device, True, 2))
              for c, p in honest]
        ef = [(e, pool.submit(run_verify, E.candidate_path(e.candidate), E.problem_path(e.problem),
                              args.device, False, 2 if e.expect.startswith("passed") else 1))
              for e in E.ESCAPES + E.ROUTES_OFF]
        md += ["## Honest candidates through verify()", "", "| candidate | verdict | sandbox | s |", "|---|---|---|---|"]
        print()
        for c, f in hf:
            r = f.result()
            good = bool(r.get("passed")) and "seccomp" in r.get("sandbox", []) + ["seccomp"] * (args.device == "cpu")
            ok &= bool(r.get("passed"))
            verdict = "passed" if r.get("passed") else f"{r.get('category')}: {r.get('reason', '')[:150]}"
            md.append(f"| {c} | {verdict} | `{', '.join(r.get('sandbox', []))}` | {r.get('elapsed_s')} |")
            print(f"{'ok ' if good else 'BAD'} {c:28s} {verdict[:80]} | {', '.join(r.get('sandbox', []))}")
            for n in r.get("sandbox_notes", []):
                print("     note:", n[:150])
        md += ["", "## Escapes through verify() (static check off)", "",
               "| escape | verdict | contained | what went wrong |", "|---|---|---|---|"]
        for e, f in ef:
            r = f.result()
            probs = arena.problems(e, r)
            ok &= not probs
            verdict = "passed" if r.get("passed") else r.get("category", "")
            md.append(f"| {e.candidate} ({e.note}) | {verdict} | {'yes' if not probs else '**NO**'} | "
                      f"{'; '.join(probs).replace('|', '/')[:300]} |")
            print(f"{'ok ' if not probs else 'BAD'} {e.candidate:28s} {verdict:9s} {'; '.join(probs)[:150]}")
        _done = [f.result() for _, f in hf + ef]
        left = arena.token_processes()
        ok &= not left
        md += ["", f"Processes left behind after all verifications: {left or 'none'}", ""]
        print("left behind:", left or "none")

    # the cost of the sandbox: one honest verification, off then auto
    # and whether the judge may be non-dumpable on this GPU (EGG_HARDEN_JUDGE=1) with CUDA IPC
    md += ["## Cost, and a non-dumpable judge", "", "| setting | verdict | sandbox | verify() wall s |",
           "|---|---|---|---|"]
    for label, env in (("EGG_SANDBOX=off", {"EGG_SANDBOX": "off"}), ("EGG_SANDBOX=auto", {}),
                       ("auto + EGG_HARDEN_JUDGE=1", {"EGG_HARDEN_JUDGE": "1"})):
        os.environ.update(env)
        r = run_verify(CANDIDATES / "honest_triton_pointwise.py", PROBLEMS / "pointwise.py", args.device, True, 2)
        for k in env:
            os.environ.pop(k, None)
        verdict = "passed" if r.get("passed") else f"{r.get('category')}: {r.get('reason', '')[:120]}"
        md.append(f"| {label} | {verdict} | `{', '.join(r.get('sandbox', []))}` | {r.get('elapsed_s')} |")
        print(f"{label}: {verdict[:100]} in {r.get('elapsed_s')} s")
    md += ["", f"All as expected: **{'yes' if ok else 'no'}** ({time.time() - t_start:.0f} s in all)", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(md))
    print(f"\nall as expected: {'yes' if ok else 'NO'}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
