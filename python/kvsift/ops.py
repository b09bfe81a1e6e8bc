"""Typed wrappers over ``torch.ops.kvsift``: the names and semantics of the C++ API (docs/ops/*.md).

Every function here calls exactly one custom op, so it traces under ``torch.compile(fullgraph=True)``
and can be captured in a CUDA graph: the values that size a launch (k, sink, recent, max_kv_length,
the sparse heads) are Python ints, the data-dependent ones (lengths, counts, block tables) tensors that
stay on the device.

Errors: kvsift checks every argument before it runs and raises ``ValueError`` naming the argument
(``kvsift.topk: invalid argument: k = -1 must be >= 0``), ``NotImplementedError`` for a value this
build does not handle (``head_dim = 96``), ``RuntimeError`` for anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional, Sequence, Tuple, Union, overload

import torch

from ._ops import ops


@dataclass(frozen=True)
class TopKParams:
    """The C++ ``kvsift::TopKParams`` without its pointers: per row, the budget and the forced ranges.

    Attributes:
        k: positions selected per row (including the forced ones), >= 0.
        sink: the first ``sink`` positions of every row are always selected.
        recent: the last ``recent`` positions of every row (of its length) are always selected.
    """

    k: int
    sink: int = 0
    recent: int = 0


class IndexSet(NamedTuple):
    """The C++ ``kvsift::IndexSet``: int32 rows of ascending positions with a count per row.

    What :func:`topk` returns and the sparse heads of :func:`decode_attention` read. A NamedTuple (not
    a dataclass) so that it passes through ``torch.compile`` and unpacks like ``torch.topk``'s result.

    Attributes:
        indices: int32 ``[..., capacity]``; entries past a row's count are -1 (from :func:`topk`).
        counts: int32 ``[...]``, the valid entries per row.
        block_size: tokens per entry: 1 for token positions, a power of two >= 16 for block ids.
    """

    indices: torch.Tensor
    counts: torch.Tensor
    block_size: int = 1


def topk(
    scores: torch.Tensor,
    k: Union[int, TopKParams],
    *,
    lengths: Optional[torch.Tensor] = None,
    per_row_k: Optional[torch.Tensor] = None,
    sink: int = 0,
    recent: int = 0,
) -> IndexSet:
    """Per-row top-k positions with ragged lengths and forced sink/recent ranges (``kvsift::topk``).

    Row ``r`` uses positions ``[0, len_r)``, ``len_r = lengths[r]`` clamped to ``[0, S]``. The first
    ``sink`` and last ``recent`` of them are always selected and count inside the budget; the rest go
    to the largest scores in between. The output is ascending (not sorted by score, unlike
    ``torch.topk``); equal scores go to the lower position; NaN ranks below every number; -0 == +0.
    ``counts[r] = max(forced, min(k_r, len_r))``.

    Args:
        scores: float32, float16 or bfloat16 ``[..., S]``, contiguous in the last dimension.
        k: the budget per row (or a :class:`TopKParams`, which then also gives sink and recent).
        lengths: optional int32 ``[...]``; ``None`` means every row has length S.
        per_row_k: optional int32 ``[...]``, a budget per row clamped to ``[0, max(k, sink + recent)]``.
        sink: forced positions at the start of each row.
        recent: forced positions at the end of each row.

    Returns:
        ``IndexSet(indices int32 [..., max(k, sink + recent)], counts int32 [...])`` on scores' device.
    """
    if isinstance(k, TopKParams):
        k, sink, recent = k.k, k.sink, k.recent
    lead = scores.shape[:-1]
    flat = scores.reshape(-1, scores.shape[-1]) if scores.dim() != 2 else scores
    flat_lengths = lengths.reshape(-1) if lengths is not None else None
    flat_k = per_row_k.reshape(-1) if per_row_k is not None else None
    indices, counts = ops.topk(flat, k, flat_lengths, flat_k, sink, recent)
    if scores.dim() != 2:
        indices = indices.reshape(*lead, indices.shape[-1])
        counts = counts.reshape(lead)
    return IndexSet(indices, counts)


KV_LAYOUTS = ("BHSD", "BSHD", "NHD", "HND")
"""The ``kv_layout`` values: contiguous ``BHSD`` / ``BSHD`` caches, paged ``NHD`` / ``HND`` pools."""


@overload
def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor, *,
    kv_layout: str = ..., block_table: Optional[torch.Tensor] = ..., sm_scale: Optional[float] = ...,
    max_kv_length: int = ..., sparse_heads: Sequence[int] = ..., index_set: Optional[IndexSet] = ...,
    return_lse: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_lengths: torch.Tensor, *,
    kv_layout: str = ..., block_table: Optional[torch.Tensor] = ..., sm_scale: Optional[float] = ...,
    max_kv_length: int = ..., sparse_heads: Sequence[int] = ..., index_set: Optional[IndexSet] = ...,
    return_lse: Literal[True],
) -> Tuple[torch.Tensor, torch.Tensor]: ...


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    *,
    kv_layout: str = "BHSD",
    block_table: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    max_kv_length: int = 0,
    sparse_heads: Sequence[int] = (),
    index_set: Optional[IndexSet] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of the ``S_q`` newest query positions over a KV cache (``kvsift::decode_attention``).

    Query position ``i`` of sequence ``b`` sits at token ``len_b - S_q + i`` and sees tokens up to it
    (causal), ``len_b = kv_lengths[b]``. Query head ``hq`` reads KV head ``hq // (H_q // H_kv)`` (GQA).
    A *retrieval* (dense) KV head attends to all of its visible tokens; a KV head listed in
    ``sparse_heads`` attends only to the entries of its row ``b * H_kv + h`` of ``index_set`` (tokens,
    or blocks of ``index_set.block_size`` tokens; entries outside the sequence are skipped). No heads
    listed: dense attention; all listed: gathered; some: LycheeDecode's mixed layer. A row with no
    visible key gives zeros and lse = -inf.

    Layouts (``kv_layout``), element type float32, float16 or bfloat16 (the same for q, K and V),
    head_dim 64, 128 or 256, the last dimension of every tensor contiguous:

    ========  =========================================  ======================
    layout    k_cache / v_cache                          q (and the output)
    ========  =========================================  ======================
    BHSD      ``[B, H_kv, S, D]`` (any strides)          ``[B, H_q, S_q, D]``
    BSHD      ``[B, S, H_kv, D]`` (any strides)          ``[B, S_q, H_q, D]``
    NHD       ``[pages, page_size, H_kv, D]``, paged     ``[B, S_q, H_q, D]``
    HND       ``[pages, H_kv, page_size, D]``, paged     ``[B, S_q, H_q, D]``
    ========  =========================================  ======================

    Args:
        q: the queries, laid out as the table says.
        k_cache: keys; for a paged cache the page pool, dense inside a page.
        v_cache: values, the same shape as k_cache (and, paged, the same page stride).
        kv_lengths: int32 ``[B]``, tokens per sequence (the queries' own tokens included).
        kv_layout: one of :data:`KV_LAYOUTS`.
        block_table: int32 ``[B, max_pages]`` physical page ids, for the paged layouts only. The CPU
            path checks every id a sequence uses; the CUDA path cannot without a host sync and trusts them.
        sm_scale: logit scale; ``None`` is ``1 / sqrt(D)``.
        max_kv_length: an upper bound on the lengths that sizes the launch (0: the cache's capacity).
        sparse_heads: KV heads that read ``index_set`` instead of the whole sequence.
        index_set: the sparse heads' keys, rows ``[B * H_kv]`` or ``[B, H_kv]`` (e.g. :func:`topk`'s result).
        return_lse: also return the natural-log softmax normaliser.

    Returns:
        ``out`` (q's shape and dtype, contiguous), or ``(out, lse)`` with lse float32 of q's shape
        without D.
    """
    indices = index_set.indices if index_set is not None else None
    counts = index_set.counts if index_set is not None else None
    block_size = index_set.block_size if index_set is not None else 1
    out, lse = ops.decode_attention(
        q, k_cache, v_cache, kv_lengths, kv_layout, block_table, sm_scale, max_kv_length,
        list(sparse_heads), indices, counts, block_size,
    )
    return (out, lse) if return_lse else out



