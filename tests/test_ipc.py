"""The judge's side of CUDA IPC (harness.worker.CandidateProcess): every CUDA tensor a candidate
process sends is opened with the sender's event, and what the judge sends is finished first.

torch reuses a storage it still maps at the same IPC handle and offset without waiting on the
sender's event (torch.multiprocessing.reductions.rebuild_cuda_tensor). On the H200 the judge read
a candidate's 256 MB weight, sent again after load_state_dict, while the copy into it was still
running: its snapshot differed from the weight after the next call, and an honest kernel failed
"ModelNew's forward changed its parameter gemm.weight". No GPU here: these tests check that the
judge forgets the cache before each receive and synchronizes before sending tensors."""
import types

import pytest
import torch
from torch.multiprocessing import reductions

from harness import worker


def _fake(dev: str, got=("ok",)):
    sent = []
    conn = types.SimpleNamespace(send=sent.append)
    watch = types.SimpleNamespace(recv=lambda what: got)
    return types.SimpleNamespace(dev=torch.device(dev), conn=conn, watch=watch), sent


@pytest.fixture
def cached():
    key = ("handle", 0)
    dict.__setitem__(reductions.shared_cache, key, object())  # as if a storage were still mapped
    yield key
    dict.pop(reductions.shared_cache, key, None)


def test_receive_on_cuda_opens_every_storage_anew(cached):
    fake, _ = _fake("cuda")
    assert worker.CandidateProcess.recv(fake, "the test") == ("ok",)
    assert cached not in reductions.shared_cache


def test_receive_on_cpu_leaves_the_cache(cached):
    fake, _ = _fake("cpu")
    worker.CandidateProcess.recv(fake, "the test")
    assert cached in reductions.shared_cache


def test_send_synchronizes_before_tensors_only(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: syncs.append(dev))
    fake, sent = _fake("cuda")
    worker.CandidateProcess.send(fake, ("round", 5, True, 7))  # no tensors: a timed round's start
    worker.CandidateProcess.send(fake, ("ack",))
    assert syncs == [] and len(sent) == 2
    worker.CandidateProcess.send(fake, ("load", {"w": torch.zeros(2)}))
    worker.CandidateProcess.send(fake, ("run", [1.0, [torch.zeros(1)]], "train", False, False, 7))
    assert len(syncs) == 2 and len(sent) == 4
    fake_cpu, _ = _fake("cpu")
    worker.CandidateProcess.send(fake_cpu, ("load", {"w": torch.zeros(2)}))
    assert len(syncs) == 2


def test_same_compares_large_tensors_in_chunks_with_the_same_verdict(monkeypatch):
    """worker._same (inputs unchanged, parameters unchanged) compares large tensors chunk by chunk
    (whole 8.6 GB inputs ran the judge out of device memory on the H200) and says what the
    whole comparison says: a difference in the last chunk, NaN against NaN, another shape."""
    monkeypatch.setattr(worker, "SAME_CHUNK", 16)
    a = torch.randn(10, 10)
    assert worker._same(a, a.clone())
    b = a.clone()
    b[-1, -1] += 1.0  # in the last, partial chunk
    assert not worker._same(a, b)
    a[3, 3] = b[3, 3] = float("nan")
    b[-1, -1] = a[-1, -1]
    assert worker._same(a, b)
    b[5, 5] = float("nan")  # NaN where a has a number
    assert not worker._same(a, b)
    assert not worker._same(a, a.clone().reshape(100))
    t = a.t()  # not contiguous: compared whole, the same verdicts
    assert worker._same(t, t.clone()) and not worker._same(t, b.t())
    ints = torch.arange(100)
    other = ints.clone()
    other[99] = 0
    assert worker._same(ints, ints.clone()) and not worker._same(ints, other)
