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
