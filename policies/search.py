"""Measured search of launch configurations (stage 2, tiler) on the GPU.

Per kernel (coordinate descent over the fusion groups, one kernel at a time):

1. the tuning cache (harness.tuning_cache): a kernel already tuned for this template, geometry,
   dtype and GPU model takes its config from there and is not searched again;
2. the candidate space is the tuning table of knowledge/tuning for (template, arch, dtype);
3. rules prune it without any GPU time: registers and shared memory estimates, occupancy,
   masking waste, grids that leave SMs idle (knowledge.pruning, principle tile-prune-rules);
4. a cost model ranks what is left and a diverse shortlist is taken (knowledge.pruning);
5. the shortlist is compiled for the device in parallel processes without a GPU
   (harness.compile_check): compile errors, shared memory beyond the device's limit and
   register spills drop out before any timing;
6. successive halving times the survivors as whole candidates in the run's profiling process:
   every round times all remaining variants once more and keeps the faster half; the winner
   replaces the incumbent only when it is faster beyond the measured noise.

Every decision is recorded (Draft/Decline.decisions) with the principle ids behind it, and the
counts (cache hits, kernels searched, variants pruned, compiled, rejected, timed) go to the
stage context's ``stats``.
"""
from __future__ import annotations

import functools
import hashlib
import pathlib
import re
import tempfile

import knowledge
from codegen import pipeline
from codegen.emit import emit_model
from codegen.fusion import group_inputs
from codegen.ops import node_dtype, node_shape
from harness import profile as P
from harness.problem import load_problem
from harness.timing import noise_verdict
from harness.tuning_cache import TuningCache, make_key
from knowledge import pruning as R
from knowledge.schema import dtype_key
from policies.base import GRAPH_PRINCIPLE, Decline, Draft
from state import KernelConfig
from state.settings import MIN_CALL_S

PRINCIPLES = ["tile-block-size", "tile-prune-rules", "tile-grid-mapping"]
#: shortlisted variants compile-checked per kernel, as a multiple of the timed width: the
#: compile check is cheap (about a second per kernel on 16 cores) next to a timing.
COMPILE_FACTOR = 2


# ----------------------------------------------------------------------------- per kernel facts
def group_dtype(g, ins) -> tuple[str, int]:
    """(dtype name, itemsize) of the floating tensor the kernel streams most of."""
    best, best_n = None, -1
    for t in ins:
        dt = node_dtype(t)
        n = 1
        for s in node_shape(t) or ():
            n *= int(s)
        if dt is not None and dt.is_floating_point and n > best_n:
            best, best_n = dt, n
    if best is None:
        return "float32", 4
    return str(best).replace("torch.", ""), best.itemsize


def kernel_code(fplan, g) -> str:
    """The kernel's source at its default config (launch parameters are constexprs, not code),
    for the cache key; op names when the group's template cannot render here."""
    try:
        from codegen.emit import TEMPLATES, build_spec

        spec, _ins, _outs = build_spec(fplan, g)
        src = TEMPLATES[g.kind].render(spec, {}, "_egg_k", "_egg_w").kernel
        return re.sub(r"_egg_k_g\d+", "_egg_k", src)
    except Exception:  # noqa: BLE001 - templates the lead adds may not render this way
        return ",".join(fplan.nops[m].name for m in g.members)


def shapes_of(g, geo: dict) -> dict:
    return {"domain": [int(s) for s in g.domain], **{k: v for k, v in geo.items()}}


def gpu_model(hw) -> str:
    return f"{hw.name} ({hw.arch})"


class _Timings:
    """Aggregated timings of one variant over successive-halving rounds."""

    def __init__(self):
        self.samples: list[dict] = []

    def add(self, t: dict) -> None:
        self.samples.append(t)

    @property
    def median_ms(self) -> float:
        xs = sorted(s["median_ms"] for s in self.samples)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    def as_bench(self) -> dict:
        return {"median_ms": self.median_ms, "p20_ms": min(s.get("p20_ms", s["median_ms"]) for s in self.samples),
                "p80_ms": max(s.get("p80_ms", s["median_ms"]) for s in self.samples)}


def _fmt(c: dict) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in c.items()) + "}"


