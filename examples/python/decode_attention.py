"""kvsift.decode_attention: dense, mixed (some KV heads over an index set) and paged decode attention.

Checks the dense output and lse against softmax(q k^T / sqrt(d)) v in float64, and the paged layout
against the contiguous one.

    PYTHONPATH=python python examples/python/decode_attention.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch

import kvsift


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--length", type=int, default=1024)
    args = p.parse_args()
    torch.manual_seed(0)
    dev, B, Hq, Hkv, S, D = args.device, 2, 8, 2, args.length, 64
    q = torch.randn(B, Hq, 1, D, device=dev)
    k = torch.randn(B, Hkv, S, D, device=dev)
    v = torch.randn_like(k)
    lengths = torch.tensor([S, S // 2], dtype=torch.int32, device=dev)

    out, lse = kvsift.decode_attention(q, k, v, lengths, kv_layout="BHSD", return_lse=True)
    for b in range(B):  # float64 reference, GQA: query head h reads KV head h // (Hq / Hkv)
        n = int(lengths[b])
        kk = k[b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        vv = v[b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        logits = q[b].double() @ kk.transpose(-1, -2) / D ** 0.5
        torch.testing.assert_close(out[b].double(), torch.softmax(logits, -1) @ vv, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lse[b].double(), torch.logsumexp(logits, -1), atol=1e-4, rtol=1e-4)
    print(f"dense: out {tuple(out.shape)}, lse {tuple(lse.shape)}: equals the float64 reference")

    # mixed: KV head 1 attends only over the top-64 tokens of its group-mean query's scores
    qbar = q[:, :, 0].reshape(B, Hkv, Hq // Hkv, D).mean(2)
    scores = torch.einsum("bhd,bhsd->bhs", qbar, k).reshape(B * Hkv, S).contiguous()
    sel = kvsift.topk(scores, 64, lengths=lengths.repeat_interleave(Hkv), sink=4, recent=8)
    mixed = kvsift.decode_attention(q, k, v, lengths, sparse_heads=[1], index_set=sel)
    same = torch.allclose(mixed[:, :4], out[:, :4])
    print(f"mixed: KV head 0 dense (equal to dense: {same}), KV head 1 over 64 tokens, "
          f"max |mixed - dense| on head 1's queries {float((mixed[:, 4:] - out[:, 4:]).abs().max()):.3f}")

    # paged: pages of 16 tokens in a shuffled pool, a block table per sequence
    page, pages = 16, S // 16
    perm = torch.randperm(B * pages, device=dev)
    k_pool = torch.empty(B * pages, page, Hkv, D, device=dev)
    v_pool = torch.empty_like(k_pool)
    k_pool[perm] = k.permute(0, 2, 1, 3).reshape(B * pages, page, Hkv, D)
    v_pool[perm] = v.permute(0, 2, 1, 3).reshape(B * pages, page, Hkv, D)
    table = perm.reshape(B, pages).to(torch.int32)
    paged = kvsift.decode_attention(q.transpose(1, 2).contiguous(), k_pool, v_pool, lengths, kv_layout="NHD",
                                    block_table=table)
    torch.testing.assert_close(paged.transpose(1, 2), out, atol=1e-5, rtol=1e-5)
    print(f"paged NHD: pool {tuple(k_pool.shape)}, block table {tuple(table.shape)}: equals the contiguous result")


if __name__ == "__main__":
    main()
