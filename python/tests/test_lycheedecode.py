"""The LycheeDecode step object (kvsift.LycheeDecode) against a plain torch reference of the policy
written here: per layer, retrieval KV heads attend densely and select top-k of the group-mean query's
raw scores (sink and recent forced; ratio and block modes) into their index rows, sparse KV heads attend
over the row the latest earlier retrieval layer of the same KV head wrote. Roles come from a roles file.
Outputs in float64 against the fp32 op, and the index table exactly. CUDA cases skip without a GPU."""

from __future__ import annotations

import math

import pytest
import torch

import kvsift
from conftest import ATOL, attention_reference, topk_reference

ROLES_FILE = """kvsift-head-roles v1 layers=4 kv_heads=3
RRR
RSS
SRS
SSR
"""


@pytest.fixture
def roles(tmp_path) -> kvsift.HeadRoles:
    path = tmp_path / "model.roles"
    path.write_text(ROLES_FILE)
    return kvsift.HeadRoles.load(path, expected_layers=4, expected_kv_heads=3)


def block_reference(scores, lengths, block_size, num_blocks, sink_blocks, recent):
    """Block mode: block score = max of its token scores below the length; the first sink_blocks blocks
    and every block holding one of the last `recent` tokens forced; then by score, lower block first."""
    rows = []
    for r, length in enumerate(lengths):
        entries = (length + block_size - 1) // block_size
        s = torch.full((entries,), -math.inf, dtype=torch.float64)
        for i in range(entries):
            s[i] = scores[r, i * block_size:min((i + 1) * block_size, length)].max()
        sink_end = min(sink_blocks, entries)
        first_recent = (max(length - recent, 0) // block_size) if recent > 0 else entries
        rest = sorted(range(sink_end, entries), key=lambda i: (-(i >= first_recent), -float(s[i]), i))
        rows.append(sorted(list(range(sink_end)) + rest[:max(num_blocks - sink_end, 0)]))
    return rows


def step_reference(cfg: kvsift.LycheeDecodeConfig, qs, ks, vs, lengths):
    """One decode step over all layers; qs[l] [B, 1, H_q, D], ks/vs[l] [B, S, H_kv, D] (BSHD).
    Returns (outputs per layer [B, 1, H_q, D] float64, table rows after the step {row: entries})."""
    B, _, Hq, D = qs[0].shape
    Hkv = cfg.num_kv_heads
    G = Hq // Hkv
    lengths = [min(int(x), cfg.max_kv_length) for x in lengths]
    table = {}
    outs = []
    for layer in range(cfg.num_layers):
        q, k, v = qs[layer].double(), ks[layer].double(), vs[layer].double()
        retrieval = cfg.roles.retrieval[layer]

        def keys_of(b, h, length):
            if retrieval[h]:
                return None
            entries = table[b * Hkv + h]
            if cfg.selection == "block":
                return [t for e in entries for t in range(e * cfg.block_size, (e + 1) * cfg.block_size)]
            return entries

        out, _ = attention_reference(q, k, v, lengths, sm_scale=cfg.sm_scale, keys_of=keys_of)
        outs.append(out)
        # The handoff: each retrieval row ranks its tokens by qbar . k (the group-mean query, no scale).
        for h in (h for h in range(Hkv) if retrieval[h]):
            qbar = q[:, 0, h * G:(h + 1) * G].mean(dim=1)  # [B, D]
            scores = torch.einsum("bd,bsd->bs", qbar, k[:, :, h])
            if cfg.selection == "block":
                sel = block_reference(scores, lengths, cfg.block_size, cfg.num_blocks, cfg.sink_blocks, cfg.recent)
            elif cfg.selection == "ratio":
                capacity = max(int((1.0 - cfg.rho) * cfg.max_kv_length), cfg.sink + cfg.recent)
                budgets = [int((1.0 - cfg.rho) * length) for length in lengths]
                sel = topk_reference(scores, capacity, lengths, budgets, cfg.sink, cfg.recent)
            else:
                sel = topk_reference(scores, cfg.budget, lengths, None, cfg.sink, cfg.recent)
            for b in range(B):
                table[b * Hkv + h] = sel[b]
    return outs, table


def make_step(cfg, batch, S, lengths, device, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    n, Hq, Hkv, D = cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
    qs = [torch.randn(batch, 1, Hq, D, generator=g).to(device, dtype) for _ in range(n)]
    ks = [torch.randn(batch, S, Hkv, D, generator=g).to(device, dtype) for _ in range(n)]
    vs = [torch.randn(batch, S, Hkv, D, generator=g).to(device, dtype) for _ in range(n)]
    return qs, ks, vs, torch.tensor(lengths, dtype=torch.int32, device=device)


def to_layout(layout, q, k, v):
    """BSHD test tensors in the step's layout (BHSD: heads first; NHD: a shuffled page pool)."""
    if layout == "BSHD":
        return q, k, v, None
    if layout == "BHSD":
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None
    B, S, H, D = k.shape
    page = 16
    pages = B * S // page
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(0))
    kp = torch.empty(pages, page, H, D, dtype=k.dtype, device=k.device)
    vp = torch.empty_like(kp)
    kp[order] = k.reshape(pages, page, H, D)
    vp[order] = v.reshape(pages, page, H, D)
    block_table = order.reshape(B, S // page).to(torch.int32).to(k.device)
    return q, kp, vp, block_table


def run_step(ld, layout, qs, ks, vs, lengths):
    outs = []
    for layer in range(ld.config.num_layers):
        q, k, v, bt = to_layout(layout, qs[layer], ks[layer], vs[layer])
        out = ld.decode_layer(layer, q, k, v, lengths, kv_layout=layout, block_table=bt)
        outs.append(out.transpose(1, 2) if layout == "BHSD" else out)
    return outs


def check_step(ld, outs, want_outs, want_table, batch):
    for got, want in zip(outs, want_outs):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=ATOL[torch.float32])
    indices, counts = ld.table_indices.cpu(), ld.table_counts.cpu()
    assert sorted(want_table) == list(range(batch * ld.config.num_kv_heads))
    for row, entries in want_table.items():
        assert counts[row].item() == len(entries), f"row {row}"
        assert indices[row, :len(entries)].tolist() == entries, f"row {row}"


def config(roles, **kw):
    base = dict(num_q_heads=6, head_dim=64, max_batch=3, max_kv_length=96, budget=20, sink=3, recent=5)
    base.update(kw)
    return kvsift.LycheeDecodeConfig(roles, **base)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD", "NHD"])
def test_token_mode_matches_reference(device, roles, layout):
    cfg = config(roles)
    ld = kvsift.LycheeDecode(cfg, device=device)
    assert ld.capacity == 20 and ld.table.indices.shape == (3, 3, 20)
    # Ragged lengths, one shorter than the budget (keeps all its tokens).
    qs, ks, vs, lengths = make_step(cfg, 2, 96, [96, 13], device, seed=1)
    outs = run_step(ld, layout, qs, ks, vs, lengths)
    want_outs, want_table = step_reference(cfg, qs, ks, vs, lengths.tolist())
    check_step(ld, outs, want_outs, want_table, 2)
    assert ld.next_layer == 0


def test_ratio_mode_matches_reference(device, roles):
    cfg = config(roles, selection="ratio", rho=0.75, max_kv_length=80)
    ld = kvsift.LycheeDecode(cfg, device=device)
    qs, ks, vs, lengths = make_step(cfg, 3, 96, [96, 50, 9], device, seed=2)  # 96 is clamped to 80
    outs = run_step(ld, "BSHD", qs, ks, vs, lengths)
    want_outs, want_table = step_reference(cfg, qs, ks, vs, lengths.tolist())
    check_step(ld, outs, want_outs, want_table, 3)


def test_block_mode_matches_reference(device, roles):
    cfg = config(roles, selection="block", block_size=16, num_blocks=3, sink_blocks=1, recent=5, max_kv_length=128)
    ld = kvsift.LycheeDecode(cfg, device=device)
    assert ld.table.block_size == 16
    # 83 = 5 blocks + 3 tokens: the last 5 tokens touch blocks 4 and 5.
    qs, ks, vs, lengths = make_step(cfg, 2, 128, [83, 128], device, seed=3)
    outs = run_step(ld, "BSHD", qs, ks, vs, lengths)
    want_outs, want_table = step_reference(cfg, qs, ks, vs, lengths.tolist())
    check_step(ld, outs, want_outs, want_table, 2)


def test_steps_with_changing_batch(device, roles):
    """The table needs no reset: a later step with a smaller batch and new lengths is its own."""
    cfg = config(roles)
    ld = kvsift.LycheeDecode(cfg, device=device)
    for seed, batch, lens in ((4, 3, [40, 96, 70]), (5, 1, [77])):
        qs, ks, vs, lengths = make_step(cfg, batch, 96, lens, device, seed=seed)
        outs = run_step(ld, "BSHD", qs, ks, vs, lengths)
        want_outs, want_table = step_reference(cfg, qs, ks, vs, lens)
        check_step(ld, outs, want_outs, want_table, batch)


def test_correct_layer_is_dense(device, roles):
    cfg = config(roles, correction_interval=4)
    assert [s for s in range(12) if cfg.correction_due(s)] == [3, 7, 11]
    ld = kvsift.LycheeDecode(cfg, device=device)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 6, 64, generator=g).to(device)
    k = torch.randn(2, 50, 3, 64, generator=g).to(device)
    v = torch.randn(2, 50, 3, 64, generator=g).to(device)
    lengths = torch.tensor([50, 30], dtype=torch.int32, device=device)
    before = ld.table_indices.clone()
    for layer in range(cfg.num_layers):
        out, lse = ld.correct_layer(layer, q, k, v, lengths, kv_layout="BSHD", return_lse=True)
    want, want_lse = attention_reference(q, k, v, [50, 30])
    torch.testing.assert_close(out.cpu().double(), want, rtol=0, atol=ATOL[torch.float32])
    torch.testing.assert_close(lse.cpu().double(), want_lse, rtol=0, atol=1e-5)
    assert torch.equal(ld.table_indices, before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_16bit(device, roles, dtype):
    cfg = config(roles)
    ld = kvsift.LycheeDecode(cfg, device=device)
    qs, ks, vs, lengths = make_step(cfg, 1, 96, [90], device, seed=7, dtype=dtype)
    outs = run_step(ld, "BSHD", qs, ks, vs, lengths)
    # Against the reference with the op's own selection: a 16-bit rounding can legitimately flip a
    # near-tie in the scores, so the table is taken from the op and only the attention is checked.
    rows = {r: ld.table_indices[r, :ld.table_counts[r]].tolist() for r in range(3)}
    for layer, out in enumerate(outs):
        assert out.dtype == dtype
    want_last, _ = attention_reference(qs[3].double(), ks[3].double(), vs[3].double(), [90],
                                       keys_of=lambda b, h, n: None if h == 2 else rows[h])
    torch.testing.assert_close(outs[3].cpu().double(), want_last, rtol=0, atol=ATOL[dtype])


# ---- bad input ----

class TestErrors:
    def test_layer_out_of_order(self, roles):
        cfg = config(roles)
        ld = kvsift.LycheeDecode(cfg)
        qs, ks, vs, lengths = make_step(cfg, 1, 96, [50], "cpu", seed=8)
        ld.decode_layer(0, qs[0], ks[0], vs[0], lengths, kv_layout="BSHD")
        with pytest.raises(ValueError, match=r"layer = 2 is out of order: this step expects layer 1"):
            ld.decode_layer(2, qs[2], ks[2], vs[2], lengths, kv_layout="BSHD")
        ld.restart_step()
        ld.decode_layer(0, qs[0], ks[0], vs[0], lengths, kv_layout="BSHD")

    def test_batch_changes_within_step(self, roles):
        cfg = config(roles)
        ld = kvsift.LycheeDecode(cfg)
        qs, ks, vs, lengths = make_step(cfg, 2, 96, [50, 60], "cpu", seed=9)
        ld.decode_layer(0, qs[0], ks[0], vs[0], lengths, kv_layout="BSHD")
        with pytest.raises(ValueError, match=r"kv\.batch = 1 changed within a step"):
            ld.decode_layer(1, qs[1][:1], ks[1][:1], vs[1][:1], lengths[:1], kv_layout="BSHD")

    def test_batch_above_max(self, roles):
        cfg = config(roles, max_batch=1)
        qs, ks, vs, lengths = make_step(cfg, 2, 96, [50, 60], "cpu", seed=9)
        with pytest.raises(ValueError, match=r"kv\.batch = 2 must be in \[0, max_batch = 1\]"):
            kvsift.LycheeDecode(cfg).decode_layer(0, qs[0], ks[0], vs[0], lengths, kv_layout="BSHD")

    def test_q_len(self, roles):
        cfg = config(roles)
        q = torch.randn(1, 2, 6, 64)
        k = torch.randn(1, 96, 3, 64)
        with pytest.raises(ValueError, match=r"q_len = 2 must be 1"):
            kvsift.LycheeDecode(cfg).decode_layer(0, q, k, k, torch.tensor([50], dtype=torch.int32), kv_layout="BSHD")

    def test_q_heads(self, roles):
        cfg = config(roles)
        q = torch.randn(1, 1, 3, 64)
        k = torch.randn(1, 96, 3, 64)
        with pytest.raises(ValueError, match=r"q has 3 query heads but num_q_heads = 6"):
            kvsift.LycheeDecode(cfg).decode_layer(0, q, k, k, torch.tensor([50], dtype=torch.int32), kv_layout="BSHD")

    def test_config_fields(self, roles):
        with pytest.raises(ValueError, match=r"budget = 6 is smaller than sink \+ recent = 8"):
            kvsift.LycheeDecode(config(roles, budget=6))
        with pytest.raises(NotImplementedError, match=r"head_dim = 96 is not supported"):
            kvsift.LycheeDecode(config(roles, head_dim=96))
        with pytest.raises(ValueError, match=r"selection = 'topp' must be one of token, ratio, block"):
            kvsift.LycheeDecode(config(roles, selection="topp"))
        with pytest.raises(ValueError, match=r"block_size = 24 must be a power of two"):
            kvsift.LycheeDecode(config(roles, selection="block", block_size=24))

    def test_layer0_sparse(self):
        bad = kvsift.HeadRoles.parse("kvsift-head-roles v1 layers=2 kv_heads=2\nRS\nRR\n")
        with pytest.raises(ValueError, match=r"layer 0, KV head 1 is sparse; layer 0 must be all retrieval"):
            kvsift.LycheeDecode(config(bad))

    def test_correction_off(self, roles):
        cfg = config(roles)
        q = torch.randn(1, 1, 6, 64)
        k = torch.randn(1, 96, 3, 64)
        with pytest.raises(ValueError, match=r"correction_interval = 0"):
            kvsift.LycheeDecode(cfg).correct_layer(0, q, k, k, torch.tensor([50], dtype=torch.int32), kv_layout="BSHD")

    def test_table_tensors(self, roles):
        cfg = config(roles)
        ld = kvsift.LycheeDecode(cfg)
        qs, ks, vs, lengths = make_step(cfg, 1, 96, [50], "cpu", seed=10)
        args = (qs[0], ks[0], vs[0], lengths, ld.table_indices[:, :5], ld.table_counts, 0, 0, 0, *cfg.op_args(), "BSHD")
        with pytest.raises(ValueError, match=r"table_indices must be a contiguous int32 \[max_batch \* num_kv_heads, "
                                             r"capacity\] = \[9, 20\]"):
            torch.ops.kvsift.lycheedecode_layer(*args)

    def test_bad_page(self, roles):
        cfg = config(roles)
        qs, ks, vs, lengths = make_step(cfg, 1, 96, [50], "cpu", seed=11)
        q, kp, vp, bt = to_layout("NHD", qs[0], ks[0], vs[0])
        bt[0, 1] = 99
        with pytest.raises(ValueError, match=r"block_table"):
            kvsift.LycheeDecode(cfg).decode_layer(0, q, kp, vp, lengths, kv_layout="NHD", block_table=bt)


def test_opcheck(device, roles):
    cfg = config(roles)
    ld = kvsift.LycheeDecode(cfg, device=device)
    qs, ks, vs, lengths = make_step(cfg, 2, 96, [96, 40], device, seed=12)
    torch.library.opcheck(torch.ops.kvsift.lycheedecode_layer.default,
                          (qs[0], ks[0], vs[0], lengths, ld.table_indices, ld.table_counts, 0, 0, 0,
                           *cfg.op_args(), "BSHD"))


def test_compile_fullgraph_step(device, roles):
    """A whole step under torch.compile(fullgraph=True): the layer op's fake kernel and its in-place
    table writes trace without a graph break, and the compiled step equals the eager one."""
    torch._dynamo.reset()
    cfg = config(roles)
    qs, ks, vs, lengths = make_step(cfg, 2, 96, [96, 40], device, seed=13)
    ld = kvsift.LycheeDecode(cfg, device=device)

    def step(qs, ks, vs, lengths):
        return [ld.decode_layer(l, qs[l], ks[l], vs[l], lengths, kv_layout="BSHD") * 2 for l in range(cfg.num_layers)]

    eager = step(qs, ks, vs, lengths)
    table = ld.table_indices.clone()
    ld.table_indices.fill_(-7)
    # aot_eager: dynamo + AOT autograd with the fake kernel and functionalized table writes, without
    # inductor's C++ codegen (which test_compile.py covers, and which costs tens of seconds on CPU).
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(qs, ks, vs, lengths)
    for x, y in zip(compiled, eager):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    rows = 2 * cfg.num_kv_heads  # the rows of this batch's sequences; the rest are not written
    assert torch.equal(ld.table_indices[:rows], table[:rows]) and ld.next_layer == 0
