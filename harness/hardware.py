"""Detect the machine and match it to a hardware profile of knowledge/hardware."""
from __future__ import annotations

import knowledge
from state.records import HardwareInfo


def detect(device: str) -> HardwareInfo:
    if device == "cpu":
        hp = knowledge.hardware_profiles()["cpu-interpreter"]
        return HardwareInfo(device="cpu", name="cpu (Triton interpreter)", profile_id=hp.id,
                            interpreter=True, arch=hp.arch)
    import torch

    props = torch.cuda.get_device_properties(0)
    hp = knowledge.match_hardware(props.name)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or (hp.smem_per_block if hp else 0)
    l2 = getattr(props, "L2_cache_size", 0) or (hp.l2_bytes if hp else 0)
    peaks = dict(hp.peak_tflops) if hp else {}
    bw = hp.mem_bandwidth_gbs if hp else 0.0
    if hp and hp.measured:  # measured ceilings beat datasheet numbers
        bw = hp.measured.get("copy_gbs", bw)
        for k in ("fp32", "tf32", "bf16"):
            if f"{k}_matmul_tflops" in hp.measured:
                peaks[k] = hp.measured[f"{k}_matmul_tflops"]
    return HardwareInfo(
        device="cuda", name=props.name, profile_id=hp.id if hp else "unknown", interpreter=False,
        sm_count=props.multi_processor_count, mem_bandwidth_gbs=bw, peak_tflops=peaks,
        smem_per_block=smem, l2_bytes=l2, arch=f"sm_{props.major}{props.minor}",
    )
