"""LycheeDecode as a step object: the index table of a model's layers and kvsift's per-layer policy.

Per decode step the engine calls :meth:`LycheeDecode.decode_layer` for layers ``0 .. num_layers - 1`` in
order, after appending the new token's K/V to that layer's cache. Each call is one kvsift op
(``torch.ops.kvsift.lycheedecode_layer`` = ``LycheeDecodePolicy::decode_layer``): retrieval KV heads
attend densely and rank every token by the group-mean query's score, their top-k (sink and recent
forced) is written into their rows of the index table, and sparse KV heads attend over their row as the
latest earlier retrieval layer of the same KV-head index left it. The policy's logic is kvsift's, on the
host backend for CPU tensors and the CUDA launcher for CUDA ones; this module holds the state (the table
and the layer cursor) and the configuration. See docs/python.md and docs/ops/lycheedecode.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch

from ._ops import ops
from .ops import IndexSet
from .roles import HeadRoles

LYCHEEDECODE_SELECTIONS = ("token", "ratio", "block")
"""The ``selection`` values of :class:`LycheeDecodeConfig` (C++ ``kvsift::LycheeDecodeSelection``)."""

CORRECTION_INTERVAL = 32
"""The paper's cache-correction interval (C++ ``kLycheeDecodeCorrectionInterval``)."""


@dataclass(frozen=True)
class LycheeDecodeConfig:
    """The C++ ``kvsift::LycheeDecodeConfig``: model shape, roles, capacities, selection, cache correction.

    kvsift validates it when a :class:`LycheeDecode` is made and on every layer call; a bad field raises
    ``ValueError`` naming it (``budget = 8 is smaller than sink + recent = 12 ...``; ``head_dim = 96``
    is ``NotImplementedError``).

    Attributes:
        roles: the ``[layers, kv_heads]`` roles table (:class:`HeadRoles`, e.g. ``HeadRoles.load(path)``
            or :func:`kvsift.head_roles_from_gates`); layer 0 must be all retrieval. Gives num_layers
            and num_kv_heads.
        num_q_heads: query heads, a positive multiple of the KV heads.
        head_dim: 64, 128 or 256.
        max_batch: the most sequences a step may have (sizes the table).
        max_kv_length: the longest sequence a call may see; longer ones are clamped to it.
        selection: ``"token"`` (``budget`` tokens), ``"ratio"`` (``floor((1 - rho) L)`` tokens) or
            ``"block"`` (``num_blocks`` blocks of ``block_size`` tokens, scored by their max).
        budget: token mode's entries per row, ``sink`` and ``recent`` included.
        rho: ratio mode's fraction of tokens dropped, in [0, 1).
        sink: token/ratio modes: the first tokens always kept.
        recent: the last tokens always kept (block mode: every block holding one).
        block_size: block mode's tokens per block, a power of two >= 16.
        num_blocks: block mode's blocks per row, forced ones included.
        sink_blocks: block mode's first blocks always kept.
        index_capacity: entries per table row; 0 = what the selection needs.
        correction_interval: cache correction every that many steps (:data:`CORRECTION_INTERVAL`); 0 = off.
        sm_scale: attention logit scale; ``None`` is ``1 / sqrt(head_dim)``.
    """

    roles: HeadRoles
    num_q_heads: int
    head_dim: int
    max_batch: int
    max_kv_length: int
    selection: str = "token"
    budget: int = 4096
    rho: float = 0.7
    sink: int = 128
    recent: int = 256
    block_size: int = 64
    num_blocks: int = 64
    sink_blocks: int = 1
    index_capacity: int = 0
    correction_interval: int = 0
    sm_scale: Optional[float] = None

    @property
    def num_layers(self) -> int:
        return self.roles.layers

    @property
    def num_kv_heads(self) -> int:
        return self.roles.kv_heads

    def op_args(self) -> tuple:
        """The configuration as the ops' schema takes it (``num_layers`` .. ``sm_scale``)."""
        flat: List[int] = [int(r) for row in self.roles.retrieval for r in row]
        return (self.num_layers, self.num_q_heads, self.num_kv_heads, self.head_dim, flat, self.max_batch,
                self.max_kv_length, self.selection, self.budget, float(self.rho), self.sink, self.recent,
                self.block_size, self.num_blocks, self.sink_blocks, self.index_capacity, self.correction_interval,
                self.sm_scale)

    def correction_due(self, step: int) -> bool:
        """Whether 0-based decode step ``step`` is a cache-correction step (C++ ``correction_due``):
        steps ``N - 1, 2N - 1, ...`` with ``N = correction_interval``; never when it is 0."""
        n = self.correction_interval
        return n > 0 and step >= 0 and (step + 1) % n == 0