COMPRESSION_POLICIES = ("ClusterAttn", "SnapKV", "StreamingLLM", "H2O-prefill")
"""The ``policy`` values of :class:`PromptCompressionConfig` (C++ ``kvsift::CompressionPolicy``)."""


@dataclass(frozen=True)
class PromptCompressionConfig:
    """The C++ ``kvsift::PromptCompressionConfig``: the policy, its budget and its stages' parameters.

    Fields of the other policies' stages are ignored. kvsift validates the whole config on every call
    (``validate(config, shape)``) and raises ``ValueError`` naming the field.

    Attributes:
        policy: one of :data:`COMPRESSION_POLICIES` (``"H2O"`` is accepted for ``"H2O-prefill"``).
        capacity: Cp, tokens kept per head, window included; > window.
        window: W, the observation window = the last W prompt tokens, always kept; >= 1.
        sm_scale: logit scale of the window scores; ``None`` is ``1 / sqrt(D)``.
        heads: ``"kv_head_mean"`` (one score row and compressed head per KV head: the mean of its query
            heads) or ``"query_head"`` (one per query head, the SnapKV reference; H_q heads out).
        num_block: ClusterAttn's cluster granularity, >= 1.
        theta: ClusterAttn's density threshold on the window scores (strict ``>``), >= 0.
        block_rule: ClusterAttn's block size: ``"prefix_split"`` ``ceil((L - W) / num_block)`` or
            ``"budget_split"`` ``max(1, K / num_block)``.
        radius_rule: ClusterAttn's cluster radius: ``"half_block"``, ``"budget_blocks"`` or ``"fixed"``.
        fixed_radius: tokens, for ``radius_rule="fixed"``.
        pool: SnapKV's pool before top-k: ``"max"`` (max_pool1d, except that a NaN is never the maximum)
            or ``"avg"`` (avg_pool1d, pads count as 0).
        pool_kernel: SnapKV's pool width, odd, >= 1 (1 is no pooling).
        sinks: StreamingLLM's sink tokens, in ``[0, capacity - window]``; the rest of the budget is recent.
    """

    policy: str = "ClusterAttn"
    capacity: int = 1024
    window: int = 32
    sm_scale: Optional[float] = None
    heads: str = "kv_head_mean"
    num_block: int = 128
    theta: float = 2e-3
    block_rule: str = "prefix_split"
    radius_rule: str = "half_block"
    fixed_radius: int = 0
    pool: str = "max"
    pool_kernel: int = 7
    sinks: int = 4

    @property
    def budget(self) -> int:
        """K = capacity - window: prefix tokens kept per head."""
        return self.capacity - self.window


