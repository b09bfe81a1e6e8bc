"""LycheeDecode's decode step on one layer, through kvsift's step object (``kvsift.LycheeDecode``).

kvsift's C++ policy (``LycheeDecodePolicy::decode_layer``, docs/algorithms/lycheedecode.md §3-§7),
token mode, as ``kvsift.LycheeDecode.decode_layer`` runs it:

1. attention in one launch: the layer's retrieval KV heads attend densely, its sparse KV heads only
   to the entries of their index row;
2. the retrieval heads' scores ``s_t = mean_g(q_g) . k_t`` come out of that same pass over K (score
   emission), and ``topk`` (the first ``sink`` and last ``recent`` tokens forced inside the budget)
   overwrites their index rows.

So a sparse head j reads the selection of the most recent layer in which KV head j was a retrieval
head (layer 0 at worst, which is all retrieval). The step object lives on the cache
(``KvsiftCache.index_table``); layer 0 rewrites every row, so nothing carries over between steps.
It reads contiguous and paged caches alike (``KvsiftCacheLayer.attention_operands``); nothing is
read back to the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ..lycheedecode import LycheeDecode, LycheeDecodeConfig
from .policy import LycheeDecodeOptions

if TYPE_CHECKING:
    from .cache import KvsiftCache, KvsiftCacheLayer


class StepState:
    """The cache's LycheeDecode step object and what it was sized for (batch, longest layer, device).

    ``indices`` ``[B, H_kv, budget]`` and ``counts`` ``[B, H_kv]`` are views of its index table.
    """

    def __init__(self, options: LycheeDecodeOptions, q_heads: int, head_dim: int, batch: int, max_kv_length: int,
                 device: torch.device):
        config = LycheeDecodeConfig(options.roles, num_q_heads=q_heads, head_dim=head_dim, max_batch=batch,
                                    max_kv_length=max_kv_length, selection="token", budget=options.budget,
                                    sink=options.sink, recent=options.recent)
        self.step = LycheeDecode(config, device=device)
        self.shape = (batch, q_heads, head_dim, device)
        table = self.step.table
        self.indices, self.counts = table.indices, table.counts

    def fits(self, batch: int, q_heads: int, head_dim: int, max_kv_length: int, device: torch.device) -> bool:
        return self.shape == (batch, q_heads, head_dim, device) and self.step.config.max_kv_length >= max_kv_length


def _state(cache: "KvsiftCache", layer: "KvsiftCacheLayer", query: torch.Tensor,
           options: LycheeDecodeOptions) -> StepState:
    """The step object for this step: remade at layer 0 when the batch, the shape or the longest layer
    outgrew it (its table is rewritten at layer 0 anyway)."""
    batch, q_heads, _, dim = query.shape
    longest = max(l.capacity for l in cache.layers if l.is_initialized)
    s: Optional[StepState] = cache.index_table
    if layer.layer_idx == 0 and (not isinstance(s, StepState) or not s.fits(batch, q_heads, dim, longest, query.device)):
        s = StepState(options, q_heads, dim, batch, longest, query.device)
        cache.index_table = s
    if not isinstance(s, StepState):
        raise RuntimeError(f"kvsift.hf: LycheeDecode step at layer {layer.layer_idx} before layer 0")
    return s


def lycheedecode_layer(layer: "KvsiftCacheLayer", query: torch.Tensor, options: LycheeDecodeOptions,
                       scale: Optional[float]) -> torch.Tensor:
    """One decode step of one layer: ``query`` ``[B, H_q, 1, D]`` post-RoPE; returns ``[B, H_q, 1, D]``.

    ``scale`` must be transformers' default ``1 / sqrt(D)`` (or None): the step object's scale is its
    config's, and kvsift.hf's supported models use the default.
    """
    dim = query.shape[3]
    if scale is not None and abs(scale - dim ** -0.5) > 1e-6 * dim ** -0.5:
        raise NotImplementedError(f"kvsift.hf: LycheeDecode with scaling = {scale} (only 1 / sqrt(head_dim) = "
                                  f"{dim ** -0.5})")
    state = _state(layer.cache, layer, query, options)
    kv = layer.attention_operands()
    step = state.step
    if layer.layer_idx == 0 and step.next_layer != 0:  # a step abandoned half way (an exception in a layer)
        step.restart_step()
    if layer.stored > step.config.max_kv_length:  # the op would clamp: never silently
        raise RuntimeError(f"kvsift.hf: layer {layer.layer_idx} holds {layer.stored} tokens, more than the "
                           f"LycheeDecode step was sized for ({step.config.max_kv_length}) at layer 0")
    if kv["kv_layout"] == "BHSD":
        return step.decode_layer(layer.layer_idx, query, kv["k_cache"], kv["v_cache"], layer.lengths)
    # paged: the queries and the answer are [B, 1, H_q, D]
    return step.decode_layer(layer.layer_idx, query.transpose(1, 2), kv["k_cache"], kv["v_cache"], layer.lengths,
                             kv_layout=kv["kv_layout"], block_table=kv["block_table"]).transpose(1, 2)


__all__ = ["StepState", "lycheedecode_layer"]
