"""Loads the compiled ops (``_C.so``) and registers their fake kernels.

The library holds only ``TORCH_LIBRARY(kvsift, ...)`` registrations, no Python C-API, so it is loaded
with :func:`torch.ops.load_library` and its ops are reached as ``torch.ops.kvsift.<name>``. The fake
(meta) kernels below give each op's output shapes, dtypes and strides from its inputs alone, which is
what ``torch.compile`` (FakeTensor tracing) and ``torch.library.opcheck`` need; they must agree with
``csrc/op_args.hpp``.
"""

from __future__ import annotations

import math
import os
from typing import Optional, Sequence, Tuple

import torch

_LIB_PATH = os.path.join(os.path.dirname(__file__), "_C.so")
if not os.path.exists(_LIB_PATH):
    raise ImportError(
        f"kvsift: the compiled ops {_LIB_PATH} are missing; install the package with `pip install ./python` "
        "from a kvsift checkout (docs/python.md)"
    )
torch.ops.load_library(_LIB_PATH)

ops = torch.ops.kvsift


def topk_width(k: int, sink: int, recent: int) -> int:
    """Columns of topk's index output: the budget, or sink + recent when the forced positions need more."""
    return max(max(k, 0), max(sink, 0) + max(recent, 0))


@torch.library.register_fake("kvsift::topk")
def _topk_fake(
    scores: torch.Tensor,
    k: int,
    lengths: Optional[torch.Tensor] = None,
    per_row_k: Optional[torch.Tensor] = None,
    sink: int = 0,
    recent: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    rows = scores.shape[0]
    width = topk_width(k, sink, recent)
    indices = scores.new_empty((rows, width), dtype=torch.int32)
    counts = scores.new_empty((rows,), dtype=torch.int32)
    return indices, counts


@torch.library.register_fake("kvsift::decode_attention")
def _decode_attention_fake(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    kv_layout: str = "BHSD",
    block_table: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    max_kv_length: int = 0,
    sparse_heads: Sequence[int] = (),
    indices: Optional[torch.Tensor] = None,
    index_counts: Optional[torch.Tensor] = None,
    index_block_size: int = 1,
) -> Tuple[torch.Tensor, torch.Tensor]:
    torch._check(q.dim() == 4, lambda: f"kvsift.decode_attention: q must have 4 dimensions (got {tuple(q.shape)})")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if kv_layout == "BHSD":
        # kvsift writes lse as [B, S_q, H_q]; for BHSD it is returned as the [B, H_q, S_q] view.
        b, h, s = q.shape[0], q.shape[1], q.shape[2]
        lse = torch.empty((b, s, h), dtype=torch.float32, device=q.device).permute(0, 2, 1)
    else:
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return out, lse


@torch.library.register_fake("kvsift::compress_prompt")
def _compress_prompt_fake(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_lengths: torch.Tensor,
    queries: torch.Tensor,
    policy: str = "ClusterAttn",
    capacity: int = 1024,
    window: int = 32,
    kv_layout: str = "BHSD",
    sm_scale: Optional[float] = None,
    heads: str = "kv_head_mean",
    lse: Optional[torch.Tensor] = None,
    num_block: int = 128,
    theta: float = 2e-3,
    block_rule: str = "prefix_split",
    radius_rule: str = "half_block",
    fixed_radius: int = 0,
    pool: str = "max",
    pool_kernel: int = 7,
    sinks: int = 4,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch._check(k_cache.dim() == 4, lambda: f"kvsift.compress_prompt: k_cache must have 4 dimensions (got {tuple(k_cache.shape)})")
    torch._check(queries.dim() == 4, lambda: f"kvsift.compress_prompt: queries must have 4 dimensions (got {tuple(queries.shape)})")
    bhsd = kv_layout == "BHSD"
    b, d = k_cache.shape[0], k_cache.shape[3]
    # The compressed cache's heads: H_kv, or H_q with heads="query_head" (op_args.hpp, prepare_compress).
    h = (queries.shape[1] if bhsd else queries.shape[2]) if heads == "query_head" else (
        k_cache.shape[1] if bhsd else k_cache.shape[2])
    shape = (b, h, capacity, d) if bhsd else (b, capacity, h, d)
    k_out = k_cache.new_empty(shape)
    v_out = k_cache.new_empty(shape)
    new_lengths = kv_lengths.new_empty((b,))
    positions = kv_lengths.new_empty((b, h, capacity))
    return k_out, v_out, new_lengths, positions


def default_sm_scale(head_dim: int) -> float:
    """1 / sqrt(head_dim), the decode_attention default."""
    return 1.0 / math.sqrt(head_dim)
