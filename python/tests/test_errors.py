"""Bad input raises a Python exception whose message carries kvsift's (or the binding's) text naming
the argument: never a crash, never a silent wrong answer. CPU only: the checks run on the host before
any launch and are the same code for CUDA tensors."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

import kvsift


def qkv(B=1, Hq=2, Hkv=1, S=8, D=64, Sq=1, dtype=torch.float32):
    return (torch.randn(B, Sq, Hq, D, dtype=dtype), torch.randn(B, S, Hkv, D, dtype=dtype),
            torch.randn(B, S, Hkv, D, dtype=dtype), torch.full((B,), S, dtype=torch.int32))


def attend(q, k, v, lengths, **kw):
    kw.setdefault("kv_layout", "BSHD")
    return kvsift.decode_attention(q, k, v, lengths, **kw)


class TestTopk:
    def test_negative_k(self):
        with pytest.raises(ValueError, match=r"kvsift\.topk: invalid argument: k = -1 must be >= 0"):
            kvsift.topk(torch.randn(2, 5), -1)

    def test_negative_sink(self):
        with pytest.raises(ValueError, match=r"sink = -2 must be >= 0"):
            kvsift.topk(torch.randn(2, 5), 1, sink=-2)

    def test_wrong_dtype(self):
        with pytest.raises(ValueError, match=r"scores\.dtype = Double must be one of Float, Half, BFloat16"):
            kvsift.topk(torch.randn(2, 5, dtype=torch.float64), 1)

    def test_non_contiguous_rows(self):
        with pytest.raises(ValueError, match=r"scores must be contiguous in its last dimension"):
            kvsift.topk(torch.randn(5, 4).t(), 1)

    def test_lengths_dtype_and_size(self):
        with pytest.raises(ValueError, match=r"lengths\.dtype = Long must be one of Int"):
            kvsift.topk(torch.randn(2, 5), 1, lengths=torch.tensor([1, 2]))
        with pytest.raises(ValueError, match=r"lengths must have 2 entries \(got 3\)"):
            kvsift.topk(torch.randn(2, 5), 1, lengths=torch.tensor([1, 2, 3], dtype=torch.int32))

    def test_k_beyond_int32(self):
        with pytest.raises(ValueError, match=r"k = 4294967296 does not fit int32"):
            kvsift.topk(torch.randn(2, 5), 2**32)


class TestDecodeAttention:
    def test_head_dim_unsupported(self):
        with pytest.raises(NotImplementedError, match=r"head_dim = 96 is not supported \(64, 128 or 256\)"):
            attend(*qkv(D=96))

    def test_dtype_mismatch(self):
        q, k, v, n = qkv()
        with pytest.raises(ValueError, match=r"k_cache\.dtype = Half must be one of Float"):
            attend(q, k.half(), v, n)

    def test_gqa_mismatch(self):
        with pytest.raises(ValueError, match=r"num_q_heads = 3 must be a positive multiple of kv\.num_kv_heads = 2"):
            attend(*qkv(Hq=3, Hkv=2))

    def test_batch_mismatch(self):
        q, k, v, n = qkv(B=2)
        with pytest.raises(ValueError, match=r"k_cache batch 2 must equal q batch 1"):
            attend(q[:1], k, v, n[:1])
        with pytest.raises(ValueError, match=r"kv_lengths must have 2 entries \(got 1\)"):
            attend(q, k, v, n[:1])

    def test_v_shape(self):
        q, k, v, n = qkv()
        with pytest.raises(ValueError, match=r"v_cache shape .* must equal k_cache shape"):
            attend(q, k, v[:, :4], n)

    def test_non_contiguous_head_dim(self):
        q, k, v, n = qkv()
        with pytest.raises(ValueError, match=r"k_cache must be contiguous in its last dimension"):
            attend(q, k.transpose(1, 3).contiguous().transpose(1, 3), v, n)

    def test_q_len_beyond_length(self):
        q, k, v, _ = qkv(Sq=3)
        with pytest.raises(ValueError, match=r"q_len = 3 exceeds kv\.length\(0\) = 2"):
            attend(q, k, v, torch.tensor([2], dtype=torch.int32))

    def test_bad_layout(self):
        with pytest.raises(ValueError, match=r"kv_layout = 'SBHD' must be"):
            attend(*qkv(), kv_layout="SBHD")

    def test_sparse_heads_need_an_index_set(self):
        with pytest.raises(ValueError, match=r"sparse_heads is not empty, so indices and index_counts are required"):
            attend(*qkv(), sparse_heads=[0])
        with pytest.raises(ValueError, match=r"sparse_heads entry 1 must be a KV head in \[0, 1\)"):
            attend(*qkv(), sparse_heads=[1], index_set=kvsift.topk(torch.randn(1, 8), 2))

    def test_bad_block_size(self):
        index_set = kvsift.IndexSet(torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 8)
        with pytest.raises(ValueError, match=r"index_set\.block_size = 8 must be a power of two >= 16"):
            attend(*qkv(), sparse_heads=[0], index_set=index_set)

    def test_paged_needs_block_table(self):
        q, _, _, n = qkv()
        pages = torch.randn(4, 16, 1, 64)
        with pytest.raises(ValueError, match=r"kv_layout = 'NHD' is paged and needs a block_table"):
            attend(q, pages, pages, n, kv_layout="NHD")
        with pytest.raises(ValueError, match=r"block_table is given but kv_layout = 'BSHD' is contiguous"):
            attend(*qkv(), block_table=torch.zeros(1, 1, dtype=torch.int32))

    def test_block_table_out_of_range(self):
        q, _, _, _ = qkv()
        pages = torch.randn(4, 16, 1, 64)
        table = torch.tensor([[0, 7]], dtype=torch.int32)  # page 7 of a 4-page pool
        with pytest.raises(ValueError, match=r"kv\.block_table\[0\]\[1\] = 7 is outside the page pool \[0, 4\)"):
            attend(q, pages, pages, torch.tensor([20], dtype=torch.int32), kv_layout="NHD", block_table=table)

    def test_paged_not_dense_inside_a_page(self):
        q, _, _, n = qkv()
        pages = torch.randn(4, 2, 16, 64).transpose(1, 2)  # NHD shape [4, 16, 2, 64], HND memory
        with pytest.raises(ValueError, match=r"k_cache must be dense inside a page"):
            attend(q, pages, pages, n, kv_layout="NHD", block_table=torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="reads the extension's dynamic symbols with binutils' nm (Linux)")
def test_extension_shares_the_shared_cxx_runtime():
    """_C.so must not define libstdc++'s own (non-template) internals: a static copy of the runtime in
    the extension has locale state nobody set up, and its first number-formatting error message
    crashes the process (python/cmake/SharedCxxRuntime.cmake says how that happens)."""
    from kvsift import _ops

    out = subprocess.run(["nm", "-D", "--defined-only", _ops._LIB_PATH], capture_output=True, text=True,
                         check=True).stdout
    # std::codecvt<char16_t, char, mbstate_t> and std::locale::classic exist only in libstdc++'s sources.
    runtime_only = [s for s in ("_ZNKSt7codecvtIDsc11__mbstate_tE10do_unshiftERS0_PcS3_RS3_",
                                "_ZNSt6locale7classicEv") if s in out]
    assert not runtime_only, f"{_ops._LIB_PATH} carries a static libstdc++: defines {runtime_only}"
