"""The verification trial plan (harness.trials): what the battery covers and how shape variants
and partial changes are derived from the problem's own inputs."""
import pytest
import torch

from harness import trials as TR


def test_plan_covers_modes_grad_distributions_and_shapes():
    p = TR.plan(1)
    assert [t.index for t in p] == list(range(len(p)))
    assert p[0].mode == "train" and p[0].inputs == "own" and not p[0].variant
    assert {t.mode for t in p} == {"train", "eval"} and any(t.grad for t in p)
    assert {"recall", "partial", *TR.DISTRIBUTIONS} <= {t.inputs for t in p}
    assert {"batch", "rank", "size", "one"} <= {t.variant for t in p}
    assert [t.mode for t in p if t.variant == "one"] == ["eval"]  # train()'s batch norm refuses one
    assert sum(t.inputs == "partial" for t in p) >= 2
    # more calls than a counter can hide behind
    assert len(p) > 10
    more = TR.plan(8)
    assert sum(t.inputs in ("own", "recall") and not t.variant for t in more) >= 8


def test_same_buffer_trials_follow_a_trial_of_the_problem_s_own_shapes():
    """recall / partial write into the previous trial's buffers: never after a shape variant
    (the judge would fall back to new buffers, and the trial would test nothing)."""
    for n in (1, 5, 9):
        p = TR.plan(n)
        assert not p[0].same_buffers
        for prev, t in zip(p, p[1:]):
            if t.same_buffers:
                assert not prev.variant, (n, t)


def test_transform_scales_floating_inputs_only():
    x, idx = torch.randn(3, 4), torch.arange(3)
    y, j = TR.transform([x, idx], "negated")
    assert torch.equal(y, -x) and j is idx
    (z,) = TR.transform([x], "large")
    assert torch.equal(z, x * TR.DISTRIBUTIONS["large"])
    assert TR.transform([x], "own")[0] is x


def test_partial_change_changes_a_few_elements_in_place_with_values_of_the_tensor():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 50)
    before = x.clone()
    ptr = x.data_ptr()
    TR.partial_change([x], g)
    diff = (x != before).sum().item()
    assert x.data_ptr() == ptr and 1 <= diff <= TR.PARTIAL_ELEMENTS
    assert set(x[x != before].tolist()) <= set(before.reshape(-1).tolist())
    t = torch.randn(6, 8).t()  # not contiguous
    tb = t.clone()
    TR.partial_change([t], g)
    assert (t != tb).sum().item() >= 1


def test_other_size_is_different_and_odd_past_four():
    for n, m in ((1, 2), (2, 1), (3, 2), (4, 3), (16, 9), (257, 129), (4096, 2049)):
        assert TR.other_size(n) == m and m != n


def test_resize_changes_a_size_everywhere_it_appears():
    a, b = torch.randn(6, 10), torch.randn(10, 7)
    ma, mb = torch.randn(6, 10), torch.randn(10, 7)
    ra, rb = TR.resize([a, b], [ma, mb], 10, 6)
    assert ra.shape == (6, 6) and rb.shape == (6, 7)
    assert torch.equal(ra, a[:, :6]) and (ra @ rb).shape == (6, 7)
    ga, gb = TR.resize([a, b], [ma, mb], 10, 13)  # larger: filled from the other draw
    assert ga.shape == (6, 13) and torch.equal(ga[:, 10:], ma[:, :3])
    only = TR.resize([a, torch.randn(6, 3)], [ma, torch.randn(6, 3)], 6, 4, only_batch=True)
    assert only[0].shape == (4, 10) and only[1].shape == (4, 3)


