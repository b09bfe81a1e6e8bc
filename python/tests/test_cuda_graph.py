"""A decode step (top-k + mixed decode attention) captured in a CUDA graph and replayed with new
lengths: the ops launch on torch's current stream, allocate their workspace from the caching
allocator and never sync, so capture works and replay follows the device-side lengths. GPU only."""

from __future__ import annotations

import pytest
import torch

from conftest import CUDA_SKIP
from test_compile import lychee_like_step, make_inputs

pytestmark = pytest.mark.skipif(CUDA_SKIP is not None, reason=CUDA_SKIP or "")


def test_capture_and_replay():
    q, k, v, lengths, scores = make_inputs("cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture, as torch's CUDA-graph docs advise
        lychee_like_step(q, k, v, lengths, scores)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = lychee_like_step(q, k, v, lengths, scores)
    for new_lengths in ([50, 31], [7, 50], [1, 2]):
        lengths.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        graph.replay()
        expected = lychee_like_step(q, k, v, lengths, scores)
        for a, b in zip(captured, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_lycheedecode_step_and_gates_replay():
    """A whole LycheeDecode step (every layer, the table written in place) and a gate-training forward
    and backward, captured once and replayed for new lengths / new noise, equal eager calls."""
    import kvsift

    roles = kvsift.HeadRoles.parse("kvsift-head-roles v1 layers=3 kv_heads=2\nRR\nRS\nSR\n")
    cfg = kvsift.LycheeDecodeConfig(roles, num_q_heads=4, head_dim=64, max_batch=2, max_kv_length=64, budget=16,
                                    sink=2, recent=4)
    g = torch.Generator().manual_seed(0)
    qs = [torch.randn(2, 4, 1, 64, generator=g).cuda() for _ in range(3)]
    ks = [torch.randn(2, 2, 64, 64, generator=g).cuda() for _ in range(3)]
    lengths = torch.tensor([64, 20], dtype=torch.int32, device="cuda")
    a = torch.rand(3, 2, generator=g).cuda().add_(0.5).requires_grad_()
    b = torch.rand(3, 2, generator=g).cuda().add_(0.5).requires_grad_()
    u = kvsift.hardkuma_noise((3, 2), device="cuda")

    def step(ld):
        outs = [ld.decode_layer(l, qs[l], ks[l], ks[l], lengths) for l in range(3)]
        a.grad = b.grad = None
        loss = kvsift.hardkuma_sample(a, b, u).square().sum() + kvsift.hardkuma_expected_l0(a, b, reduction="mean")
        loss.backward()
        return outs + [loss.detach(), a.grad, b.grad]

    ld = kvsift.LycheeDecode(cfg, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(ld)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(ld)
    for new_lengths in ([64, 20], [33, 64], [5, 1]):
        lengths.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        u.copy_(kvsift.hardkuma_noise((3, 2), device="cuda"))
        graph.replay()
        table = ld.table_indices.clone()
        fresh = kvsift.LycheeDecode(cfg, device="cuda")
        expected = step(fresh)
        for x, y in zip(captured, expected):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        rows = fresh.table_counts
        for r in range(4):
            assert torch.equal(table[r, :rows[r]], fresh.table_indices[r, :rows[r]])
