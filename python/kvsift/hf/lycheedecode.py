"""LycheeDecode's decode step on one layer, composed from ``kvsift.decode_attention`` and ``kvsift.topk``.

kvsift's C++ policy (``LycheeDecodePolicy::decode_layer``) in torch terms, token mode
(docs/algorithms/lycheedecode.md §3-§7):

1. attention in one launch: the layer's retrieval KV heads attend densely, its sparse KV heads only
   to the entries of their index row;
2. the retrieval heads score every token with the group-mean query, ``s_t = mean_g(q_g) . k_t`` (no
   scale, no softmax: the ranking is the same), and ``topk`` (the first ``sink`` and last ``recent``
   tokens forced inside the budget) overwrites their index rows.

So a sparse head j reads the selection of the most recent layer in which KV head j was a retrieval
head (layer 0 at worst, which is all retrieval). The table lives on the cache for one step; layer 0
rewrites every row, so nothing carries over between steps.

The scores are an explicit matmul here: the C++ policy takes them from the retrieval heads'
attention pass (score emission), which the Python op does not expose yet. They are computed in
float32 over the stored tokens only; nothing is read back to the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional

import torch

from ..ops import IndexSet, decode_attention, topk
from .policy import LycheeDecodeOptions

if TYPE_CHECKING:
    from .cache import KvsiftCache, KvsiftCacheLayer


class IndexTable:
    """The index rows ``[B, H_kv, budget]`` int32 and their counts ``[B, H_kv]``, one per (sequence, KV head)."""

    def __init__(self, batch: int, kv_heads: int, budget: int, device: torch.device):
        # No initialisation needed (layer 0 writes every row before any is read); zeros keep it tidy.
        self.indices = torch.zeros(batch, kv_heads, budget, dtype=torch.int32, device=device)
        self.counts = torch.zeros(batch, kv_heads, dtype=torch.int32, device=device)
        self._rows: Dict[int, torch.Tensor] = {}

    def rows(self, layer: int, heads: List[int]) -> torch.Tensor:
        """The retrieval heads of ``layer`` as a device tensor, copied to the device once per table."""
        t = self._rows.get(layer)
        if t is None:
            t = torch.tensor(heads, dtype=torch.long, device=self.indices.device)
            self._rows[layer] = t
        return t

    def matches(self, batch: int, kv_heads: int, budget: int, device: torch.device) -> bool:
        return tuple(self.indices.shape) == (batch, kv_heads, budget) and self.indices.device == device


def _table(cache: "KvsiftCache", batch: int, options: LycheeDecodeOptions, device: torch.device) -> IndexTable:
    t = cache.index_table
    if not isinstance(t, IndexTable) or not t.matches(batch, cache.num_kv_heads, options.budget, device):
        t = IndexTable(batch, cache.num_kv_heads, options.budget, device)
        cache.index_table = t
    return t


def lycheedecode_layer(layer: "KvsiftCacheLayer", query: torch.Tensor, options: LycheeDecodeOptions,
                       scale: Optional[float]) -> torch.Tensor:
    """One decode step of one layer: ``query`` ``[B, H_q, 1, D]`` post-RoPE; returns ``[B, H_q, 1, D]``."""
    cache = layer.cache
    batch, q_heads, _, dim = query.shape
    kv_heads = cache.num_kv_heads
    group = q_heads // kv_heads
    table = _table(cache, batch, options, query.device)
    retrieval: List[int] = options.roles.retrieval_heads(layer.layer_idx)
    sparse: List[int] = options.roles.sparse_heads(layer.layer_idx)

    index_set = IndexSet(table.indices, table.counts) if sparse else None
    kv = layer.attention_operands()
    if kv["kv_layout"] == "BHSD":
        out = decode_attention(query, layer.keys, layer.values, layer.lengths, kv_layout="BHSD", sm_scale=scale,
                               max_kv_length=layer.stored, sparse_heads=sparse, index_set=index_set)
    else:  # paged: the queries and the answer are [B, 1, H_q, D]
        out = decode_attention(query.transpose(1, 2), kv["k_cache"], kv["v_cache"], layer.lengths,
                               kv_layout=kv["kv_layout"], block_table=kv["block_table"], sm_scale=scale,
                               max_kv_length=layer.stored, sparse_heads=sparse, index_set=index_set).transpose(1, 2)
    if retrieval:
        n = layer.stored
        every = len(retrieval) == kv_heads
        # The retrieval heads as a device index made once per table: indexing with a Python list would
        # copy it to the device in every step (a pageable copy, which waits for the stream).
        rows = None if every else table.rows(layer.layer_idx, retrieval)
        # group-mean query of each retrieval KV head (query head hq reads KV head hq // group)
        qbar = query[:, :, 0].reshape(batch, kv_heads, group, dim)
        qbar = (qbar if every else qbar.index_select(1, rows)).float().mean(2)              # [B, R, D]
        keys = layer.contiguous_keys(n)
        keys = keys if every else keys.index_select(1, rows)
        keys = keys.float()                                                                 # [B, R, n, D]
        scores = torch.matmul(keys, qbar.unsqueeze(-1)).squeeze(-1)        # [B, R, n]
        # Every sequence holds n tokens (no padding), so no per-row lengths are needed.
        sel = topk(scores.reshape(batch * len(retrieval), n), options.budget, sink=options.sink, recent=options.recent)
        # width = max(budget, sink + recent) = budget (make_policy checks budget >= sink + recent)
        idx = sel.indices.reshape(batch, len(retrieval), options.budget)
        cnt = sel.counts.reshape(batch, len(retrieval))
        if every:
            table.indices.copy_(idx)
            table.counts.copy_(cnt)
        else:  # only the retrieval rows: the sparse rows keep an earlier layer's selection
            table.indices.index_copy_(1, rows, idx)
            table.counts.index_copy_(1, rows, cnt)
    return out


__all__ = ["IndexTable", "lycheedecode_layer"]
