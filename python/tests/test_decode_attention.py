"""kvsift.decode_attention against softmax(q k^T) v in float64 (conftest.attention_reference): dense,
gathered and mixed heads, GQA, q_len > 1, both contiguous layouts, paged NHD/HND, strided inputs, LSE."""

from __future__ import annotations

import math

import pytest
import torch

import kvsift
from conftest import ATOL, attention_reference

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_case(B, Hq, Hkv, S, D, Sq, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, S, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, S, Hkv, D, generator=g).to(dtype)
    lengths = torch.randint(Sq, S + 1, (B,), generator=g, dtype=torch.int32)
    lengths[0] = S
    return q, k, v, lengths


def compare(out, lse, ref_out, ref_lse, dtype):
    atol = ATOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=atol, rtol=atol)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    torch.testing.assert_close(lse.double().cpu()[finite], ref_lse[finite], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("B,Hq,Hkv,S,D,Sq", [(1, 1, 1, 1, 64, 1), (2, 4, 2, 37, 64, 1), (3, 8, 1, 130, 128, 3),
                                            (2, 2, 2, 20, 256, 2)])
def test_dense(device, dtype, layout, B, Hq, Hkv, S, D, Sq):
    q, k, v, lengths = make_case(B, Hq, Hkv, S, D, Sq, dtype, seed=B * 100 + S + D)
    ref_out, ref_lse = attention_reference(q, k, v, lengths.tolist())
    if layout == "BHSD":
        args = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    else:
        args = [q, k, v]
    args = [t.to(device) for t in args]
    out, lse = kvsift.decode_attention(*args, lengths.to(device), kv_layout=layout, return_lse=True)
    assert out.shape == args[0].shape and out.dtype == dtype and lse.dtype == torch.float32
    if layout == "BHSD":
        out, lse = out.transpose(1, 2), lse.transpose(1, 2)
    compare(out, lse, ref_out, ref_lse, dtype)


def test_zero_length_rows_give_zeros_and_minus_inf(device):
    q, k, v, _ = make_case(2, 2, 1, 8, 64, 1, torch.float32, seed=1)
    lengths = torch.tensor([0, 8], dtype=torch.int32)
    out, lse = kvsift.decode_attention(q.to(device), k.to(device), v.to(device), lengths.to(device),
                                       kv_layout="BSHD", return_lse=True)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all() and not torch.isnan(out).any()


def test_strided_inputs(device):
    # q a slice of a fused QKV-like buffer, the cache with spare capacity and a padded token stride.
    B, Hq, Hkv, S, D = 2, 4, 2, 24, 64
    q_full = torch.randn(B, 1, Hq + 2, D)
    q = q_full[:, :, :Hq]
    kv = torch.randn(2, B, S + 8, Hkv + 1, D)
    k, v = kv[0, :, :S, :Hkv], kv[1, :, :S, :Hkv]
    lengths = torch.tensor([S, 5], dtype=torch.int32)
    ref_out, ref_lse = attention_reference(q, k, v, lengths.tolist(), sm_scale=0.3)
    out, lse = kvsift.decode_attention(q.to(device), k.to(device), v.to(device), lengths.to(device),
                                       kv_layout="BSHD", sm_scale=0.3, return_lse=True)
    compare(out, lse, ref_out, ref_lse, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sparse_heads", [[0, 1, 2, 3], [1, 3]], ids=["gathered", "mixed"])
def test_sparse_heads_from_topk(device, dtype, sparse_heads):
    B, Hq, Hkv, S, D, Sq = 2, 8, 4, 300, 128, 2
    q, k, v, lengths = make_case(B, Hq, Hkv, S, D, Sq, dtype, seed=7)
    scores = torch.randn(B * Hkv, S)
    selected = kvsift.topk(scores.to(device), 40, lengths=lengths.repeat_interleave(Hkv).to(device), sink=4, recent=8)
    rows = [selected.indices[r, : int(selected.counts[r])].tolist() for r in range(B * Hkv)]

    def keys_of(b, h, length):
        return rows[b * Hkv + h] if h in sparse_heads else None

    ref_out, ref_lse = attention_reference(q, k, v, lengths.tolist(), keys_of=keys_of)
    out, lse = kvsift.decode_attention(q.to(device), k.to(device), v.to(device), lengths.to(device),
                                       kv_layout="BSHD", sparse_heads=sparse_heads, index_set=selected,
                                       return_lse=True)
    compare(out, lse, ref_out, ref_lse, dtype)


def test_block_index_set(device):
    # Block granularity: entry j stands for tokens [16 j, 16 j + 16); out-of-range blocks are skipped.
    B, Hq, Hkv, S, D = 1, 2, 2, 100, 64
    q, k, v, lengths = make_case(B, Hq, Hkv, S, D, 1, torch.float32, seed=3)
    lengths[0] = 90
    indices = torch.tensor([[[0, 2, 5, 9], [1, 3, -1, -1]]], dtype=torch.int32)
    counts = torch.tensor([[4, 2]], dtype=torch.int32)
    blocks = {0: [0, 2, 5, 9], 1: [1, 3]}

    def keys_of(b, h, length):
        return [16 * j + i for j in blocks[h] for i in range(16)]

    ref_out, ref_lse = attention_reference(q, k, v, lengths.tolist(), keys_of=keys_of)
    index_set = kvsift.IndexSet(indices.to(device), counts.to(device), block_size=16)
    out, lse = kvsift.decode_attention(q.to(device), k.to(device), v.to(device), lengths.to(device),
                                       kv_layout="BSHD", sparse_heads=[0, 1], index_set=index_set, return_lse=True)
    compare(out, lse, ref_out, ref_lse, torch.float32)


def to_paged(k, v, lengths, page_size, layout, g):
    """Scatters BSHD k/v into a shuffled page pool; returns (k_pages, v_pages, block_table)."""
    B, S, H, D = k.shape
    max_pages = math.ceil(S / page_size)
    num_pages = B * max_pages + 3
    perm = torch.randperm(num_pages, generator=g)[: B * max_pages].reshape(B, max_pages).to(torch.int32)
    shape = (num_pages, page_size, H, D) if layout == "NHD" else (num_pages, H, page_size, D)
    k_pages = torch.zeros(shape, dtype=k.dtype)
    v_pages = torch.zeros(shape, dtype=k.dtype)
    for b in range(B):
        for t in range(S):
            p, slot = int(perm[b, t // page_size]), t % page_size
            if layout == "NHD":
                k_pages[p, slot], v_pages[p, slot] = k[b, t], v[b, t]
            else:
                k_pages[p, :, slot], v_pages[p, :, slot] = k[b, t], v[b, t]
    return k_pages, v_pages, perm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged(device, dtype, layout):
    B, Hq, Hkv, S, D, Sq, page_size = 3, 4, 2, 70, 64, 1, 16
    q, k, v, lengths = make_case(B, Hq, Hkv, S, D, Sq, dtype, seed=11)
    g = torch.Generator().manual_seed(5)
    k_pages, v_pages, block_table = to_paged(k, v, lengths, page_size, layout, g)
    ref_out, ref_lse = attention_reference(q, k, v, lengths.tolist())
    out, lse = kvsift.decode_attention(q.to(device), k_pages.to(device), v_pages.to(device), lengths.to(device),
                                       kv_layout=layout, block_table=block_table.to(device), return_lse=True)
    compare(out, lse, ref_out, ref_lse, dtype)


def test_paged_interleaved_pool(device):
    # vLLM-style [pages, 2, page_size, H, D] pool: K and V pages interleave at one page stride.
    B, Hq, Hkv, S, D, page_size = 2, 2, 1, 40, 64, 8
    q, k, v, lengths = make_case(B, Hq, Hkv, S, D, 1, torch.float32, seed=13)
    g = torch.Generator().manual_seed(6)
    k_pages, v_pages, block_table = to_paged(k, v, lengths, page_size, "NHD", g)
    pool = torch.stack([k_pages, v_pages], dim=1)
    ref_out, _ = attention_reference(q, k, v, lengths.tolist())
    out = kvsift.decode_attention(q.to(device), pool[:, 0].to(device), pool[:, 1].to(device), lengths.to(device),
                                  kv_layout="NHD", block_table=block_table.to(device))
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=2e-5, rtol=2e-5)
