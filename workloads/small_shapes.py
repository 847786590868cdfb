"""Tiny-shape variants of the LLM workloads, for CPU tests and the Triton interpreter.

Each problem of workloads/llm/ keeps its shapes between the markers `# --- shapes` and
`# --- end shapes`; a variant is the same file with that block replaced by the line below, so
the operator code exists once. Write the variants out with:

    python workloads/small_shapes.py OUT_DIR       # then: egg bench OUT_DIR --device cpu
"""
from __future__ import annotations

import pathlib
import re
import sys

LLM = pathlib.Path(__file__).resolve().parent / "llm"
BLOCK = re.compile(r"(# --- shapes[^\n]*\n).*?(# --- end shapes)", re.S)

SMALL = {
    "01_rms_norm": "BATCH, SEQ, HIDDEN = 2, 8, 64",
    "02_add_rms_norm": "BATCH, SEQ, HIDDEN = 2, 8, 64",
    "03_rope": "BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 16",
    "04_swiglu": "TOKENS, INTERMEDIATE = 16, 48",
    "05_vocab_softmax": "BATCH, VOCAB = 4, 500",
    "06_gqa_decode_attention": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 2, 4, 2, 16, 64",
    "07_causal_prefill_attention": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 1, 4, 2, 16, 32",
    "08_lm_head_cross_entropy": "TOKENS, HIDDEN, VOCAB = 16, 64, 500",
    "09_decode_gemv": "BATCH, HIDDEN, INTERMEDIATE = 2, 64, 96",
    "10_rms_norm_fp32_weight": "BATCH, SEQ, HIDDEN = 2, 8, 64",
    "11_layer_norm": "TOKENS, HIDDEN = 16, 96",
    "12_gqa_decode_attention_manual": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 2, 4, 2, 16, 64",
    "13_causal_prefill_attention_manual": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 1, 4, 2, 16, 32",
    "14_rope_interleaved": "BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 16",
    "15_rms_norm_sum_div": "BATCH, SEQ, HIDDEN = 2, 8, 64",
    "16_lm_head_cross_entropy_padded": "BATCH, SEQ, HIDDEN, VOCAB, PAD = 2, 8, 64, 500, 3",
    "17_sdpa_repeated_kv_decode": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 2, 4, 2, 16, 64",
    "18_rope_complex": "BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 16",
    "19_gqa_decode_einsum": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, CACHE_LEN = 2, 4, 2, 16, 64",
    "20_lm_head_token_logprobs": "TOKENS, HIDDEN, VOCAB = 16, 64, 500",
    "21_softcap_prefill_attention": "BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, SEQ = 1, 4, 2, 16, 32",
    "22_int8_weight_only_decode": "BATCH, HIDDEN, INTERMEDIATE = 2, 64, 96",
    "23_mqa_decode_broadcast": "BATCH, Q_HEADS, HEAD_DIM, CACHE_LEN = 2, 5, 16, 64",
    "24_gemma_softcap_lm_head_loss": "TOKENS, HIDDEN, VOCAB = 16, 64, 500",
    "25_qk_norm": "BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 16",
    "26_partial_rope": "BATCH, HEADS, SEQ, HEAD_DIM, ROTARY_DIM = 2, 4, 8, 32, 16",
    "27_geglu_fused_gate_up": "TOKENS, INTERMEDIATE = 16, 48",
    "28_sampling_probs_argmax": "BATCH, VOCAB = 4, 500",
    "29_top_p_filter": "BATCH, VOCAB = 4, 500",
    "30_repetition_penalty": "BATCH, VOCAB, GENERATED = 4, 500, 24",
    "31_sliding_window_prefill_attention": "BATCH, HEADS, SEQ, HEAD_DIM, WINDOW = 1, 4, 32, 16, 8",
    "32_layer_norm_no_bias": "TOKENS, HIDDEN = 16, 96",
    "33_gemma_rms_norm": "BATCH, SEQ, HIDDEN = 2, 8, 64",
    "34_embedding_scale": "BATCH, SEQ, VOCAB, HIDDEN = 2, 8, 500, 64",
    "35_moe_topk_combine": "TOKENS, EXPERTS, TOP_K, HIDDEN = 16, 8, 2, 64",
    "36_padded_decode_attention": "BATCH, HEADS, CACHE_LEN, HEAD_DIM = 2, 4, 64, 16",
    "37_int4_groupwise_gemv": "BATCH, HIDDEN, INTERMEDIATE, GROUP = 2, 64, 96, 32",
    "39_gptq_int4_matmul": "BATCH, HIDDEN, INTERMEDIATE, GROUP = 2, 64, 96, 32",
    "40_awq_int4_matmul": "BATCH, HIDDEN, INTERMEDIATE, GROUP = 2, 64, 96, 32",
    "41_dynamic_int8_quant": "TOKENS, HIDDEN = 16, 96",
    "38_qkv_split_rope": "BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 2, 8, 4, 2, 16",
}


def small_source(path: pathlib.Path, line: str | None = None) -> str:
    """The workload's source with its shapes block set to SMALL's line (or ``line``)."""
    src = path.read_text()
    line = SMALL[path.stem] if line is None else line
    out, n = BLOCK.subn(lambda m: f"{m.group(1)}{line}  # tiny: CPU tests\n{m.group(2)}", src)
    if n != 1:
        raise ValueError(f"{path.name}: expected one shapes block")
    return out


def write_small(out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for p in sorted(LLM.glob("*.py")):
        q = out / p.name
        q.write_text(small_source(p))
        paths.append(q)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help") else
                 "usage: python workloads/small_shapes.py OUT_DIR")
    print(f"wrote {len(write_small(sys.argv[1]))} problems to {sys.argv[1]}")
