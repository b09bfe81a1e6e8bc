"""One LycheeDecode decode step over a toy model's layers with kvsift.LycheeDecode.

Random K/V caches and queries stand in for a model: per layer, the retrieval heads attend densely and
select the top tokens, the sparse heads attend over the selection their KV-head index inherited from
the latest earlier retrieval layer. Compares each layer's output with dense attention.

    PYTHONPATH=python python examples/python/lycheedecode_step.py [--device cuda] [--length 4096]
"""

from __future__ import annotations

import argparse

import torch

import kvsift

ROLES = """kvsift-head-roles v1 layers=4 kv_heads=4
RRRR
RSSS
SRSS
SSRS
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--budget", type=int, default=256)
    args = p.parse_args()
    torch.manual_seed(0)

    roles = kvsift.HeadRoles.parse(ROLES)  # or kvsift.HeadRoles.load("model.roles")
    cfg = kvsift.LycheeDecodeConfig(roles, num_q_heads=8, head_dim=64, max_batch=2, max_kv_length=args.length,
                                    budget=args.budget, sink=16, recent=64)
    ld = kvsift.LycheeDecode(cfg, device=args.device)
    B, S, D = 2, args.length, cfg.head_dim
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    lengths = torch.tensor([S, S // 2], dtype=torch.int32, device=args.device)

    for layer in range(cfg.num_layers):  # one decode step: every layer, in order
        q = torch.randn(B, cfg.num_q_heads, 1, D, device=args.device, dtype=dtype)   # BHSD, the new token
        k = torch.randn(B, cfg.num_kv_heads, S, D, device=args.device, dtype=dtype)  # the cache, new token in
        v = torch.randn_like(k)
        out = ld.decode_layer(layer, q, k, v, lengths)
        dense = kvsift.decode_attention(q, k, v, lengths)
        err = (out.float() - dense.float()).abs().max().item()
        print(f"layer {layer}: sparse heads {roles.sparse_heads(layer)}, max |out - dense| = {err:.3f}")

    sel = ld.table
    print("index rows of sequence 0 (first 8 entries):", sel.indices[0, :, :8].tolist())
    print("counts:", sel.counts[:B].tolist())


if __name__ == "__main__":
    main()
