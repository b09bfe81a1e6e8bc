"""kvsift.topk against the torch reference of conftest.py (kvsift's tie and NaN rules), random and
adversarial inputs, on every device."""

from __future__ import annotations

import math

import pytest
import torch

import kvsift
from conftest import topk_reference


def check(result: kvsift.IndexSet, expected, width: int) -> None:
    indices, counts = result.indices.cpu(), result.counts.cpu()
    assert indices.dtype == torch.int32 and counts.dtype == torch.int32
    assert indices.shape == (len(expected), width)
    for r, positions in enumerate(expected):
        assert int(counts[r]) == len(positions), f"row {r}"
        assert indices[r, : len(positions)].tolist() == positions, f"row {r}"
        assert (indices[r, len(positions):] == -1).all(), f"row {r}: padding"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,cols,k,sink,recent", [(1, 1, 1, 0, 0), (7, 100, 10, 0, 0), (16, 1000, 64, 4, 16),
                                                     (5, 300, 300, 2, 3), (9, 50, 0, 0, 0), (4, 2048, 129, 0, 0)])
def test_random(device, dtype, rows, cols, k, sink, recent):
    g = torch.Generator().manual_seed(rows * 1000 + cols + k)
    scores = torch.randn(rows, cols, generator=g).to(dtype)
    lengths = torch.randint(0, cols + 3, (rows,), generator=g, dtype=torch.int32)
    lengths[0] = cols
    result = kvsift.topk(scores.to(device), k, lengths=lengths.to(device), sink=sink, recent=recent)
    check(result, topk_reference(scores, k, lengths.tolist(), sink=sink, recent=recent), max(k, sink + recent))


def test_no_lengths_and_params(device):
    scores = torch.randn(6, 40)
    params = kvsift.TopKParams(k=8, sink=2, recent=3)
    check(kvsift.topk(scores.to(device), params), topk_reference(scores, 8, sink=2, recent=3), 8)


def test_per_row_k(device):
    scores = torch.randn(5, 64)
    per_row_k = torch.tensor([0, 1, 7, 16, 100], dtype=torch.int32)  # 100 is clamped to the width 16
    result = kvsift.topk(scores.to(device), 16, per_row_k=per_row_k.to(device))
    check(result, topk_reference(scores, 16, per_row_k=per_row_k.tolist()), 16)


def test_forced_exceeds_budget(device):
    # sink + recent > k: every forced position is still returned, so the output is sink + recent wide.
    scores = torch.randn(3, 50)
    result = kvsift.topk(scores.to(device), 2, sink=4, recent=5)
    check(result, topk_reference(scores, 2, sink=4, recent=5), 9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_ties_go_to_the_lower_position(device, dtype):
    scores = torch.zeros(3, 64, dtype=dtype)
    scores[1, ::2] = 1.0  # 32 tied maxima
    scores[2] = -0.0
    scores[2, 10:20] = 0.0  # -0 == +0: a tie, so positions decide
    result = kvsift.topk(scores.to(device), 8)
    check(result, [list(range(8)), list(range(0, 16, 2)), list(range(8))], 8)


def test_nan_and_infinities(device):
    scores = torch.tensor([[math.nan, -math.inf, 1.0, math.inf, math.nan, -5.0, math.nan, 0.0]])
    # Order: inf (3) > 1 (2) > 0 (7) > -5 (5) > -inf (1) > NaN (0, 4, 6 by position).
    for k, expected in [(1, [3]), (3, [2, 3, 7]), (5, [1, 2, 3, 5, 7]), (6, [0, 1, 2, 3, 5, 7]),
                        (8, list(range(8)))]:
        check(kvsift.topk(scores.to(device), k), [expected], k)
    check(kvsift.topk(scores.to(device), 4), topk_reference(scores, 4), 4)


def test_all_nan_row(device):
    scores = torch.full((2, 10), math.nan)
    check(kvsift.topk(scores.to(device), 3, recent=1), [[0, 1, 9], [0, 1, 9]], 3)


def test_leading_dims_and_row_stride(device):
    wide = torch.randn(2, 3, 80)
    scores = wide[..., :50]  # rows 80 elements apart: a strided view, not a copy
    lengths = torch.tensor([[50, 10, 0], [1, 49, 30]], dtype=torch.int32)
    result = kvsift.topk(scores.to(device), 5, lengths=lengths.to(device), recent=1)
    assert result.indices.shape == (2, 3, 5) and result.counts.shape == (2, 3)
    flat = kvsift.IndexSet(result.indices.reshape(6, 5), result.counts.reshape(6))
    check(flat, topk_reference(scores.reshape(6, 50), 5, lengths.reshape(-1).tolist(), recent=1), 5)


def test_empty(device):
    result = kvsift.topk(torch.empty(0, 10, device=device), 4)
    assert result.indices.shape == (0, 4) and result.counts.shape == (0,)
