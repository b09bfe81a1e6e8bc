"""The ops under torch.compile(fullgraph=True) (the fake kernels let dynamo/inductor trace them
without a graph break) and torch.library.opcheck (schema, fake kernel and dispatch consistency)."""

from __future__ import annotations

import pytest
import torch

import kvsift


def lychee_like_step(q, k, v, lengths, scores):
    """A LycheeDecode-shaped step: top-k over scores, then mixed decode attention reading the selection."""
    selected = kvsift.topk(scores, 16, lengths=lengths.repeat_interleave(k.shape[2]), sink=2, recent=4)
    out, lse = kvsift.decode_attention(q, k, v, lengths, kv_layout="BSHD", sparse_heads=[1],
                                       index_set=selected, return_lse=True)
    return out * 2, lse, selected.counts


def make_inputs(device):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 64, generator=g)
    k = torch.randn(2, 50, 2, 64, generator=g)
    v = torch.randn(2, 50, 2, 64, generator=g)
    lengths = torch.tensor([50, 31], dtype=torch.int32)
    scores = torch.randn(4, 50, generator=g)
    return [t.to(device) for t in (q, k, v, lengths, scores)]


def test_compile_fullgraph(device):
    torch._dynamo.reset()
    args = make_inputs(device)
    expected = lychee_like_step(*args)
    compiled = torch.compile(lychee_like_step, fullgraph=True)
    got = compiled(*args)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compile_fullgraph_bhsd_lse(device):
    # The BHSD lse is a permuted view; the fake kernel must give the same strides.
    torch._dynamo.reset()
    q = torch.randn(1, 4, 1, 64, device=device)
    k = torch.randn(1, 2, 20, 64, device=device)
    lengths = torch.tensor([20], dtype=torch.int32, device=device)

    def f(q, k, lengths):
        out, lse = kvsift.decode_attention(q, k, k, lengths, return_lse=True)
        return out, lse, lse.exp()

    expected = f(q, k, lengths)
    got = torch.compile(f, fullgraph=True)(q, k, lengths)
    # The op's outputs are bit-identical; inductor's vectorized exp may differ from eager's by an ulp.
    for a, b in zip(got[:2], expected[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got[1].stride() == expected[1].stride()
    torch.testing.assert_close(got[2], expected[2])


def opcheck_cases(device):
    q, k, v, lengths, scores = make_inputs(device)
    selected = kvsift.topk(scores, 16)
    bhsd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    # A paged NHD pool of 16-token pages holding the same k/v, pages in reverse order.
    B, S, H, D = k.shape
    pages = torch.zeros(2 * 4, 16, H, D, device=device)
    vpages = torch.zeros_like(pages)
    table = torch.arange(7, -1, -1, dtype=torch.int32, device=device).reshape(B, 4)
    for b in range(B):
        for t in range(S):
            pages[int(table[b, t // 16]), t % 16] = k[b, t]
            vpages[int(table[b, t // 16]), t % 16] = v[b, t]
    return {
        "decode_paged": (torch.ops.kvsift.decode_attention.default, (q, pages, vpages, lengths),
                         {"kv_layout": "NHD", "block_table": table}),
        "topk": (torch.ops.kvsift.topk.default, (scores, 8), {"lengths": lengths.repeat(2), "sink": 1, "recent": 2}),
        "topk_per_row_k": (torch.ops.kvsift.topk.default, (scores, 8), {"per_row_k": torch.tensor([0, 3, 8, 20], dtype=torch.int32, device=device)}),
        "decode_dense_bshd": (torch.ops.kvsift.decode_attention.default, (q, k, v, lengths), {"kv_layout": "BSHD"}),
        "decode_dense_bhsd": (torch.ops.kvsift.decode_attention.default, (*bhsd, lengths), {"kv_layout": "BHSD"}),
        "decode_mixed": (torch.ops.kvsift.decode_attention.default, (q, k, v, lengths),
                         {"kv_layout": "BSHD", "sparse_heads": [0], "indices": selected.indices,
                          "index_counts": selected.counts}),
    }


@pytest.mark.parametrize("case", ["topk", "topk_per_row_k", "decode_dense_bshd", "decode_dense_bhsd", "decode_mixed",
                                  "decode_paged"])
def test_opcheck(device, case):
    op, args, kwargs = opcheck_cases(device)[case]
    torch.library.opcheck(op, args, kwargs)
