"""The attention function registered with transformers' ``AttentionInterface`` as ``"kvsift"``.

transformers calls it in every attention layer with the post-RoPE query ``[B, H_q, S_q, D]`` and
whatever the cache's ``update`` returned. With a :class:`KvsiftCache` those are the layer's buffers,
tagged with their layer (``cache.layer_of``), so the function knows the lengths and the policy:

- ``S_q > 1`` (prefill, or any multi-token chunk): dense causal ``kvsift.decode_attention``; after
  the first prefill of a compressing policy, the layer is compressed (``compression.compress_layer``);
- ``S_q = 1`` (a decode step): dense ``decode_attention`` over what the layer holds (the compressed
  prompt included), or LycheeDecode's mixed heads (``lycheedecode.lycheedecode_layer``).

Without a kvsift cache (``use_cache=False``, or a ``DynamicCache``) the keys are the whole sequence
and the function is plain dense causal attention through kvsift.

The attention mask is not read: transformers builds none for an implementation it has no mask
function for, and kvsift masks causally by position. Padded batches are therefore not supported
(``enable``'s generate refuses them).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from ..ops import decode_attention
from .cache import layer_of
from .compression import compress_layer
from .lycheedecode import lycheedecode_layer

ATTENTION_NAME = "kvsift"
"""The name the function is registered under (``config._attn_implementation``)."""

MAX_QUERY_ROWS = 4095
"""kvsift's decode attention takes at most this many query rows (``q_len * group``) per KV head."""


def causal_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                     stored: int, scale: Optional[float], *, kv_layout: str = "BHSD",
                     block_table: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dense causal attention of the ``S_q`` newest tokens, in chunks kvsift's kernel accepts.

    Query ``i`` of the chunk ``[s, e)`` sits at token ``len - (S_q - i)`` and sees the tokens up to it:
    ``decode_attention`` with the chunk's queries over lengths ``len - (S_q - e)`` is exactly that
    (chunked causal prefill, as in the minimal decoder). ``stored`` (host) bounds the lengths.
    ``query`` is ``[B, H_q, S_q, D]``; ``keys`` / ``values`` are ``[B, H_kv, S, D]``, or with
    ``kv_layout="HND"`` page pools read through ``block_table``. Returns ``[B, H_q, S_q, D]``.
    """
    paged = kv_layout != "BHSD"
    heads = keys.shape[1]
    q_len = query.shape[2]
    group = query.shape[1] // heads
    chunk = max(1, MAX_QUERY_ROWS // group)

    def attend(q: torch.Tensor, lens: torch.Tensor, bound: int) -> torch.Tensor:
        if not paged:
            return decode_attention(q, keys, values, lens, kv_layout="BHSD", sm_scale=scale, max_kv_length=bound)
        # The paged layouts take the queries [B, S_q, H_q, D] and answer in that layout.
        out = decode_attention(q.transpose(1, 2), keys, values, lens, kv_layout=kv_layout, block_table=block_table,
                               sm_scale=scale, max_kv_length=bound)
        return out.transpose(1, 2)

    if q_len <= chunk:
        return attend(query, lengths, stored)
    parts = []
    for start in range(0, q_len, chunk):
        end = min(start + chunk, q_len)
        behind = q_len - end  # queries after this chunk: its kv length is that much shorter
        parts.append(attend(query[:, :, start:end], lengths - behind, stored - behind))
    return torch.cat(parts, dim=2)


def kvsift_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Optional[torch.Tensor], scaling: Optional[float] = None, dropout: float = 0.0,
                     **kwargs: Any) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns ``([B, S_q, H_q, D], None)``."""
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        raise RuntimeError("kvsift.hf: the kvsift attention has no backward; run the model under torch.no_grad() "
                           "or torch.inference_mode() (generate does)")
    if dropout:
        raise ValueError(f"kvsift.hf: dropout = {dropout} is not supported (call model.eval())")
    if isinstance(attention_mask, torch.Tensor):
        # Only a caller-made 4D mask gets here (transformers makes none for "kvsift"): it cannot be honoured.
        raise ValueError("kvsift.hf: attention_mask: a 4D mask was passed; kvsift attends causally by position and "
                         "does not take masks (padded batches are not supported)")
    layer = layer_of(key)
    if layer is None:
        batch, _, seq, _ = key.shape
        lengths = torch.full((batch,), seq, dtype=torch.int32, device=key.device)
        out = causal_attention(query, key, value, lengths, seq, scaling)
        return out.transpose(1, 2), None

    policy = layer.cache.policy
    q_len = query.shape[2]
    if q_len != layer.last_update:
        raise RuntimeError(f"kvsift.hf: layer {layer.layer_idx}: {q_len} queries but the cache just received "
                           f"{layer.last_update} tokens")
    if q_len == 1 and layer.prefilled and policy.lycheedecode is not None:
        out = lycheedecode_layer(layer, query, policy.lycheedecode, scaling)
    else:
        kv = layer.attention_operands()
        out = causal_attention(query, kv["k_cache"], kv["v_cache"], layer.lengths, layer.stored, scaling,
                               kv_layout=kv["kv_layout"], block_table=kv["block_table"])
    if not layer.prefilled:
        first_prompt = layer.seen == q_len  # the prompt itself, not a continuation
        layer.prefilled = True
        keep = layer.cache.keep_queries
        if keep:
            layer.window_queries = (query if keep < 0 else query[:, :, -keep:]).contiguous()
        if first_prompt and policy.compresses:
            compress_layer(layer, policy, query, source="prefill")
    return out.transpose(1, 2), None


def register() -> None:
    """Registers :func:`kvsift_attention` as ``"kvsift"`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, kvsift_attention)


__all__ = ["ATTENTION_NAME", "MAX_QUERY_ROWS", "causal_attention", "kvsift_attention", "register"]
