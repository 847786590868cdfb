"""Hardware profiles (numbers checked against the datasheets they cite), matching device names,
and the ceilings' order of preference: measured here > profile measured > datasheet."""
import json

import pytest

import knowledge
from harness import hardware, peaks


def test_profiles_load_with_sources_and_consistent_numbers():
    hps = knowledge.hardware_profiles()
    assert {"h100", "h200", "a100", "l40s", "rtx4090", "cpu-interpreter"} <= set(hps)
    for hp in hps.values():
        assert hp.sources
        if hp.interpreter:
            continue
        p = hp.peak_tflops
        assert p["bf16"] == p["fp16"] >= p["tf32"] >= p["fp32"] > 0, hp.id
        assert hp.smem_per_block < 256 * 1024 and hp.l2_bytes >= 32 * 1024 * 1024
    h100, h200, a100 = hps["h100"], hps["h200"], hps["a100"]
    assert h100.sm_count == h200.sm_count == 132 and a100.sm_count == 108
    assert h100.smem_per_block == h200.smem_per_block == 227 * 1024
    assert a100.smem_per_block == 163 * 1024
    assert (h100.mem_bandwidth_gbs, h200.mem_bandwidth_gbs, a100.mem_bandwidth_gbs) == (3350, 4800, 2039)
    assert h200.peak_tflops["bf16"] == 989 and a100.peak_tflops["tf32"] == 156
    assert hps["rtx4090"].peak_tflops["bf16"] == 165.2  # fp32 accumulate, as PyTorch uses


@pytest.mark.parametrize("name,pid", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L40S", "l40s"),
                                      ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA H100 PCIe", "h100-pcie"),
                                      ("NVIDIA A100-SXM4-40GB", "a100-40gb")])
def test_match_device_names(name, pid):
    assert knowledge.match_hardware(name).id == pid


@pytest.fixture
def peaks_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EGG_PEAKS_DIR", str(tmp_path))
    return tmp_path


def test_ceilings_prefer_measured_here(peaks_dir):
    # no cache: the profile's measured numbers (h200.yaml has some) beat the datasheet
    hw = hardware.from_properties("NVIDIA H200", 132, 232448, 62914560, 9, 0)
    assert hw.profile_id == "h200" and hw.arch == "sm_90" and hw.peaks_source.startswith("profile measured")
    assert hw.mem_bandwidth_gbs == 4260 and hw.peak_tflops["fp32"] == 51 and hw.peak_tflops["fp16"] == 989
    # a cached measurement of this GPU model wins
    path = peaks.cache_path("NVIDIA H200")
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "copy_gbs": 4300.0, "fp32_matmul_tflops": 50.5,
                                "tf32_matmul_tflops": 360.0, "bf16_matmul_tflops": 700.0,
                                "fp16_matmul_tflops": 710.0}))
    assert path.name == "peaks-nvidia-h200.json"
    hw = hardware.from_properties("NVIDIA H200", 132, 232448, 62914560, 9, 0)
    assert hw.peaks_source.startswith("measured here")
    assert hw.mem_bandwidth_gbs == 4300.0 and hw.peak_tflops["fp16"] == 710.0
    assert hw.peak_tflops["fp64"] == 67  # not measured: the datasheet's


def test_device_properties_beat_the_profile_and_unknown_gpus(peaks_dir):
    hw = hardware.from_properties("NVIDIA A100-SXM4-80GB", 108, 0, 0, 8, 0)
    assert hw.smem_per_block == 166912 and hw.l2_bytes == 41943040  # profile fills what the device lacks
    assert hw.peaks_source.startswith("datasheet") and hw.mem_bandwidth_gbs == 2039
    hw = hardware.from_properties("Some Future GPU", 200, 300000, 1 << 27, 12, 0)
    assert hw.profile_id == "unknown" and hw.peak_tflops == {} and hw.smem_per_block == 300000
    hw = hardware.from_properties("Some Future GPU", 200, 300000, 1 << 27, 12, 0,
                                  measured={"copy_gbs": 9000.0, "bf16_matmul_tflops": 2000.0})
    assert hw.mem_bandwidth_gbs == 9000.0 and hw.peak_tflops == {"bf16": 2000.0}


def test_bandwidth_is_the_better_of_copy_and_read():
    pk, bw = peaks.as_profile({"copy_gbs": 4260.0, "read_gbs": 4550.0, "tf32_matmul_tflops": 360.0})
    assert bw == 4550.0 and pk == {"tf32": 360.0}
    assert peaks.as_profile({"copy_gbs": 4260.0})[1] == 4260.0


def test_peaks_cache_ignores_garbage(peaks_dir):
    peaks.cache_path("X").write_text("not json")
    assert peaks.load("X") is None
    peaks.cache_path("X").write_text(json.dumps({"gpu": "X"}))
    assert peaks.load("X") is None  # no bandwidth: not a measurement


def test_cpu_is_the_interpreter():
    hw = hardware.detect("cpu")
    assert hw.interpreter and hw.device == "cpu" and hw.peak_tflops == {}