def test_shrinking_a_size_keeps_ids_into_it_valid():
    """Token ids into a vocabulary the trial halves stay ids into it (a gather out of range is a
    device-side assert that aborts the judge on a GPU); ids already in range, other integers,
    and floats are left alone, and growing a size changes no id."""
    scores, ids = torch.randn(4, 100), torch.randint(0, 100, (4, 30))
    small = torch.randint(0, 7, (4, 5))
    lengths = torch.tensor([100, 37, 1, 64])
    s2, i2, k2, l2 = TR.resize([scores, ids, small, lengths],
                               [torch.randn(4, 100), ids, small, lengths], 100, 51)
    assert s2.shape == (4, 51) and i2.shape == ids.shape and int(i2.max()) < 51
    assert torch.equal(i2, ids % 51) and torch.equal(k2, small)
    assert torch.equal(l2, torch.tensor([49, 37, 1, 13])) and int(l2.max()) <= 51
    torch.gather(s2, 1, i2)  # valid: on the CPU an out-of-range id raises here
    big = TR.resize([scores, ids], [torch.randn(4, 100), ids], 100, 131)
    assert big[0].shape == (4, 131) and torch.equal(big[1], ids)
    neg = torch.tensor([[-1, 5]])
    assert torch.equal(TR.resize([scores, neg], [scores, neg], 100, 51)[1], neg)  # not ids


def test_index_like_inputs_are_non_negative_integers_past_one():
    """What the judge on a GPU keeps out of the one-more-leading-dim trial (its values may index
    another dim there, and an out-of-range index aborts a GPU process)."""
    assert TR.index_like(torch.randint(0, 100, (4, 30)))
    assert TR.index_like(torch.tensor([5, 37]))
    assert not TR.index_like(torch.tensor([0, 1, 1]))  # a 0/1 mask indexes nothing out of range
    assert not TR.index_like(torch.tensor([-1, 5]))
    assert not TR.index_like(torch.randn(3)) and not TR.index_like(torch.ones(3, dtype=torch.bool))
    assert not TR.index_like(torch.zeros(0, dtype=torch.long)) and not TR.index_like(3)


def test_add_rank_stacks_halves_of_the_batch():
    x, w = torch.randn(8, 5), torch.randn(5)
    rx, rw = TR.add_rank([x, w], [torch.randn(8, 5), torch.randn(5)])
    assert rx.shape == (2, 4, 5) and torch.equal(rx[1], x[4:8]) and rw is w
    one = TR.add_rank([torch.randn(1, 3)], [torch.randn(1, 3)])[0]
    assert one.shape == (2, 1, 3)


def test_varied_sizes_batch_first():
    xs = [torch.randn(16, 3, 32, 32), torch.randn(3)]
    assert TR.varied_sizes(xs) == [16, 32, 3]
    assert TR.batch_size([3, torch.randn(5, 2)]) == 5 and TR.batch_size([torch.tensor(2.0)]) is None


def test_layout_trials_give_the_same_values_in_other_memory_layouts():
    """Trials 12-13: rows padded at an odd offset (split / a slice) and the last two dims
    transposed in memory; copy_layout keeps a layout where clone() would make it contiguous."""
    p = TR.plan(1)
    assert [t.layout for t in p if t.layout] == list(TR.LAYOUTS)
    assert all(not t.variant and t.inputs == "own" for t in p if t.layout)
    for shape in ((7,), (3, 5), (2, 3, 5), (4, 1), (2, 1, 6)):
        x = torch.randn(*shape)
        for how in TR.LAYOUTS:
            y = TR.relayout(x, how)
            assert torch.equal(y, x) and y.data_ptr() != x.data_ptr(), (shape, how)
            if x.dim() >= 2:
                assert not y.is_contiguous(), (shape, how)
            if how == "padded":
                assert y.storage_offset() == TR.ROW_PAD and y.stride()[-1] == 1
                if x.dim() >= 2:
                    assert y.stride()[-2] == x.shape[-1] + TR.ROW_PAD
            c = TR.copy_layout(y)
            assert torch.equal(c, y) and c.stride() == y.stride() and c.storage_offset() == y.storage_offset()
            assert c.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
    assert TR.relayout(torch.randn(3, 4), "transposed").stride() == (1, 3)
    idx = torch.arange(6)
    assert torch.equal(TR.relayout(idx, "padded"), idx)  # integer inputs keep their values
    s = torch.tensor(2.0)
    assert torch.equal(TR.relayout(s, "padded"), s) and TR.relayout(s, "padded") is not s


