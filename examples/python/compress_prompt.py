"""kvsift.compress_prompt: one layer's prompt cache compressed after prefill, for each policy.

A synthetic prompt whose last queries look at a few "needle" tokens: ClusterAttn and SnapKV keep them,
StreamingLLM (sinks + the recent tail) does not. Then decode attention over the compressed cache.

    PYTHONPATH=python python examples/python/compress_prompt.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch

import kvsift


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.manual_seed(0)
    dev, B, Hq, Hkv, S, D, W = args.device, 1, 4, 2, 2048, 64, 16
    k = torch.randn(B, Hkv, S, D, device=dev)
    v = torch.randn_like(k)
    needles = [300, 301, 302, 1200, 1201]
    queries = torch.randn(B, Hq, W, D, device=dev) * 0.1
    direction = torch.randn(D, device=dev)
    k[:, :, needles] += 4 * direction          # the needles answer the window's queries
    queries += direction                        # (every query head leans the same way)
    lengths = torch.tensor([S], dtype=torch.int32, device=dev)

    for cfg in (kvsift.PromptCompressionConfig("ClusterAttn", capacity=128, window=W, num_block=128, theta=0.5),
                kvsift.PromptCompressionConfig("SnapKV", capacity=128, window=W),
                kvsift.PromptCompressionConfig("StreamingLLM", capacity=128, window=W)):
        c = kvsift.compress_prompt(k, v, lengths, queries, cfg, kv_layout="BHSD")
        kept = set(c.positions[0, 0, : int(c.lengths[0])].tolist())
        q = queries[:, :, -1:].contiguous()
        out = kvsift.decode_attention(q, c.k, c.v, c.lengths)   # attention over the compressed prompt
        print(f"{cfg.policy:12s}: cache {tuple(c.k.shape)}, length {int(c.lengths[0])}, "
              f"needles kept {sum(n in kept for n in needles)}/{len(needles)}, out {tuple(out.shape)}")


if __name__ == "__main__":
    main()
