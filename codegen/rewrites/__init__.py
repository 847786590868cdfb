"""Algebraic rewrites on the captured fx graph (stage 1), one module per rule family. Each rule is
general, has a principle entry in knowledge/principles (same id), and returns whether it changed
the graph. The rewritten program is verified like any candidate.

Algebraic rules (``RULES``) keep eager's values up to rounding (the verifier checks every
rewritten program under the precision contract) and NaN/Inf behaviour, and apply only to floating
tensors with shapes known from the trace. Canonical forms (``CANONICAL``, not algebra) write the
same math one way for the planner. Both lists are read here, in this order, by ``apply_all`` and
``canonicalize`` (codegen.pipeline). The families:

- ``attention``: softmax over a size-1 dim, attention written out, GQA head repeats,
  multi-head attention modules whose weights nothing reads, addmm and baddbmm as products
- ``lmhead``: LM head + cross-entropy;  ``losses``: losses decomposed; cross-entropy written as
  nll_loss of log_softmax, per-token log-probabilities by gather (with log_softmax or minus
  logsumexp) as cross_entropy
- ``rope``: rotate_half by halves or by pairs, complex-number rotations;  ``conv``: conv bias as an epilogue
- ``norms``: RMS norm and layer norm written out; batch norm, vector norms, rsqrt forms
- ``reductions``: size-1, nested, linear-reduce, softmax written out; keepdim and mean-as-sum forms
- ``scalars``: clamps, scalar chains, 0-d constants, a where's full_like fill;  ``scans``: flipped and exclusive scans
- ``einsums``: two-operand einsums that are matrix products as matmul, outer products as a
  broadcast multiply; a product's rows
  reshaped as the reshape of its left operand
- ``selects``: an index of a product's, an einsum's or a pointwise op's result taken first
- ``indexing``: gather, embedding, index_select and ``x[ids]`` as one indexed read (take)
- ``metadata``: dtype / device / shape queries, redundant upcasts, ``.values`` / ``.indices`` as [0] / [1];  ``modules``: modules to
  functionals, transformer encoder layers written out;  ``deadcode``: dead code, value copies, the same pure op computed twice;  ``common``: the helpers they share
"""
from __future__ import annotations

from torch import fx

from codegen.rewrites.attention import (addmm_as_product, attention_pattern, gqa_repeats,
                                       sdpa_flags_from_shapes,
                                       mha_weights_unused, relu_attention_pattern, softmax_size1)
from codegen.rewrites.conv import conv_bias_epilogue
from codegen.rewrites.einsums import einsum_as_matmul, einsum_outer, flattened_products, squeezes_undone
from codegen.rewrites.deadcode import common_subexpressions, drop_dead_code, drop_value_copies
from codegen.rewrites.indexing import take_pattern
from codegen.rewrites.lmhead import linear_cross_entropy_pattern
from codegen.rewrites.losses import cross_entropy_spellings, loss_decompose
from codegen.rewrites.metadata import (device_queries_from_inputs, fold_dtype_queries, fold_type_info,
                                       named_fields,
                                       redundant_upcasts, shape_queries_from_sources)
from codegen.rewrites.modules import modules_to_functionals, transformer_layers
from codegen.rewrites.norms import (batchnorm_decompose, layer_norm_pattern, rms_norm_pattern, rsqrt_forms,
                                   vector_norms)
from codegen.rewrites.quant import dequant_linear, dequant_program
from codegen.rewrites.reductions import (keepdim_reductions, linear_reduce, mean_from_sum,
                                         nest_uneven_reductions, reduction_dtypes, size1_reductions,
                                         softmax_pattern)
from codegen.rewrites.rope import complex_rotations, rotate_half_pattern, rotate_pairs_pattern
from codegen.rewrites.scalars import fold_scalar_chains, merge_clamps, scalar_constants, where_scalar_fills
from codegen.rewrites.selects import select_first
from codegen.rewrites.scans import exclusive_scans, flipped_scans


RULES = [("rw-attention", attention_pattern), ("rw-relu-attention", relu_attention_pattern),
         ("rw-mha-no-weights", mha_weights_unused),
         ("rw-linear-cross-entropy", linear_cross_entropy_pattern),
         ("rw-dequant-linear", dequant_linear), ("rw-dequant-program", dequant_program),
         ("rw-loss-decompose", loss_decompose), ("rw-rotate-half", rotate_half_pattern),
         ("rw-rotate-half", rotate_pairs_pattern),
         ("rw-conv-bias-epilogue", conv_bias_epilogue), ("rw-layer-norm", layer_norm_pattern),
         ("rw-rms-norm", rms_norm_pattern), ("rw-softmax", softmax_pattern),
         ("rw-linear-reduce", linear_reduce), ("rw-size1-reduction", size1_reductions),
         ("rw-nest-reduction", nest_uneven_reductions),
         ("rw-softmax-size1", softmax_size1), ("rw-merge-clamps", merge_clamps),
         ("rw-fold-scalar-chain", fold_scalar_chains), ("rw-select-first", select_first),
         ("rw-take", take_pattern), ("rw-dead-code", drop_dead_code)]


# rw-layer-norm before rw-rms-norm: the RMS norm of a centered value (w * (x - mu) *
# rsqrt(mean((x - mu)^2) + eps)) is a layer norm, one kernel, where the RMS form leaves the mean
# as a pass of its own


def apply_all(gm: fx.GraphModule, inputs: list | None = None) -> list[str]:
    """Apply every rule until none changes the graph (one rule's result can enable another:
    a sum over features leaves size-1 dims behind); re-propagate shapes on meta inputs."""
    applied: list[str] = []
    for _round in range(8):
        changed = False
        for rid, fn in RULES:
            if fn(gm):
                gm.graph.lint()
                changed = True
                if rid not in applied:
                    applied.append(rid)
                _propagate(gm, inputs)
        if not changed:
            break
    return applied


def _propagate(gm: fx.GraphModule, inputs: list | None) -> None:
    if inputs is None:
        return
    from harness.capture import propagate  # meta shapes; graph breaks, recurrent layers

    gm.recompile()
    propagate(gm, inputs)


CANONICAL = [transformer_layers, modules_to_functionals, named_fields, common_subexpressions, einsum_as_matmul, einsum_outer, flipped_scans, exclusive_scans, batchnorm_decompose,
             vector_norms, fold_dtype_queries, fold_type_info, device_queries_from_inputs, scalar_constants,
             where_scalar_fills,
             shape_queries_from_sources,
             drop_value_copies, reduction_dtypes, mean_from_sum, keepdim_reductions, rsqrt_forms,
             redundant_upcasts, sdpa_flags_from_shapes, gqa_repeats, addmm_as_product, flattened_products,
             cross_entropy_spellings, complex_rotations,
             squeezes_undone]


def canonicalize(gm: fx.GraphModule, inputs: list | None = None) -> bool:
    """Apply the canonical forms; re-propagate shapes (on meta inputs) if anything changed.
    True when anything changed."""
    changed = False
    for fn in CANONICAL:
        changed |= bool(fn(gm))
    gm.graph.lint()
    if changed and inputs is not None:
        from harness.capture import propagate  # meta shapes; graph breaks, recurrent layers

        gm.recompile()
        propagate(gm, inputs)
    return changed