# ----------------------------------------------------------------------------- the search
def tile_search(policy, state, settings, base, session=None, checker=None,
                cache: TuningCache | None = None) -> Draft | Decline:
    """Tune every kernel of ``base`` (see the module doc). ``session`` (an object with
    ``time_candidate(path) -> {median_ms, p20_ms, p80_ms}``), ``checker`` (paths ->
    list[FileCheck]) and ``cache`` default to the run's profiling session, the parallel compile
    check for the run's GPU and the cache file of the settings."""
    prob = load_problem(state.problem.path)
    disabled = set(base.disabled_groups)
    # the base's kernel path replayed from a CUDA graph: so are its variants (timed alike)
    graph = GRAPH_PRINCIPLE in (base.principle_ids or [])
    fplan, _rw, err = pipeline.analyze(prob, disabled)
    if fplan is None or not fplan.groups:
        return Decline(f"nothing to tile ({err or 'no groups'})")
    hw = state.hardware
    cache = cache if cache is not None else TuningCache.from_settings(settings)
    current = {c.group_id: dict(c.params) for c in base.configs}
    templates = {c.group_id: c.template for c in base.configs}
    decisions: list[str] = []
    stats = {"cache_hits": 0, "searched": 0, "pruned": 0, "compiled": 0, "compile_rejected": 0,
             "timed": 0, "timing_s": 0.0, "start_s": 0.0, "lock_wait_s": 0.0}

    # 1) facts per kernel and the cache
    facts = []
    for g in fplan.groups:
        if g.id not in current:
            continue
        ins, _, _ = group_inputs(fplan, g)
        geo = pipeline.group_geometry(fplan, g, len(ins))
        dtype, itemsize = group_dtype(g, ins)
        template = templates.get(g.id) or g.template
        key = make_key(template, shapes_of(g, geo), dtype_key(dtype), gpu_model(hw), kernel_code(fplan, g))
        facts.append({"g": g, "geo": geo, "dtype": dtype, "itemsize": itemsize, "template": template,
                      "key": key})
    tried = _tried_configs(state)
    failed = [cfgs for cfgs, how in tried if how == "failed verification"]
    pending = []
    for f in facts:
        hit = cache.get(f["key"]) if cache.enabled else None
        gid = f["g"].id
        if hit is not None and any(cf.get(gid) == {**current[gid], **hit["config"]} != current[gid]
                                   for cf in failed):
            cache.drop([f["key"]])
            decisions.append(f"{gid}: cached {_fmt(hit['config'])} failed verification here; "
                             "dropped from the tuning cache, stage-1 configuration kept")
            continue
        if hit is not None:
            cfg = {**current[f["g"].id], **hit["config"]}
            stats["cache_hits"] += 1
            decisions.append(f"{f['g'].id}: tuning cache hit, {_fmt(cfg)}"
                             + (f" (measured {hit['ms']:.4f} ms)" if hit.get("ms") else "")
                             + " [tile-block-size]")
            current[f["g"].id] = cfg
        else:
            pending.append(f)
    base_cfgs = {c.group_id: dict(c.params) for c in base.configs}
    # where the time goes first: kernels over the ops eager spends most time on are tuned first,
    # so a run that reaches its time limit has searched those (the planner's estimate)
    weight = {g.id: g.est_ms or 0.0 for g in (state.plan.groups if state.plan else [])}
    pending.sort(key=lambda f: -weight.get(f["g"].id, 0.0))

    if not pending:
        return _finish(prob, disabled, current, base_cfgs, tried, decisions, stats, state, graph,
                       why_same="the tuning cache holds the stage-1 configurations")

    # 2) measured search of the kernels the cache does not know
    sess = session
    if sess is None:
        sess = P.session(P.session_key(settings.run_dir, state.problem.sha256, hw.device),
                         state.problem.path, hw.device, settings.timing_rep_ms, settings.profile_timeout_s)
    own_checker = checker is None
    if checker is None and getattr(settings, "search_compile_check", True):
        from harness import compile_check as CC

        checker = functools.partial(CC.check_files, jobs=getattr(settings, "compile_jobs", 0) or None,
                                    reject_spills=True, timeout_s=getattr(settings, "compile_timeout_s", 300.0),
                                    **CC.target_of(hw))
    work = pathlib.Path(settings.run_dir or tempfile.mkdtemp(prefix="egg-search-")) / "search"
    work.mkdir(parents=True, exist_ok=True)
    counter = [0]
    launched: dict[pathlib.Path, dict[str, list[str]]] = {}  # variant -> group -> its kernels

    def emit(configs: dict) -> pathlib.Path:
        p2, _, _ = pipeline.analyze(prob, disabled)  # emit_model rewrites the plan's graph
        em = emit_model(prob.source, p2, configs, "# tiling variant", graph=graph)
        tag = hashlib.sha256(repr(sorted((k, sorted(v.items())) for k, v in configs.items())).encode()).hexdigest()[:8]
        path = work / f"{state.new_candidate_id()}_v{counter[0]}_{tag}.py"
        counter[0] += 1
        path.write_text(em.source)
        launched[path] = {i["id"]: i.get("kernels", []) for i in em.groups}
        return path

    out_of_time = [False]
    # the search's own share of the time left (Settings.tile_search_share): on one H200 with 4
    # jobs a timing costs ~10 s (a candidate process each) and a search that may fill the
    # budget did, on every problem
    left0 = settings.time_left(state.started_at)
    share = float(getattr(settings, "tile_search_share", 1.0))
    #: the time left at which the search stops (None: at the budget's end)
    keep = (1.0 - share) * left0 if left0 is not None and left0 > MIN_CALL_S and share < 1.0 else None
    limit_note = (f"the search's share ({share:g}) of the {left0:.0f} s left" if keep is not None
                  else f"time limit ({settings.time_limit_s:g} s)")

    def search_left() -> float | None:
        left = settings.time_left(state.started_at)
        return left if left is None or keep is None else left - keep

    def call_limit(limit: float) -> float | None:
        """``limit`` cut to the run's budget (Settings.call_limit) and the search's share of it;
        None, and the search out of time, when too little is left to start a call."""
        got = settings.call_limit(state.started_at, float(limit))
        rest = search_left() if got is not None and keep is not None else None
        if rest is not None:
            got = None if rest < MIN_CALL_S else min(got, rest)
        out_of_time[0] = out_of_time[0] or got is None
        return got

    def timed(path: pathlib.Path) -> dict | None:
        # every call ends inside the run's budget (a search of a 4 GiB-output matmul's variants
        # took the run 70 s past its 288 s budget on the H200, into the problem's timeout)
        limit = call_limit(settings.profile_timeout_s)
        if limit is None:
            return None
        if hasattr(sess, "timeout_s"):
            sess.timeout_s = limit
        try:
            t = sess.time_candidate(str(path))
        except P.ProfileError as e:
            decisions.append(f"variant {path.name} failed to run: {str(e)[:160]}")
            return None
        stats["timed"] += 1
        for k, src in (("timing_s", "call_s"), ("start_s", "start_s"), ("lock_wait_s", "lock_wait_s")):
            stats[k] = round(stats[k] + float(t.get(src) or 0.0), 3)
        return t

    inc = _Timings()
    t0 = timed(emit(current))
    if t0 is None and out_of_time[0]:
        return Decline(f"{limit_note} reached before the search", decisions, stats=stats)
    if t0 is None:
        return Decline("the stage-1 kernels could not be re-timed for tiling", decisions, stats=stats)
    inc.add(t0)
    width = max(2, int(settings.search_width))
    to_cache: dict[str, dict] = {}
    for k, f in enumerate(pending):
        g, geo = f["g"], f["geo"]
        gid = g.id
        left = search_left()
        if out_of_time[0] or (left is not None and left <= 0):
            decisions.append(f"{limit_note} reached: {len(pending) - k} "
                             "kernel(s) keep their stage-1 configuration")
            break
        space = knowledge.config_space(f["template"], hw.arch, f["dtype"])
        if space is None:
            decisions.append(f"{gid}: no tuning table for template {f['template']} on {hw.arch}; "
                             "stage-1 configuration kept")
            continue
        stats["searched"] += 1
        dev = R.device_of(hw, dtype_key(f["dtype"]))
        incumbent = R.canonical(g.kind, current[gid], geo)
        kept, pruned = R.rank_space(space, incumbent, g.kind, geo, dev, f["itemsize"])
        stats["pruned"] += len(pruned)
        short = R.shortlist(kept, incumbent, width * COMPILE_FACTOR, g.kind, geo)
        why = _top_reasons(pruned)
        decisions.append(f"{gid}: space {f['template']}/{space.arch}/{space.dtype} has "
                         f"{len(kept) + len(pruned)} distinct configs; rules pruned {len(pruned)}"
                         f"{' (' + why + ')' if why else ''}; cost model shortlisted {len(short)} "
                         "[tile-prune-rules]")
        variants = [(c, emit({**current, gid: c})) for c in short[1:]]
        if checker is not None and variants:
            limit = call_limit(getattr(settings, "compile_timeout_s", 300.0))
            if limit is None:
                decisions.append(f"{limit_note} reached: {gid} and the "
                                 f"{len(pending) - k - 1} kernel(s) after it keep their stage-1 configuration")
                break
            results = checker([str(p) for _c, p in variants], **({"timeout_s": limit} if own_checker else {}))
            stats["compiled"] += len(variants)
            ok = []
            for (c, p), res in zip(variants, results):
                mine = set(launched.get(p, {}).get(gid) or [f"_egg_k_{gid}"])
                kres = [k for k in res.kernels if k.kernel in mine]
                good = res.ok if not kres else all(k.ok for k in kres)
                good = good and res.category not in ("run", "crash", "timeout")
                if good:
                    ok.append((c, p))
                else:
                    stats["compile_rejected"] += 1
                    decisions.append(f"{gid}: {_fmt(c)} rejected by the compile check: {res.summary()[:200]}")
            variants = ok
        variants = variants[: width - 1]
        if not variants:
            decisions.append(f"{gid}: no variant left to time; stage-1 configuration kept")
            to_cache[f["key"]] = {"config": current[gid], "ms": inc.median_ms, "searched": 0,
                                  "gpu": gpu_model(hw), "template": f["template"]}
            continue
        pool = {i: (c, p, _Timings()) for i, (c, p) in enumerate(variants)}
        rounds = 0
        while pool and not out_of_time[0]:
            rounds += 1
            for i, (c, p, tm) in list(pool.items()):
                t = timed(p)
                if t is not None:
                    tm.add(t)
                elif out_of_time[0]:
                    break
                else:  # it failed to run
                    del pool[i]
            if out_of_time[0]:
                break
            if rounds > 1:
                t = timed(emit(current))
                if t is not None:
                    inc.add(t)
            if len(pool) <= 1:
                break
            order = sorted(pool, key=lambda i: pool[i][2].median_ms)
            pool = {i: pool[i] for i in order[: max(1, len(order) // 2)]}
        # cut by the time: the variants measured so far still compete (the best of them, by the
        # same noise rule); the kernels after this one keep their stage-1 configuration
        cut = out_of_time[0]
        pool = {i: v for i, v in pool.items() if v[2].samples}
        if cut:
            decisions.append(f"{limit_note} reached while searching {gid}: "
                             + ("the variants measured so far compete, " if pool else
                                "its stage-1 configuration kept, ")
                             + f"the {len(pending) - k - 1} kernel(s) after it keep their stage-1 configuration")
        if not pool:
            if cut:
                break
            decisions.append(f"{gid}: every variant failed to run; stage-1 configuration kept")
            continue
        c, p, tm = min(pool.values(), key=lambda v: v[2].median_ms)
        verdict = noise_verdict(tm.as_bench(), inc.as_bench())
        line = (f"{gid}: successive halving over {len(variants)} variants in {rounds} rounds: "
                f"best {_fmt(c)} {tm.median_ms:.4f} ms vs incumbent {_fmt(current[gid])} "
                f"{inc.median_ms:.4f} ms: {verdict} [tile-block-size]")
        decisions.append(line)
        if verdict == "improved":
            current[gid] = c
            inc = tm
        if not cut:  # a search cut short is not what the cache promises
            to_cache[f["key"]] = {"config": current[gid], "ms": inc.median_ms, "searched": len(variants),
                                  "gpu": gpu_model(hw), "template": f["template"]}
        else:
            break
    if to_cache:
        cache.put_many(to_cache)
    return _finish(prob, disabled, current, base_cfgs, tried, decisions, stats, state, graph,
                   why_same=f"measured {stats['timed']} timings: the stage-1 configurations are "
                            "best within noise")


def _top_reasons(pruned, n: int = 3) -> str:
    from collections import Counter

    def short(reason: str) -> str:
        for key in ("spills", "shared memory", "masked", "idle", "launches more", "no program", "num_warps"):
            if key in reason:
                return key
        return reason[:30]

    return ", ".join(f"{k}: {v}" for k, v in Counter(short(r.pruned) for r in pruned).most_common(n))


def _tried_configs(state) -> list[tuple[dict, str]]:
    """Configs of earlier tiling candidates and how they ended (failed / regressed / ...)."""
    out = []
    for c in state.candidates:
        if c.stage != "tiling":
            continue
        v, t = state.verification(c.id), state.timing(c.id)
        how = "failed verification" if v is not None and not v.passed else (t.verdict if t else "pending")
        out.append(({k.group_id: dict(k.params) for k in c.configs}, how))
    return out


def _finish(prob, disabled, current, base_cfgs, tried, decisions, stats, state, graph,
            why_same) -> Draft | Decline:
    if all(current.get(k) == v for k, v in base_cfgs.items()):
        return Decline(why_same, decisions, stats=stats)
    for cfgs, how in tried:
        if all(cfgs.get(k) == v for k, v in current.items()):
            return Decline(f"the tuned configurations were tried already ({how})", decisions, stats=stats)
    fplan, _, _ = pipeline.analyze(prob, disabled)
    em = emit_model(prob.source, fplan, current,
                    f"# candidate {state.new_candidate_id()} (stage tiling, expert policy)", graph=graph)
    return Draft(source=em.source,
                 configs=[KernelConfig(group_id=i["id"], template=i["template"], params=i["config"])
                          for i in em.groups],
                 disabled_groups=sorted(disabled), kernels=em.kernels,
                 rationale="; ".join(decisions)[:2000],
                 principle_ids=list(PRINCIPLES) + ([GRAPH_PRINCIPLE] if graph else []),
                 decisions=decisions, stats=stats)
