"""Shared fixtures: the devices every op test runs on, and plain torch references.

CUDA cases are parametrized but skipped (reported as skipped, never passed) without a GPU or
without a CUDA build of the package.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import pytest
import torch

import kvsift


def _cuda_skip_reason() -> Optional[str]:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not kvsift.built_with_cuda():
        return "kvsift was built without CUDA"
    return None


CUDA_SKIP = _cuda_skip_reason()
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(CUDA_SKIP is not None, reason=CUDA_SKIP or "")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


def topk_reference(
    scores: torch.Tensor,
    k: int,
    lengths: Optional[Sequence[int]] = None,
    per_row_k: Optional[Sequence[int]] = None,
    sink: int = 0,
    recent: int = 0,
):
    """kvsift's topk written with torch.sort: positions of [0, len) ranked by (not NaN, score desc,
    position asc), sink and recent forced, output ascending. Returns a list of position lists."""
    rows, cols = scores.shape
    width = max(k, sink + recent)
    result = []
    for r in range(rows):
        length = cols if lengths is None else min(max(int(lengths[r]), 0), cols)
        budget = min(max(k if per_row_k is None else int(per_row_k[r]), 0), width)
        sink_end = min(sink, length)
        recent_begin = max(length - recent, sink_end) if recent < length else sink_end
        forced = list(range(sink_end)) + list(range(recent_begin, length))
        region = scores[r, sink_end:recent_begin].double().cpu()
        take = min(max(budget - len(forced), 0), region.numel())
        # Stable sorts, the last one the primary key: score descending (ties keep the lower position
        # first), then NaN after every number.
        key = torch.where(torch.isnan(region), torch.full_like(region, -math.inf), region)
        order = torch.sort(key, descending=True, stable=True).indices
        nan_last = torch.sort(torch.isnan(region)[order].to(torch.int8), stable=True).indices
        order = order[nan_last]
        chosen = sorted(int(i) + sink_end for i in order[:take])
        result.append(sorted(forced[:sink_end]) + chosen + forced[sink_end:])
    return result


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: Sequence[int],
    sm_scale: Optional[float] = None,
    keys_of=None,
):
    """softmax(q k^T * scale) v in float64 for q [B, S_q, H_q, D], k/v [B, S, H_kv, D] (BSHD), causal
    (query i at token len - S_q + i), GQA. keys_of(b, h, length) -> token list for a sparse head, or
    None for a dense one. Returns (out [B, S_q, H_q, D] float64, lse [B, S_q, H_q] float64)."""
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    qd, kd, vd = q.double().cpu(), k.double().cpu(), v.double().cpu()
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Sq, Hq), -math.inf, dtype=torch.float64)
    for b in range(B):
        length = int(lengths[b])
        for h in range(Hkv):
            keys = keys_of(b, h, length) if keys_of is not None else None
            keys = list(range(length)) if keys is None else [t for t in keys if 0 <= t < length]
            for i in range(Sq):
                limit = length - Sq + i
                visible = torch.tensor([t for t in keys if t <= limit], dtype=torch.long)
                if visible.numel() == 0:
                    continue
                for g in range(G):
                    hq = h * G + g
                    logits = (kd[b, visible, h] @ qd[b, i, hq]) * scale
                    lse[b, i, hq] = torch.logsumexp(logits, 0)
                    out[b, i, hq] = torch.softmax(logits, 0) @ vd[b, visible, h]
    return out, lse


# Tolerances against the float64 reference: the output is rounded to the element type, and the CUDA
# kernels accumulate in fp32 (16-bit K/V through tensor cores).
ATOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