class CompressedCache(NamedTuple):
    """What :func:`compress_prompt` returns: an ordinary contiguous cache of ``capacity`` slots.

    Attributes:
        k: the compacted keys, the input's layout with ``capacity`` slots (zero past each new length).
        v: the compacted values, like ``k``.
        lengths: int32 ``[B]``, the new length of each sequence: ``min(K, L - W) + min(W, L)``
            (``L`` when ``L <= capacity``).
        positions: int32 ``[B, H_out, capacity]``, the original position of each slot (kept prefix
            ascending, then the window), -1 past the new length. Decode continues at position ``L + t``.
    """

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    positions: torch.Tensor


def compress_prompt(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    queries: torch.Tensor,
    config: Optional[PromptCompressionConfig] = None,
    *,
    kv_layout: str = "BHSD",
    lse: Optional[torch.Tensor] = None,
) -> CompressedCache:
    """Prompt KV-cache compression of one layer (``kvsift::compress_prompt``), after prefill.

    Scores the prompt tokens with the window queries (ClusterAttn, SnapKV; all queries for H2O-prefill;
    none for StreamingLLM), selects ``K = capacity - window`` prefix tokens per head and compacts them,
    ascending, followed by the last ``window`` tokens into a fresh cache. Ragged batches in one call;
    a prompt with ``L <= capacity`` is copied whole. See docs/ops/prompt_compression.md.

    Layouts (``kv_layout``), element type float32, float16 or bfloat16 (the same for all three),
    the last dimension of every tensor contiguous:

    ========  ================================  ==================================  ===========================
    layout    k_cache / v_cache                 queries                             output k / v
    ========  ================================  ==================================  ===========================
    BHSD      ``[B, H_kv, S, D]``               ``[B, H_q, W', D]``                 ``[B, H_out, capacity, D]``
    BSHD      ``[B, S, H_kv, D]``               ``[B, W', H_q, D]``                 ``[B, capacity, H_out, D]``
    ========  ================================  ==================================  ===========================

    Args:
        k_cache: the layer's post-RoPE prompt keys; S (the capacity) > window bounds every length.
        v_cache: the values, the same shape as k_cache.
        kv_lengths: int32 ``[B]``, the prompt length L of each sequence (clamped to S).
        queries: post-RoPE queries: row ``i`` of ``W'`` (>= window) is position ``L - min(W', L) + i``
            (the last ``W'`` of each prompt); for H2O-prefill all prompt queries (``W' = S``, row i =
            position i for full-length prompts). Unused by StreamingLLM (pass any with the right heads).
        config: a :class:`PromptCompressionConfig` (default: ClusterAttn, capacity 1024, window 32).
        kv_layout: ``"BHSD"`` or ``"BSHD"``.
        lse: optional float32 ``[B, H_q, W']``, each scored query's log-sum-exp from the prefill
            (saves one pass over K).

    Returns:
        :class:`CompressedCache` ``(k, v, lengths, positions)`` on the input's device.
    """
    c = config if config is not None else PromptCompressionConfig()
    k, v, lengths, positions = ops.compress_prompt(
        k_cache, v_cache, kv_lengths, queries, c.policy, c.capacity, c.window, kv_layout, c.sm_scale, c.heads,
        lse, c.num_block, float(c.theta), c.block_rule, c.radius_rule, c.fixed_radius, c.pool, c.pool_kernel,
        c.sinks,
    )
    return CompressedCache(k, v, lengths, positions)
