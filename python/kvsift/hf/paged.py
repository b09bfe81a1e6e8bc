"""``PagedStore``: one layer's K/V in a vLLM-style page pool with a block table.

What an engine's paged cache looks like to kvsift: K and V are pools ``[pages, H_kv, page_size, D]``
(kvsift's ``HND`` layout) and sequence ``b``'s logical page ``p`` is the physical page
``block_table[b, p]``. Here the pages of the batch are interleaved (``p * B + b``), so no sequence's
pages are adjacent and every read goes through the table, as it would in an engine; growing the
pool keeps every page id and appends pages, so nothing already written moves.

``KvsiftCache(page_size=...)`` keeps its layers here instead of contiguous buffers; decode attention
reads the pool directly (``kv_layout="HND"`` with the block table). What needs the tokens in order
(prompt compression's input, LycheeDecode's retrieval scores, a fork) reads them with :meth:`read`.
"""

from __future__ import annotations

from typing import Tuple

import torch


class PagedStore:
    """Page pools and block table for ``batch`` sequences of ``heads`` KV heads of ``dim`` elements.

    Args:
        batch, heads, dim, dtype, device: the layer's K/V shape and element type.
        page_size: tokens per page, >= 1.
        capacity: tokens per sequence to make room for (rounded up to whole pages).
    """

    def __init__(self, batch: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device, page_size: int,
                 capacity: int):
        self.batch, self.heads, self.dim, self.page_size = batch, heads, dim, page_size
        self.dtype, self.device = dtype, device
        self.max_pages = 0
        self.keys = torch.empty(0, heads, page_size, dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.block_table = torch.empty(batch, 0, dtype=torch.int32, device=device)
        self.grow(capacity)

    @property
    def capacity(self) -> int:
        """Tokens per sequence the pages hold."""
        return self.max_pages * self.page_size

    def grow(self, capacity: int) -> None:
        """Makes room for ``capacity`` tokens per sequence; existing pages keep their ids and contents."""
        pages = -(-capacity // self.page_size)
        if pages <= self.max_pages:
            return
        keys = torch.zeros(pages * self.batch, self.heads, self.page_size, self.dim, dtype=self.dtype,
                           device=self.device)
        values = torch.zeros_like(keys)
        used = self.max_pages * self.batch  # ids p * B + b with p < max_pages: the first pages of the pool
        keys[:used].copy_(self.keys)
        values[:used].copy_(self.values)
        self.keys, self.values, self.max_pages = keys, values, pages
        logical = torch.arange(pages, dtype=torch.int32, device=self.device)
        sequence = torch.arange(self.batch, dtype=torch.int32, device=self.device)
        self.block_table = (logical.unsqueeze(0) * self.batch + sequence.unsqueeze(1)).contiguous()

    def _slots(self, start: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Physical pages ``[B, n]`` and in-page slots ``[n]`` of positions ``[start, start + n)``."""
        positions = torch.arange(start, start + n, device=self.device)
        pages = self.block_table[:, positions // self.page_size].long()
        return pages, positions % self.page_size

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Stores ``keys`` / ``values`` ``[B, H, n, D]`` at positions ``[start, start + n)`` of every sequence."""
        n = keys.shape[2]
        if n == 0:
            return
        self.grow(start + n)
        pages, slots = self._slots(start, n)
        # pool[pages, :, slots] is [B, n, H, D]: the advanced indices come first.
        self.keys[pages, :, slots] = keys.permute(0, 2, 1, 3).to(self.dtype)
        self.values[pages, :, slots] = values.permute(0, 2, 1, 3).to(self.dtype)

    def read_keys(self, n: int) -> torch.Tensor:
        """The first ``n`` keys of every sequence, in order: a new ``[B, H, n, D]`` tensor."""
        return self._read(self.keys, n)

    def read(self, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` keys and values of every sequence, in order: new ``[B, H, n, D]`` tensors."""
        return self._read(self.keys, n), self._read(self.values, n)

    def _read(self, pool: torch.Tensor, n: int) -> torch.Tensor:
        pages = -(-n // self.page_size)
        table = self.block_table[:, :pages].long()
        # [B, pages, H, page_size, D] -> [B, H, pages * page_size, D]
        gathered = pool[table].permute(0, 2, 1, 3, 4).reshape(self.batch, self.heads, pages * self.page_size, self.dim)
        return gathered[:, :, :n].contiguous()


__all__ = ["PagedStore"]
