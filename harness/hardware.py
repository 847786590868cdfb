"""Detect the machine and match it to a hardware profile of knowledge/hardware.

The device itself gives the name, SM count, shared memory per block (opt-in) and L2 size; the
profile (matched on the name) gives datasheet peak rates and bandwidth. Ceilings, in order of
preference: this machine's measured peaks (harness.peaks cache), the profile's ``measured``
numbers, the profile's datasheet numbers.
"""
from __future__ import annotations

import knowledge
from state.records import HardwareInfo


def detect(device: str) -> HardwareInfo:
    if device == "cpu":
        hp = knowledge.hardware_profiles()["cpu-interpreter"]
        return HardwareInfo(device="cpu", name="cpu (Triton interpreter)", profile_id=hp.id,
                            interpreter=True, arch=hp.arch, peaks_source="none (interpreter)")
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return from_properties(props.name, props.multi_processor_count,
                           getattr(props, "shared_memory_per_block_optin", 0),
                           getattr(props, "L2_cache_size", 0), props.major, props.minor)


def from_properties(name: str, sm_count: int, smem_optin: int, l2_bytes: int, major: int,
                    minor: int, measured: dict | None = None) -> HardwareInfo:
    """HardwareInfo from device properties; ``measured`` defaults to the peaks cache."""
    from harness import peaks as PK

    hp = knowledge.match_hardware(name)
    smem = smem_optin or (hp.smem_per_block if hp else 0)
    l2 = l2_bytes or (hp.l2_bytes if hp else 0)
    peaks = dict(hp.peak_tflops) if hp else {}
    bw = hp.mem_bandwidth_gbs if hp else 0.0
    source = f"datasheet ({hp.id})" if hp else "none (unknown GPU)"
    for origin, m in ((f"profile measured ({hp.id})" if hp else "", hp.measured if hp else None),
                      ("measured here (harness.peaks)", measured if measured is not None
                       else PK.load(name))):
        if not m:
            continue
        p, b = PK.as_profile(m)
        peaks.update(p)
        bw = b or bw
        source = origin
    return HardwareInfo(
        device="cuda", name=name, profile_id=hp.id if hp else "unknown", interpreter=False,
        sm_count=sm_count, mem_bandwidth_gbs=bw, peak_tflops=peaks, smem_per_block=smem,
        l2_bytes=l2, arch=f"sm_{major}{minor}", peaks_source=source,
    )
