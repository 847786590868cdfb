"""harness.tuning_cache: keys, hits, atomic and concurrent writes."""
import json
import multiprocessing as mp

from harness.tuning_cache import TuningCache, make_key, resolve_path


def test_key_separates_gpu_model_dtype_shapes_and_code():
    k = make_key("pointwise", {"numel": 1024}, "bf16", "NVIDIA H200 (sm_90)", "code")
    assert k == make_key("pointwise", {"numel": 1024}, "bf16", "NVIDIA H200 (sm_90)", "code")
    others = [make_key("pointwise", {"numel": 1024}, "bf16", "NVIDIA H100 80GB HBM3 (sm_90)", "code"),
              make_key("pointwise", {"numel": 1024}, "fp32", "NVIDIA H200 (sm_90)", "code"),
              make_key("pointwise", {"numel": 2048}, "bf16", "NVIDIA H200 (sm_90)", "code"),
              make_key("pointwise", {"numel": 1024}, "bf16", "NVIDIA H200 (sm_90)", "other code"),
              make_key("reduction", {"numel": 1024}, "bf16", "NVIDIA H200 (sm_90)", "code")]
    assert len({k, *others}) == 6
    assert "H200" in k and "bf16" in k and "triton-" in k


def test_put_get_and_persistence(tmp_path):
    path = tmp_path / "sub" / "tuning.json"
    c = TuningCache(path)
    assert c.get("k") is None
    c.put("k", {"BLOCK": 2048, "num_warps": 8}, ms=0.5)
    assert TuningCache(path).get("k")["config"] == {"BLOCK": 2048, "num_warps": 8}
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["entries"]["k"]["ms"] == 0.5
    path.write_text("{not json")  # a damaged file reads as empty and is replaced on write
    assert c.get("k") is None
    c.put("k2", {"BLOCK": 1}, ms=1.0)
    assert c.get("k2") is not None


def test_settings_path_and_off(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_path("") == tmp_path / ".cache" / "egg" / "tuning.json"
    assert resolve_path("off") is None
    c = TuningCache(resolve_path("off"))
    c.put("k", {"BLOCK": 1})
    assert not c.enabled and c.get("k") is None


def _writer(path: str, who: int, n: int) -> None:
    c = TuningCache(path)
    for i in range(n):
        c.put(f"w{who}-{i}", {"BLOCK": 256 * (i + 1)}, ms=float(i))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = str(tmp_path / "tuning.json")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    entries = TuningCache(path).entries()
    assert len(entries) == 60
    assert entries["w3-14"]["config"] == {"BLOCK": 256 * 15}
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".tuning-")]  # no temp files left
