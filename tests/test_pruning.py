"""Pruning rules and the cost model of knowledge/pruning.py: no GPU needed."""
import knowledge
from knowledge import pruning as R

H200 = R.Device(sm_count=132, smem_per_block=232448, mem_bandwidth_gbs=4260)
ROWS = {"numel": 8192 * 4096, "n_inputs": 1, "r": 4096, "inner": 1, "nrows": 8192, "rows_variant": True}


def test_masking_waste_is_pruned_and_measured():
    geo = {"numel": 1000, "n_inputs": 1}
    assert R.mask_efficiency("pointwise", {"BLOCK": 1024}, geo) < 1.0
    assert R.mask_efficiency("pointwise", {"BLOCK": 8}, {"numel": 1000}) == 1.0
    why = R.prune_reason("pointwise", {"BLOCK": 4096, "num_warps": 4}, geo, H200)
    assert why is not None and "masked" in why
    # a row of 1823 in tiles of 1024: 2 tiles, 89% useful; rows of 100 in tiles of 4096 clamp to 128
    g = {"numel": 1823 * 64, "n_inputs": 1, "r": 1823, "inner": 1, "nrows": 64, "rows_variant": True}
    assert abs(R.mask_efficiency("reduction", {"BLOCK_R": 1024, "BLOCK_O": 1}, g) - 1823 / 2048) < 1e-9
    assert R.canonical("reduction", {"BLOCK_R": 4096}, {**g, "r": 100})["BLOCK_R"] == 128


def test_register_and_shared_memory_estimates_prune_what_cannot_fit():
    big = {"BLOCK_O": 32, "BLOCK_R": 4096, "num_warps": 1, "num_stages": 2}
    res = R.resources("reduction", big, ROWS, 2)
    assert res.regs > 255
    assert "spills" in R.prune_reason("reduction", big, ROWS, H200, 2)
    mm = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4}
    geo = {"M": 4096, "N": 4096, "K": 4096}
    assert R.resources("matmul", mm, geo, 2).smem == 4 * (256 * 128 * 2) * 2
    why = R.prune_reason("matmul", {**mm, "num_warps": 32}, geo, H200, 2)
    assert why is not None and ("shared memory" in why or "spills" in why)
    ok = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    assert R.prune_reason("matmul", ok, geo, H200, 2) is None


def test_occupancy_limits():
    res = R.Resources(threads=256, elems_per_thread=4, regs=128, smem=0, step_bytes=0)
    assert R.programs_per_sm(res, H200) == 65536 // (128 * 256)  # registers bound: 2
    res = R.Resources(threads=128, elems_per_thread=4, regs=32, smem=100_000, step_bytes=0)
    assert R.programs_per_sm(res, H200) == 2  # shared memory bound
    res = R.Resources(threads=1024, elems_per_thread=4, regs=32, smem=0, step_bytes=0)
    assert R.programs_per_sm(res, H200) == 2  # warps bound: 64 / 32


def test_grid_rule_prefers_configs_that_fill_the_sms():
    space = knowledge.config_space("softmax", "sm_90", "fp32")
    geo = {"numel": 96 * 1000, "n_inputs": 1, "r": 1000, "inner": 1, "nrows": 96, "rows_variant": True}
    why = R.prune_reason("softmax", {"BLOCK_O": 4, "BLOCK_R": 1024, "num_warps": 4, "num_stages": 1,
                                     "ONE_PASS_MAX": 8192}, geo, H200, 4, space)
    assert why is not None and "smaller BLOCK_O" in why
    assert R.prune_reason("softmax", {"BLOCK_O": 1, "BLOCK_R": 1024, "num_warps": 4, "num_stages": 1,
                                      "ONE_PASS_MAX": 8192}, geo, H200, 4, space) is None


def test_rank_keeps_the_incumbent_dedupes_and_ranks_waste_last():
    space = knowledge.config_space("reduction", "sm_90", "bf16")
    base = {"BLOCK_O": 1, "BLOCK_R": 4096, "BLOCK_I": 64, "num_warps": 8, "num_stages": 2}
    kept, pruned = R.rank_space(space, base, "reduction", ROWS, H200, 2)
    cfgs = [r.config for r in kept]
    assert base in cfgs and pruned
    assert all("BLOCK_I" not in r.config or r.config["BLOCK_I"] == 64 for r in kept)  # irrelevant: fixed
    keys = [R.identity_key("reduction", c, ROWS) for c in cfgs]
    assert len(keys) == len(set(keys))
    assert [r.estimate_us for r in kept][0] <= min(r.estimate_us for r in kept) * R.TIE_FACTOR ** 2
    assert len(kept) + len(pruned) < space.size()  # BLOCK_I and clamped BLOCK_R collapse


def test_shortlist_spans_tile_shapes_and_starts_with_the_incumbent():
    space = knowledge.config_space("pointwise", "sm_90", "bf16")
    geo = {"numel": 8192 * 28672, "n_inputs": 2}
    base = {"BLOCK": 2048, "num_warps": 8}
    kept, _ = R.rank_space(space, base, "pointwise", geo, H200, 2)
    sl = R.shortlist(kept, base, 5, "pointwise", geo)
    assert sl[0] == base and len(sl) == 5
    assert len({c["BLOCK"] for c in sl}) == 5  # one per block size before repeating one


def test_device_from_hardware_profile():
    dev = R.device_of(knowledge.hardware_profiles()["h200"])
    assert dev.sm_count == 132 and dev.smem_per_block == 232448 and dev.regs_per_sm == 65536


