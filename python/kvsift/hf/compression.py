"""Prompt compression after prefill: one ``kvsift.compress_prompt`` call per layer.

It runs inside the attention function, right after the layer's dense prefill attention: layer l's
prompt cache is not needed again before layer l's first decode step, so compressing it there frees it
while the later layers are still prefilling, and the window queries are at hand (the attention's
own post-RoPE queries). The compressed layer keeps ``seen`` (the prompt length), so the next token's
RoPE position continues at L while it is stored at slot ``capacity``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from ..ops import compress_prompt
from .policy import Policy

if TYPE_CHECKING:
    from .cache import KvsiftCacheLayer


def compress_layer(layer: "KvsiftCacheLayer", policy: Policy, queries: Optional[torch.Tensor], *, source: str) -> None:
    """Compresses the prompt held by ``layer`` in place with ``policy.compression``.

    Args:
        layer: a layer holding exactly the prompt (``stored`` = L tokens per sequence).
        policy: a compressing policy.
        queries: post-RoPE queries ``[B, H_q, W', D]`` of the last W' prompt positions (all L of them
            for H2O-prefill); unused by StreamingLLM.
        source: ``"prefill"`` or ``"fork"``, for the error message when the queries do not suffice.
    """
    config = policy.compression
    assert config is not None
    length = layer.stored
    if length <= config.capacity:
        return  # nothing to drop: compress_prompt would copy the prompt whole
    needed = length if config.policy == "H2O-prefill" else config.window
    if queries is None or queries.shape[2] < needed:
        have = 0 if queries is None else queries.shape[2]
        hint = " (make the dense cache with keep_queries=-1 for h2o, else >= the window)" if source == "fork" else ""
        raise ValueError(f"kvsift.hf: {config.policy} needs the last {needed} prompt queries, {have} were kept{hint}")
    queries = queries[:, :, queries.shape[2] - needed :]
    # compress_prompt reads contiguous tensors whose S bounds the prompt: the prompt part of the buffers
    # (paged: the prompt's pages read in order).
    keys, values = (t.contiguous() for t in layer.contiguous(length))
    out = compress_prompt(keys, values, layer.lengths, queries.contiguous(), config, kv_layout="BHSD")
    # Every sequence of the batch has length L > capacity, so every new length is the capacity:
    # known on the host, nothing read back.
    layer.replace(out.k, out.v, out.lengths, config.capacity)


__all__ = ["compress_layer"]