def test_the_reference_of_a_layout_trial_reads_aligned_rows():
    """relayout(aligned=True): what the judge's reference run gets where the candidate gets the
    odd offset and padding: the same values, rows padded too (a .view() over the rows fails the
    same way), every row 16 bytes aligned where its length allows."""
    for dt in (torch.bfloat16, torch.float32, torch.float64):
        for n in (5, 8, 128):
            x = torch.randn(2, 3, n).to(dt)
            y, a = TR.relayout(x, "padded"), TR.relayout(x, "padded", aligned=True)
            assert y.data_ptr() % 16 != 0  # the odd offset the candidate gets
            assert torch.equal(a, x) and not a.is_contiguous() and a.stride()[-1] == 1
            assert a.data_ptr() % 16 == 0 and (a.stride()[-2] * a.element_size()) % 16 == 0
            with pytest.raises(RuntimeError):
                a.view(-1)  # as y.view(-1) raises
            with pytest.raises(RuntimeError):
                y.view(-1)
        t = TR.relayout(torch.randn(4, 6).to(dt), "transposed", aligned=True)
        assert t.data_ptr() % 16 == 0 and t.stride() == (1, 4)
    assert TR.relayout(3, "padded", aligned=True) == 3


def test_a_rank_trial_with_ids_keeps_the_inputs_the_reference_takes_on_the_cpu():
    """On a GPU, the one-more-leading-dim trial with index inputs first runs the reference on a
    CPU copy: the options where it raises (ids now indexing a shorter dim) are dropped, those
    where it runs are kept; nothing left, the trial is skipped with the reason."""
    import torch.nn as nn

    from harness.worker import _rank_opts_on_cpu

    class Gather(nn.Module):
        def forward(self, x, ids):
            return torch.gather(x, 1, ids)

    x = torch.randn(2, 3, 10)
    good = (torch.randint(0, 3, (2, 3, 10)), "ids in range")
    bad = (torch.full((2, 3, 10), 7), "ids past dim 1")
    ok, _why = _rank_opts_on_cpu(Gather(), [([x, bad[0]], bad[1]), ([x, good[0]], good[1])], "train")
    assert [d for _xs, d in ok] == ["ids in range"]
    ok, why = _rank_opts_on_cpu(Gather(), [([x, bad[0]], bad[1])], "eval")
    assert ok == [] and "raises" in why


def test_a_forward_indexing_with_its_own_positions_gets_the_cpu_check():
    """Top-p scatters its own sort indices back along dim 1: no input is an index, yet at one
    more leading dim the positions index dim 1 out of range, a device-side assert that killed
    the judge on the H100 (workload 29, once its pattern of infinities passed). The rank trial's
    CPU check now also runs for a forward that indexes with tensors; not for one that slices or
    masks."""
    import torch.nn as nn

    from harness.worker import _indexes_with_tensors

    class TopP(nn.Module):
        def forward(self, s):
            v, i = torch.sort(s)
            keep = v.softmax(-1).cumsum(-1) > 0.1
            return s.masked_fill(~keep.scatter(1, i, keep), -float("inf"))

    class Ids(nn.Module):
        def forward(self, x, i):
            return x[i] * 2

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x):
            return self.bn(x)[:, 1:] + x[x > 0].sum()

    plain = Plain()
    assert _indexes_with_tensors(TopP(), [torch.randn(2, 50)])
    assert _indexes_with_tensors(Ids(), [torch.randn(5, 3), torch.tensor([1, 2])])
    assert not _indexes_with_tensors(plain, [torch.randn(4, 3)])
    assert plain.training and torch.equal(plain.bn.running_mean, torch.zeros(3))  # state untouched
