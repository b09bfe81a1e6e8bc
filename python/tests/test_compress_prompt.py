"""compress_prompt (ClusterAttn, SnapKV, StreamingLLM, H2O-prefill) against a plain torch reference
written here in float64: the window scores as explicit causal softmaxes, pooling with torch's
max_pool1d / avg_pool1d, selection by stable sorts (ties to the lower position), then the gather of the
kept prefix and the window. Positions and lengths must match exactly and the compacted K/V bit for bit
(they are copies)."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import pytest
import torch
import torch.nn.functional as F

import kvsift
from kvsift import PromptCompressionConfig


def window_scores_reference(k: torch.Tensor, q: torch.Tensor, length: int, cfg: PromptCompressionConfig,
                            b: int) -> torch.Tensor:
    """P[hq][j] for j < L - W: the column sums of the causal softmaxes of the scored queries (float64).
    k is BHSD [B, H_kv, S, D], q [B, H_q, W', D]; query row i sits at position L - nq + i."""
    hkv, hq, d = k.shape[1], q.shape[1], k.shape[3]
    group = hq // hkv
    n = max(length - cfg.window, 0)
    scale = cfg.sm_scale if cfg.sm_scale is not None else 1.0 / math.sqrt(d)
    wanted = length if cfg.policy == "H2O-prefill" else min(cfg.window, length)
    nq = min(wanted, q.shape[2])
    P = torch.zeros(hq, n, dtype=torch.float64)
    for h in range(hq):
        keys = k[b, h // group].double()
        for i in range(nq):
            pos = length - nq + i
            logits = scale * (keys[: pos + 1] @ q[b, h, i].double())
            p = torch.softmax(logits, dim=0)
            m = min(n, pos + 1)
            P[h, :m] += p[:m]
    return P


def rank(scores: torch.Tensor, flags: Optional[torch.Tensor] = None) -> List[int]:
    """Positions by (flag desc, score desc, position asc): stable sorts, the last one the primary key."""
    order = torch.sort(-scores, stable=True).indices
    if flags is not None:
        order = order[torch.sort(-flags[order].to(torch.int32), stable=True).indices]
    return order.tolist()


def cluster_flags_reference(P: torch.Tensor, cfg: PromptCompressionConfig) -> torch.Tensor:
    """ClusterAttn's DBAC with block_rule prefix_split and radius_rule half_block / fixed
    (docs/ops/prompt_compression.md): block max-pool, centres where the maximum > theta (at its lowest
    position), tokens within the radius of a centre flagged."""
    n = P.numel()
    flags = torch.zeros(n, dtype=torch.bool)
    if n == 0:
        return flags
    assert cfg.block_rule == "prefix_split" and cfg.radius_rule in ("half_block", "fixed")
    block = max((n + cfg.num_block - 1) // cfg.num_block, 1)
    radius = block // 2 if cfg.radius_rule == "half_block" else cfg.fixed_radius
    P32 = P.float()  # kvsift compares the fp32 scores with the fp32 theta
    theta = torch.tensor(cfg.theta, dtype=torch.float32)
    for start in range(0, n, block):
        seg = P32[start: start + block]
        m = seg.max()
        if m > theta:
            c = start + int(torch.nonzero(seg == m)[0])
            flags[max(c - radius, 0): c + radius + 1] = True
    return flags


def compress_reference(k: torch.Tensor, v: torch.Tensor, lengths: List[int], q: torch.Tensor,
                       cfg: PromptCompressionConfig) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole pipeline on BHSD tensors: (k_out, v_out, new_lengths, positions) like the op's."""
    B, hkv, S, D = k.shape
    hq = q.shape[1]
    hout = hq if cfg.heads == "query_head" else hkv
    group_out = hout // hkv
    K = cfg.budget
    k_out = torch.zeros(B, hout, cfg.capacity, D, dtype=k.dtype)
    v_out = torch.zeros_like(k_out)
    positions = torch.full((B, hout, cfg.capacity), -1, dtype=torch.int32)
    new_lengths = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        L = min(max(lengths[b], 0), S)
        n = max(L - cfg.window, 0)
        P = window_scores_reference(k, q, L, cfg, b) if cfg.policy != "StreamingLLM" else None
        if P is not None and cfg.heads == "kv_head_mean":
            P = P.reshape(hkv, hq // hkv, n).mean(dim=1)
        for h in range(hout):
            if n <= K:
                prefix = list(range(n))
            elif cfg.policy == "StreamingLLM":
                prefix = list(range(cfg.sinks)) + list(range(n - (K - cfg.sinks), n))
            else:
                row = P[h]
                flags = None
                if cfg.policy == "SnapKV":
                    pad = cfg.pool_kernel // 2
                    x = row.reshape(1, 1, n)
                    row = (F.max_pool1d(x, cfg.pool_kernel, 1, pad) if cfg.pool == "max"
                           else F.avg_pool1d(x, cfg.pool_kernel, 1, pad, count_include_pad=True)).reshape(n)
                if cfg.policy == "ClusterAttn":
                    flags = cluster_flags_reference(row, cfg)
                prefix = sorted(rank(row, flags)[:K])
            kept = prefix + list(range(n, L))
            positions[b, h, : len(kept)] = torch.tensor(kept, dtype=torch.int32)
            k_out[b, h, : len(kept)] = k[b, h // group_out, kept]
            v_out[b, h, : len(kept)] = v[b, h // group_out, kept]
            new_lengths[b] = len(kept)
    return k_out, v_out, new_lengths, positions


def make_prompt(seed: int, B=3, Hkv=2, G=2, S=64, D=16, Wq=8, all_queries=False, dtype=torch.float32,
                lengths=(64, 37, 13)):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, S, D, generator=g).to(dtype)
    q = torch.randn(B, Hkv * G, S if all_queries else Wq, D, generator=g).to(dtype)
    return k, v, list(lengths[:B]), q


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t if layout == "BHSD" else t.transpose(1, 2).contiguous()


CONFIGS = {
    "SnapKV": PromptCompressionConfig("SnapKV", capacity=24, window=8),
    "SnapKV-avg5": PromptCompressionConfig("SnapKV", capacity=20, window=8, pool="avg", pool_kernel=5),
    "SnapKV-nopool-scale": PromptCompressionConfig("SnapKV", capacity=20, window=6, pool_kernel=1, sm_scale=0.5),
    "StreamingLLM": PromptCompressionConfig("StreamingLLM", capacity=24, window=8),
    "StreamingLLM-0sinks": PromptCompressionConfig("StreamingLLM", capacity=16, window=4, sinks=0),
    "H2O-prefill": PromptCompressionConfig("H2O-prefill", capacity=24, window=8),
    "ClusterAttn": PromptCompressionConfig("ClusterAttn", capacity=24, window=8, num_block=8, theta=0.3),
    "ClusterAttn-all-centres": PromptCompressionConfig("ClusterAttn", capacity=24, window=8, num_block=16, theta=0.0),
    "ClusterAttn-no-centre": PromptCompressionConfig("ClusterAttn", capacity=24, window=8, theta=100.0),
    "ClusterAttn-fixed": PromptCompressionConfig("ClusterAttn", capacity=28, window=8, num_block=6, theta=0.25,
                                                 radius_rule="fixed", fixed_radius=1),
}


@pytest.mark.parametrize("heads", ["kv_head_mean", "query_head"])
@pytest.mark.parametrize("layout", ["BHSD", "BSHD"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_reference(device, name, layout, heads):
    base = CONFIGS[name]
    cfg = PromptCompressionConfig(**{**base.__dict__, "heads": heads})
    k, v, lengths, q = make_prompt(seed=len(name), all_queries=cfg.policy == "H2O-prefill")
    expected = compress_reference(k, v, lengths, q, cfg)
    got = kvsift.compress_prompt(to_layout(k, layout).to(device), to_layout(v, layout).to(device),
                                 torch.tensor(lengths, dtype=torch.int32, device=device),
                                 to_layout(q, layout).to(device), cfg, kv_layout=layout)
    assert isinstance(got, kvsift.CompressedCache)
    torch.testing.assert_close(got.lengths.cpu(), expected[2], rtol=0, atol=0)
    torch.testing.assert_close(got.positions.cpu(), expected[3], rtol=0, atol=0)
    torch.testing.assert_close(got.k.cpu(), to_layout(expected[0], layout), rtol=0, atol=0)
    torch.testing.assert_close(got.v.cpu(), to_layout(expected[1], layout), rtol=0, atol=0)


def test_clusterattn_flags_matter():
    # The ClusterAttn case above is not plain top-k: its selection differs from SnapKV without pooling.
    cfg = CONFIGS["ClusterAttn"]
    k, v, lengths, q = make_prompt(seed=len("ClusterAttn"))
    plain = PromptCompressionConfig("SnapKV", capacity=cfg.capacity, window=cfg.window, pool_kernel=1)
    a = compress_reference(k, v, lengths, q, cfg)[3]
    b = compress_reference(k, v, lengths, q, plain)[3]
    assert not torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(device, dtype):
    cfg = CONFIGS["SnapKV"]
    k, v, lengths, q = make_prompt(seed=5, dtype=dtype)
    expected = compress_reference(k, v, lengths, q, cfg)
    got = kvsift.compress_prompt(k.to(device), v.to(device), torch.tensor(lengths, dtype=torch.int32, device=device),
                                 q.to(device), cfg)
    assert got.k.dtype == dtype
    torch.testing.assert_close(got.positions.cpu(), expected[3], rtol=0, atol=0)
    torch.testing.assert_close(got.k.cpu(), expected[0], rtol=0, atol=0)


def test_prefill_lse_gives_the_same_selection(device):
    cfg = CONFIGS["SnapKV"]
    k, v, lengths, q = make_prompt(seed=7)
    B, Hq, W, D = q.shape
    lse = torch.empty(B, Hq, W, dtype=torch.float32)
    for b, L in enumerate(lengths):
        nq = min(W, L)
        for h in range(Hq):
            for i in range(nq):
                pos = L - nq + i
                lse[b, h, i] = torch.logsumexp(k[b, h // 2, : pos + 1].double() @ q[b, h, i].double() / math.sqrt(D), 0)
    args = [t.to(device) for t in (k, v, torch.tensor(lengths, dtype=torch.int32), q)]
    with_lse = kvsift.compress_prompt(*args, cfg, lse=lse.to(device))
    without = kvsift.compress_prompt(*args, cfg)
    torch.testing.assert_close(with_lse.positions, without.positions, rtol=0, atol=0)


def test_short_prompts_copied_whole():
    cfg = PromptCompressionConfig("SnapKV", capacity=40, window=8)
    k, v, lengths, q = make_prompt(seed=3, lengths=(40, 9, 3))
    got = kvsift.compress_prompt(k, v, torch.tensor(lengths, dtype=torch.int32), q, cfg)
    assert got.lengths.tolist() == lengths
    for b, L in enumerate(lengths):
        assert got.positions[b, 0, :L].tolist() == list(range(L))
        assert (got.positions[b, 0, L:] == -1).all()
        torch.testing.assert_close(got.k[b, :, :L], k[b, :, :L], rtol=0, atol=0)


class TestErrors:
    def call(self, cfg=None, **kw):
        k, v, lengths, q = make_prompt(seed=0, B=1, lengths=(64,))
        args = dict(k_cache=k, v_cache=v, kv_lengths=torch.tensor(lengths, dtype=torch.int32), queries=q)
        args.update(kw)
        return kvsift.compress_prompt(args["k_cache"], args["v_cache"], args["kv_lengths"], args["queries"],
                                      cfg or PromptCompressionConfig("SnapKV", capacity=24, window=8),
                                      kv_layout=args.get("kv_layout", "BHSD"), lse=args.get("lse"))

    @pytest.mark.parametrize("cfg, message", [
        (PromptCompressionConfig(capacity=8, window=8), r"kvsift\.compress_prompt: invalid argument: capacity = 8 must be > window = 8"),
        (PromptCompressionConfig(capacity=8, window=0), r"window = 0 must be >= 1"),
        (PromptCompressionConfig(capacity=100, window=64), r"window = 64 must be < max_prompt_len = 64"),
        (PromptCompressionConfig("StreamingLLM", capacity=24, window=8, sinks=17), r"sinks = 17 must be in \[0, capacity - window = 16\]"),
        (PromptCompressionConfig("SnapKV", capacity=24, window=8, pool_kernel=4), r"pool\.kernel = 4 must be odd and >= 1"),
        (PromptCompressionConfig(capacity=24, window=8, theta=-1.0), r"theta = -1 must be >= 0"),
        (PromptCompressionConfig(capacity=24, window=8, num_block=0), r"num_block = 0 must be >= 1"),
        (PromptCompressionConfig("SnapKV2", capacity=24, window=8), r"policy = 'SnapKV2' must be 'ClusterAttn', 'SnapKV'"),
        (PromptCompressionConfig(capacity=24, window=8, heads="mean"), r"heads = 'mean' must be 'kv_head_mean' or 'query_head'"),
        (PromptCompressionConfig("SnapKV", capacity=24, window=8, pool="sum"), r"pool = 'sum' must be 'max' or 'avg'"),
        (PromptCompressionConfig(capacity=24, window=8, block_rule="x"), r"block_rule = 'x' must be"),
        (PromptCompressionConfig(capacity=24, window=8, radius_rule="x"), r"radius_rule = 'x' must be"),
        (PromptCompressionConfig(capacity=2**31, window=8), r"capacity = 2147483648 does not fit int32"),
    ])
    def test_bad_config(self, cfg, message):
        with pytest.raises(ValueError, match=message):
            self.call(cfg)

    def test_too_few_queries(self):
        k, v, lengths, q = make_prompt(seed=0, B=1, lengths=(64,))
        with pytest.raises(ValueError, match=r"num_queries = 8 exceeds q\.capacity = 4"):
            self.call(queries=q[:, :, :4].contiguous())

    def test_tensor_checks(self):
        k, v, lengths, q = make_prompt(seed=0, B=1, lengths=(64,))
        with pytest.raises(ValueError, match=r"queries\.dtype = Half must be one of Float"):
            self.call(queries=q.half())
        with pytest.raises(ValueError, match=r"k_cache\.dtype = Double must be one of Float, Half, BFloat16"):
            self.call(k_cache=k.double(), v_cache=v.double(), queries=q.double())
        with pytest.raises(ValueError, match=r"kv_lengths\.dtype = Long must be one of Int"):
            self.call(kv_lengths=torch.tensor([64]))
        with pytest.raises(ValueError, match=r"kv_lengths must have 1 entries \(got 2\)"):
            self.call(kv_lengths=torch.tensor([64, 64], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"v_cache shape .* must equal k_cache shape"):
            self.call(v_cache=v[:, :, :32])
        with pytest.raises(ValueError, match=r"k_cache must be contiguous in its last dimension"):
            self.call(k_cache=k.transpose(2, 3).contiguous().transpose(2, 3))
        with pytest.raises(ValueError, match=r"queries head_dim 8 must equal k_cache head_dim 16"):
            self.call(queries=q[..., :8].contiguous())
        with pytest.raises(ValueError, match=r"queries batch 2 must equal k_cache batch 1"):
            self.call(queries=torch.cat([q, q]))
        with pytest.raises(ValueError, match=r"num_q_heads = 3 must be a positive multiple of num_kv_heads = 2"):
            self.call(queries=q[:, :3].contiguous())
        with pytest.raises(ValueError, match=r"kv_layout = 'NHD' is paged; compress_prompt takes a contiguous"):
            self.call(kv_layout="NHD")
        with pytest.raises(ValueError, match=r"kv_layout = 'XYZ' must be"):
            self.call(kv_layout="XYZ")
        with pytest.raises(ValueError, match=r"k_cache must have 4 dimensions"):
            self.call(k_cache=k[0], v_cache=v[0])
        with pytest.raises(ValueError, match=r"lse must be a contiguous float32 \[B, H_q, queries rows\] = \[1, 4, 8\]"):
            self.call(lse=torch.zeros(1, 4, 7))


def opcheck_cases(device):
    k, v, lengths, q = make_prompt(seed=1)
    lengths = torch.tensor(lengths, dtype=torch.int32)
    kq = [t.to(device) for t in (k, v, lengths, q)]
    bshd = [to_layout(t, "BSHD").to(device) for t in (k, v)] + [lengths.to(device), to_layout(q, "BSHD").to(device)]
    op = torch.ops.kvsift.compress_prompt.default
    return {
        "snapkv": (op, tuple(kq), {"policy": "SnapKV", "capacity": 24, "window": 8}),
        "clusterattn_bshd": (op, tuple(bshd), {"capacity": 24, "window": 8, "kv_layout": "BSHD", "num_block": 8,
                                                "theta": 0.3}),
        "streamingllm_query_head": (op, tuple(kq), {"policy": "StreamingLLM", "capacity": 20, "window": 8,
                                                    "heads": "query_head"}),
    }


@pytest.mark.parametrize("case", ["snapkv", "clusterattn_bshd", "streamingllm_query_head"])
def test_opcheck(device, case):
    op, args, kwargs = opcheck_cases(device)[case]
    torch.library.opcheck(op, args, kwargs)


def test_compile_fullgraph(device):
    torch._dynamo.reset()
    k, v, lengths, q = [t.to(device) if isinstance(t, torch.Tensor) else t for t in make_prompt(seed=2, D=64)]
    lengths = torch.tensor(lengths, dtype=torch.int32, device=device)
    cfg = PromptCompressionConfig("SnapKV", capacity=24, window=8)

    def compress_then_attend(k, v, lengths, q):
        c = kvsift.compress_prompt(k, v, lengths, q, cfg)
        out = kvsift.decode_attention(q[:, :, -1:], c.k, c.v, c.lengths)
        return out, c.positions, c.lengths

    expected = compress_then_attend(k, v, lengths, q)
    got = torch.compile(compress_then_attend, fullgraph=True)(k, v, lengths, q)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
