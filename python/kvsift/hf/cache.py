"""``KvsiftCache``: a transformers ``Cache`` whose layers own their K/V: contiguous ``[B, H_kv, capacity, D]``
buffers, or (``page_size=...``) page pools with a block table (``kvsift.hf.paged``).

Why not ``DynamicCache``: kvsift's ops read a cache with spare capacity and an int32 length per
sequence, and after prompt compression a layer holds fewer tokens than the model has seen (the RoPE
position keeps counting from the prompt length). So each layer keeps:

- ``keys`` / ``values``: buffers with room to grow (paged: the page pools, ``paged`` holds the block
  table); ``stored`` tokens are valid (a host int, the same
  for every sequence of the batch: transformers' generate feeds every sequence the same number of
  tokens, and padded batches are refused by ``enable``'s generate);
- ``lengths``: int32 ``[B]`` on the device, equal to ``stored``; updated in place, never read back,
  so a decode step never waits for the device;
- ``seen``: tokens the model has fed through this layer, what ``get_seq_length`` reports (the
  next token's position).

``update`` appends and returns the buffers themselves, tagged with their layer, so that the attention
function (``kvsift.hf.attention``) finds the lengths and the policy without transformers passing the
cache to it. Policies act in the attention function: compression right after a layer's prefill
attention, LycheeDecode's selection in every decode step.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .paged import PagedStore
from .policy import Policy, check_policy_for_model, make_policy

DEFAULT_RESERVE = 256
"""Spare slots a layer allocates beyond what it holds (decode steps before the next reallocation)."""


def layer_of(key: torch.Tensor) -> Optional["KvsiftCacheLayer"]:
    """The :class:`KvsiftCacheLayer` whose buffer ``key`` is, or None (no kvsift cache in use)."""
    ref = getattr(key, "_kvsift_layer", None)
    return ref() if ref is not None else None


class KvsiftCacheLayer(CacheLayerMixin):
    """One layer's K/V for :class:`KvsiftCache`: contiguous BHSD buffers with spare capacity, or a
    :class:`~kvsift.hf.paged.PagedStore` (``paged``) when the cache has a ``page_size``."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, cache: "KvsiftCache", layer_idx: int):
        super().__init__()
        self._cache = weakref.ref(cache)
        self.layer_idx = layer_idx
        self.lengths: Optional[torch.Tensor] = None
        self.stored = 0
        self.seen = 0
        self.last_update = 0            # tokens appended by the latest update (the attention's q_len)
        self.prefilled = False          # the first multi-token update (the prompt) has been attended
        self.window_queries: Optional[torch.Tensor] = None  # kept for KvsiftCache.fork
        self.paged: Optional[PagedStore] = None

    @property
    def cache(self) -> "KvsiftCache":
        c = self._cache()
        if c is None:  # the layer outlived its cache: a bug in the caller's bookkeeping
            raise RuntimeError("kvsift.hf: a cache layer was used after its KvsiftCache was freed")
        return c

    # --- storage -----------------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.device = key_states.device
        self._allocate(batch, heads, dim, key_states.dtype, key_states.shape[2] + self.cache.reserve)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=key_states.device)
        self.is_initialized = True

    def _allocate(self, batch: int, heads: int, dim: int, dtype: torch.dtype, capacity: int) -> None:
        page_size = self.cache.page_size
        if page_size is None:
            self.keys = torch.zeros(batch, heads, capacity, dim, dtype=dtype, device=self.device)
            self.values = torch.zeros_like(self.keys)
        else:
            self.paged = PagedStore(batch, heads, dim, dtype, self.device, page_size, capacity)
            self._point_at_pools()
        self._tag()

    def _point_at_pools(self) -> None:
        assert self.paged is not None
        self.keys, self.values = self.paged.keys, self.paged.values

    def _tag(self) -> None:
        # The attention function receives what update returns; the tag leads it back here.
        self.keys._kvsift_layer = weakref.ref(self)

    @property
    def capacity(self) -> int:
        if self.paged is not None:
            return self.paged.capacity
        return 0 if self.keys is None else int(self.keys.shape[2])

    def _write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        n = keys.shape[2]
        if self.paged is not None:
            self.paged.write(start, keys, values)
        else:
            self.keys[:, :, start : start + n].copy_(keys)
            self.values[:, :, start : start + n].copy_(values)

    def contiguous(self, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` tokens' keys and values, ``[B, H_kv, n, D]`` (views, or paged: copies in order)."""
        if self.paged is not None:
            return self.paged.read(n)
        return self.keys[:, :, :n], self.values[:, :, :n]

    def contiguous_keys(self, n: int) -> torch.Tensor:
        """The first ``n`` tokens' keys, ``[B, H_kv, n, D]`` (a view, or paged: a copy in order)."""
        if self.paged is not None:
            return self.paged.read_keys(n)
        return self.keys[:, :, :n]

    def attention_operands(self) -> Dict[str, Any]:
        """``k_cache``, ``v_cache``, ``kv_layout`` and ``block_table`` of ``kvsift.decode_attention`` over this layer."""
        if self.paged is not None:
            return dict(k_cache=self.paged.keys, v_cache=self.paged.values, kv_layout="HND",
                        block_table=self.paged.block_table)
        return dict(k_cache=self.keys, v_cache=self.values, kv_layout="BHSD", block_table=None)

    def replace(self, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, stored: int) -> None:
        """Installs new contents (e.g. a compressed cache), copied into buffers with spare capacity."""
        batch, heads, _, dim = keys.shape
        self._allocate(batch, heads, dim, keys.dtype, stored + self.cache.reserve)
        self._write(0, keys[:, :, :stored], values[:, :, :stored])
        self.lengths = lengths.to(dtype=torch.int32).clone()
        self.stored = stored

    def _ensure_capacity(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        if self.paged is not None:  # new pages; the written ones keep their ids
            self.paged.grow(needed + self.cache.reserve)
            self._point_at_pools()
            self._tag()
            return
        old_k, old_v = self.keys, self.values
        batch, heads, _, dim = old_k.shape
        self._allocate(batch, heads, dim, old_k.dtype, needed + self.cache.reserve)
        self.keys[:, :, : self.stored].copy_(old_k[:, :, : self.stored])
        self.values[:, :, : self.stored].copy_(old_v[:, :, : self.stored])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
        if key_states.dim() != 4 or value_states.shape != key_states.shape:
            raise ValueError(f"kvsift.hf: key_states must be [B, H_kv, S, D] with value_states alike "
                             f"(got {tuple(key_states.shape)} and {tuple(value_states.shape)})")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch = self.lengths.shape[0]
        heads, dim = (self.paged.heads, self.paged.dim) if self.paged is not None else self.keys.shape[1::2]
        if key_states.shape[0] != batch or key_states.shape[1] != heads or key_states.shape[3] != dim:
            raise ValueError(f"kvsift.hf: key_states {tuple(key_states.shape)} do not match the cache "
                             f"[{batch}, {heads}, S, {dim}] of layer {self.layer_idx} (batch, KV heads, head_dim)")
        n = key_states.shape[2]
        self._ensure_capacity(self.stored + n)
        self._write(self.stored, key_states, value_states)
        self.lengths.add_(n)  # in place on the device: no host round trip
        self.stored += n
        self.seen += n
        self.last_update = n
        return self.keys, self.values

    # --- what transformers asks --------------------------------------------------------------
    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # the name of get_max_length in earlier transformers 5.x
        return -1

    def reset(self) -> None:
        self.keys = self.values = self.lengths = self.window_queries = self.paged = None
        self.stored = self.seen = self.last_update = 0
        self.prefilled = False
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove != 0:
            raise NotImplementedError("kvsift.hf: KvsiftCache cannot be cropped (compressed layers do not keep "
                                      "what was dropped)")

    def _select(self, index: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        if self.paged is not None:
            # New pages for the selected rows: two rows that repeat one sequence must not share pages
            # they will both append to.
            index = index.to(self.device)
            keys, values = (t.index_select(0, index) for t in self.paged.read(self.stored))
            lengths = self.lengths.index_select(0, index)
            stored, seen = self.stored, self.seen
            self.replace(keys, values, lengths, stored)
            self.seen = seen
            if self.window_queries is not None:
                self.window_queries = self.window_queries.index_select(0, index)
            return
        self.keys = self.keys.index_select(0, index.to(self.keys.device))
        self.values = self.values.index_select(0, index.to(self.keys.device))
        self.lengths = self.lengths.index_select(0, index.to(self.keys.device))
        if self.window_queries is not None:
            self.window_queries = self.window_queries.index_select(0, index.to(self.keys.device))
        self._tag()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._select(torch.arange(self.lengths.shape[0], device=self.device).repeat_interleave(repeats))


class KvsiftCache(Cache):
    """A transformers ``Cache`` for kvsift's decoding policies (made by ``kvsift.hf.enable``'s generate).

    Args:
        config: the model's (text) config: ``num_hidden_layers``, ``num_key_value_heads``.
        policy: a :class:`kvsift.hf.Policy` or a name (see :func:`kvsift.hf.make_policy`).
        reserve: spare slots per layer beyond what it holds; more tokens reallocate (a copy).
        keep_queries: post-RoPE prefill queries kept per layer (the last ``keep_queries``; -1: all),
            so that :meth:`fork` can compress the same prefill under other policies.
        page_size: None for contiguous buffers; else tokens per page of a paged cache (page pools and a
            block table per layer, ``kvsift.hf.paged``; decode attention reads the pages directly).
    """

    def __init__(self, config: Any, policy: Any = "dense", *, reserve: int = DEFAULT_RESERVE, keep_queries: int = 0,
                 page_size: Optional[int] = None, **policy_options: Any):
        self.policy: Policy = make_policy(policy, **policy_options)
        self.num_layers = int(config.num_hidden_layers)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        check_policy_for_model(self.policy, self.num_layers, self.num_kv_heads)
        if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 1:
            raise ValueError(f"kvsift.hf: reserve = {reserve!r} must be an int >= 1")
        if isinstance(keep_queries, bool) or not isinstance(keep_queries, int) or keep_queries < -1:
            raise ValueError(f"kvsift.hf: keep_queries = {keep_queries!r} must be an int >= -1 (-1: all)")
        if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
            raise ValueError(f"kvsift.hf: page_size = {page_size!r} must be None or an int >= 1")
        self.reserve = reserve
        self.keep_queries = keep_queries
        self.page_size = page_size
        self._config = config
        layers: List[KvsiftCacheLayer] = []
        super().__init__(layers=layers)
        self.layers.extend(KvsiftCacheLayer(self, i) for i in range(self.num_layers))
        # LycheeDecode's index table, shared by the layers of a step (kvsift.hf.lycheedecode).
        self.index_table: Optional[Any] = None

    def __repr__(self) -> str:
        paged = "" if self.page_size is None else f", page_size={self.page_size}"
        return f"KvsiftCache(policy={self.policy.describe()!r}, layers={self.num_layers}{paged})"

    def stored_length(self, layer_idx: int = 0) -> int:
        """Tokens held by a layer (after compression: fewer than :meth:`get_seq_length`)."""
        return self.layers[layer_idx].stored

    def fork(self, policy: Any, **policy_options: Any) -> "KvsiftCache":
        """A copy of this prefilled dense cache, under another policy (one prefill, several policies).

        What ``minimal_decoder --eval-passkey`` does with ``Decoder::prefill_from``: the prefill is the
        same for every policy, so it runs once; the fork applies ``policy``'s after-prefill step (prompt
        compression with the kept window queries) to a copy of every layer. Needs a dense cache
        with a prefill and no decode step yet, made with ``keep_queries`` >= the new policy's window
        (-1 for ``"h2o"``, which scores with every prompt query).
        """
        from .compression import compress_layer  # the after-prefill step, shared with the attention path

        if self.policy.name != "dense":
            raise ValueError(f"kvsift.hf: fork needs a dense cache (this one is {self.policy.name!r})")
        if not all(l.prefilled and l.seen == l.stored for l in self.layers):
            raise ValueError("kvsift.hf: fork needs a cache right after its prefill (every layer prefilled, no "
                             "compression, nothing decoded)")
        other = KvsiftCache(self._config, policy, reserve=self.reserve, page_size=self.page_size, **policy_options)
        for src, dst in zip(self.layers, other.layers):
            dst.device = src.device
            dst.is_initialized = True
            keys, values = src.contiguous(src.stored)
            dst.replace(keys, values, src.lengths, src.stored)
            dst.seen = src.seen
            dst.prefilled = True
            if other.policy.compresses:
                compress_layer(dst, other.policy, src.window_queries, source="fork")
        return other


__all__ = ["DEFAULT_RESERVE", "KvsiftCache", "KvsiftCacheLayer", "layer_of"]