def test_norm_configs_are_read_as_the_norm_wrapper_runs_them():
    """The norm template names its tiles BLOCK_O / ONE_MAX (whole rows) and BLOCK (the split
    kernels), not BLOCK_R: read as a reduction's BLOCK_R (1), every config of the space but the
    incumbent was "lanes idle", so the tiler never timed a norm variant (H200, 2026-12-03:
    "rules pruned 1727 (idle: 1727)" on Llama RMSNorm, left at 43% of its roofline)."""
    space = knowledge.config_space("norm", "sm_90", "bf16")
    inc = {"BLOCK_O": 1, "BLOCK": 2048, "num_warps": 8, "ONE_MAX": 4096, "SPLIT_CHUNK": 16384}
    kept, pruned = R.rank_space(space, inc, "norm", ROWS, H200, 2)
    assert len(kept) > 20 and not any("idle" in (r.pruned or "") for r in pruned)
    assert R.tile_elems("norm", inc, ROWS) == 4096 and R.programs("norm", inc, ROWS) == 8192
    two = {**inc, "BLOCK_O": 2, "ONE_MAX": 8192}
    assert R.tile_elems("norm", two, ROWS) == 8192 and R.programs("norm", two, ROWS) == 4096
    assert R.norm_tile({**inc, "BLOCK_O": 4}, ROWS) == (1, 4096, True)  # capped: 1 x 4096 <= ONE_MAX
    split = {**inc, "ONE_MAX": 2048}  # a 4096-wide row over ONE_MAX: statistics and apply kernels
    assert R.norm_tile(split, ROWS) == (1, 2048, False)
    # one pass ignores BLOCK and SPLIT_CHUNK; the split kernels ignore BLOCK_O
    assert R.identity_key("norm", inc, ROWS) == R.identity_key("norm", {**inc, "BLOCK": 512, "SPLIT_CHUNK": 8192}, ROWS)
    assert R.identity_key("norm", split, ROWS) == R.identity_key("norm", {**split, "BLOCK_O": 8}, ROWS)
    assert R.identity_key("norm", inc, ROWS) != R.identity_key("norm", split, ROWS)
    keys = [R.identity_key("norm", r.config, ROWS) for r in kept]
    assert len(keys) == len(set(keys))


def test_softmax_split_chunk_counts_through_the_chunks_it_makes():
    """SPLIT_CHUNK changes the kernel only where it cuts a two-pass row into chunks: configs
    that make the same chunks are one kernel, and the split multiplies the programs."""
    geo = {"numel": 64 * 128256, "n_inputs": 1, "r": 128256, "inner": 1, "nrows": 64, "rows_variant": True}
    base = {"BLOCK_O": 1, "BLOCK_R": 4096, "num_warps": 16, "num_stages": 2, "ONE_PASS_MAX": 8192}
    a, b = {**base, "SPLIT_CHUNK": 16384}, {**base, "SPLIT_CHUNK": 15000}  # both: 8 chunks of 16384
    assert R.softmax_splits(a, geo) == R.softmax_splits(b, geo) == 8
    assert R.identity_key("softmax", a, geo) == R.identity_key("softmax", b, geo)
    assert R.identity_key("softmax", a, geo) != R.identity_key("softmax", {**base, "SPLIT_CHUNK": 32768}, geo)
    assert R.programs("softmax", a, geo) == 64 * 8
    whole = {**base, "SPLIT_CHUNK": 1 << 62}
    assert R.programs("softmax", whole, geo) == 64
    short = {**geo, "r": 4000, "numel": 64 * 4000}  # one pass: no split whatever the chunk
    assert R.softmax_splits({**base, "SPLIT_CHUNK": 1024}, short) == 1


def test_a_decode_gemv_has_tiles_to_search():
    """A product of 4 rows runs tl.dot's least tile of 16 rows whatever the configuration: the
    mask rule judges a tile against that least tile, so the tiler gets variants of the stage-1
    tile (other columns, K steps, splits of K) to time. With the rule judging 4 of 16 rows as 75%
    waste, every variant was pruned and a decode GEMV was never tuned."""
    import knowledge.heuristics as H

    space = knowledge.config_space("matmul", "sm_90", "bf16")
    assert 16 in space.params["BLOCK_M"] and "SPLIT_K" in space.params
    geo = {"numel": 4 * 14336, "n_inputs": 2, "M": 4, "N": 14336, "K": 4096, "batch": 1}
    base = R.canonical("matmul", H.matmul_config(4, 14336, 4096, 1), geo)
    kept, _pruned = R.rank_space(space, base, "matmul", geo, H200, 2)
    others = [r.config for r in kept if r.config != base]
    assert len(others) >= 5
    assert any(c["SPLIT_K"] != base["SPLIT_K"] for c in others)
    assert any(c["BLOCK_N"] != base["BLOCK_N"] for c in others)
    assert all(c["BLOCK_M"] == 16 for c in others)  # 64 rows for 4: still waste beyond the least tile
    assert len(R.shortlist(kept, base, 6, "matmul", geo)) == 6
    # the rule still prunes what a smaller tile avoids: 100 columns in tiles of 256
    why = R.prune_reason("matmul", {"BLOCK_M": 16, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 4,
                                    "num_stages": 3}, {**geo, "N": 100}, H200, 2)
    assert why is not None and "masked" in why