class LycheeDecode:
    """The state of LycheeDecode decoding for one batch: the index table and the layer cursor.

    The table has one row per (sequence b, KV head h), row ``b * num_kv_heads + h`` in the model's
    original KV-head order, ``capacity`` int32 entries (tokens, or block ids in block mode) and a count;
    it lives on ``device``. Layer 0 (all retrieval) rewrites every row at every step, so it needs no
    reset between sequences or steps. The cursor checks that layers come in order, once per step; a
    whole step leaves it at layer 0, so a step captured in a CUDA graph replays without host
    bookkeeping. The decode step count (for :meth:`LycheeDecodeConfig.correction_due`) is the engine's.

    Example::

        roles = kvsift.HeadRoles.load("model.roles")
        ld = kvsift.LycheeDecode(kvsift.LycheeDecodeConfig(roles, num_q_heads=32, head_dim=128,
                                                           max_batch=1, max_kv_length=32768, budget=1024,
                                                           sink=16, recent=64), device="cuda")
        for layer in range(roles.layers):   # per decode step, after appending the new K/V
            out = ld.decode_layer(layer, q[layer], k_cache[layer], v_cache[layer], lengths)
    """

    def __init__(self, config: LycheeDecodeConfig, *, device: Union[str, torch.device] = "cpu") -> None:
        if config.selection not in LYCHEEDECODE_SELECTIONS:
            raise ValueError(f"kvsift.LycheeDecode: selection = '{config.selection}' must be one of "
                             f"{', '.join(LYCHEEDECODE_SELECTIONS)}")
        # The schema arguments once: a layer call then passes them without rebuilding the roles list.
        self._op_args = config.op_args()
        rows, capacity, entry_tokens = ops.lycheedecode_table_shape(*self._op_args)
        self.config = config
        self.entry_tokens: int = int(entry_tokens)
        self.table_indices = torch.full((rows, capacity), -1, dtype=torch.int32, device=device)
        self.table_counts = torch.zeros((rows,), dtype=torch.int32, device=device)
        self._next_layer = 0
        self._step_batch = 0

    @property
    def capacity(self) -> int:
        """Entries per index row."""
        return int(self.table_indices.shape[1])

    @property
    def next_layer(self) -> int:
        """The layer the next call must be for."""
        return self._next_layer

    @property
    def table(self) -> IndexSet:
        """The index table as an :class:`IndexSet` ``[max_batch, num_kv_heads, capacity]`` (views, not copies):
        entries past a row's count are stale."""
        b, h = self.config.max_batch, self.config.num_kv_heads
        return IndexSet(self.table_indices.view(b, h, -1), self.table_counts.view(b, h), self.entry_tokens)

    def restart_step(self) -> None:
        """Abandon a step half way (an engine error): the next call must be layer 0 again."""
        self._next_layer = 0

    def _layer(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               kv_lengths: torch.Tensor, kv_layout: str, block_table: Optional[torch.Tensor], correction: bool,
               return_lse: bool) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        out, lse = ops.lycheedecode_layer(
            q, k_cache, v_cache, kv_lengths, self.table_indices, self.table_counts, int(layer), self._next_layer,
            self._step_batch, *self._op_args, kv_layout, block_table, correction)
        # The policy accepted the call: advance the cursor as LycheeDecodePolicy::advance does.
        if layer == 0:
            self._step_batch = int(q.shape[0])
        self._next_layer = 0 if layer + 1 == self.config.num_layers else layer + 1
        return (out, lse) if return_lse else out

    def decode_layer(
        self,
        layer: int,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        kv_lengths: torch.Tensor,
        *,
        kv_layout: str = "BHSD",
        block_table: Optional[torch.Tensor] = None,
        return_lse: bool = False,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """One layer of a decode step (``LycheeDecodePolicy::decode_layer``).

        Args:
            layer: must be :attr:`next_layer` (layers run 0 .. num_layers - 1 once per step).
            q: this layer's post-RoPE queries of the new token, q_len = 1, in ``kv_layout``'s query
                layout (``[B, H_q, 1, D]`` for BHSD, ``[B, 1, H_q, D]`` otherwise); B <= max_batch and
                the same B for every layer of a step.
            k_cache, v_cache: this layer's cache, already holding the new token at position L - 1, in one
                of the layouts of :func:`kvsift.decode_attention` (contiguous BHSD/BSHD or paged NHD/HND).
            kv_lengths: int32 ``[B]``, the sequence lengths L (the new token included).
            kv_layout: ``"BHSD"``, ``"BSHD"``, ``"NHD"`` or ``"HND"``.
            block_table: int32 ``[B, max_pages]`` for the paged layouts.
            return_lse: also return the float32 log-sum-exp.

        Returns:
            The attention output (q's shape and dtype), or ``(out, lse)``. The layer's retrieval heads'
            selections are written into :attr:`table` for the sparse heads of later layers.
        """
        return self._layer(layer, q, k_cache, v_cache, kv_lengths, kv_layout, block_table, False, return_lse)

    def correct_layer(
        self,
        layer: int,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        kv_lengths: torch.Tensor,
        *,
        kv_layout: str = "BHSD",
        block_table: Optional[torch.Tensor] = None,
        return_lse: bool = False,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """One layer of a cache-correction step (``LycheeDecodePolicy::correct_layer``): dense causal
        attention of the last ``correction_interval`` positions (q_len = correction_interval) over the
        whole cache, the table untouched. Run it for every layer instead of :meth:`decode_layer` at the
        steps where ``config.correction_due(step)``."""
        return self._layer(layer, q, k_cache, v_cache, kv_lengths, kv_layout, block_table, True, return_lse)


@torch.library.register_fake("kvsift::lycheedecode_layer")
def _lycheedecode_layer_fake(q, k_cache, v_cache, kv_lengths, table_indices, table_counts, layer, next_layer,
                             step_batch, num_layers, num_q_heads, num_kv_heads, head_dim, roles, max_batch,
                             max_kv_length, selection="token", budget=4096, rho=0.7, sink=128, recent=256,
                             block_size=64, num_blocks=64, sink_blocks=1, index_capacity=0, correction_interval=0,
                             sm_scale=None, kv_layout="BHSD", block_table=None, correction=False):
    # The outputs are decode_attention's (the table is mutated in place, declared in the schema).
    from ._ops import _decode_attention_fake

    return _decode_attention_fake(q, k_cache, v_cache, kv_lengths, kv_layout)
