#!/usr/bin/env python3
"""Torch baselines for bench_decode_attention, on the same shapes (Llama-3-8B layer: 32 query heads,
8 KV heads, head_dim 128, bf16, one query token):

- dense decode: F.scaled_dot_product_attention(enable_gqa=True) with the cuDNN and the flash backends;
- gathered decode: per (batch, KV head) 4096 selected tokens (or 64 blocks of 64), torch.gather of
  K and V followed by SDPA (cuDNN), timed together, which is what a torch implementation would run.

Timing: CUDA events around each call, L2 flushed before each (a memset over 2x the L2 size), median
of the iterations. Prints one table.
"""
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128
ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 30


def time_us(fn):
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(ITERS):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def sdpa(backend, q, k, v):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def kv_bytes(b, tokens_per_head):
    return 2 * b * HKV * tokens_per_head * D * 2


def main():
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows = []
    for b, s in [(1, 32768), (1, 131072), (8, 32768), (8, 131072)]:
        q = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, HKV, s, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        for name, backend in [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
            try:
                us = time_us(lambda: sdpa(backend, q, k, v))
                rows.append((f"dense SDPA {name}", b, s, us, kv_bytes(b, s) / us * 1e-6))
            except Exception as e:  # a backend may refuse GQA or this shape
                rows.append((f"dense SDPA {name}", b, s, float("nan"), float("nan")))
                print(f"# {name} B={b} S={s}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        if s == 131072:
            for gran in (1, 64):
                n_units = s // gran
                sel = torch.rand(b, HKV, n_units, device="cuda").topk(4096 // gran, dim=-1).indices.sort(-1).values
                tok = (sel[..., None] * gran + torch.arange(gran, device="cuda")).reshape(b, HKV, 4096)
                idx = tok[..., None].expand(b, HKV, 4096, D)

                def gathered():
                    kg = torch.gather(k, 2, idx)
                    vg = torch.gather(v, 2, idx)
                    return sdpa(SDPBackend.CUDNN_ATTENTION, q, kg, vg)

                try:
                    us = time_us(gathered)
                    rows.append((f"gather({'token' if gran == 1 else 'block64'})+SDPA cuDNN", b, s, us,
                                 kv_bytes(b, 4096) / us * 1e-6))
                except Exception as e:
                    print(f"# gather+SDPA B={b}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        del q, k, v
        torch.cuda.empty_cache()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, cold L2, median of {ITERS}")
    print(f"{'baseline':40s} {'B':>3s} {'S':>7s} {'us':>10s} {'TB/s':>7s}")
    for name, b, s, us, tbps in rows:
        print(f"{name:40s} {b:3d} {s:7d} {us:10.1f} {tbps:7.2f}")


if __name__ == "__main__":
    main()
