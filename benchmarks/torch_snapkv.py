#!/usr/bin/env python3
"""PyTorch SnapKV selection and compaction on the shapes of bench_prompt_compression, the baseline
for kvsift's prompt compression. Written for the benchmark from the SnapKV description: the last W
queries attend to the whole prompt (causal inside the window), fp32 softmax over the full row,
column sums over the window for the prefix, group mean over each KV head's query heads, max-pool
(kernel 7, stride 1, padding 3), top-(Cp - W), ascending, gather K/V and append the window.
Timed like kvsift's benchmarks: CUDA events around each call, L2 flushed before every iteration,
median of the iterations. Usage: torch_snapkv.py [iterations]"""
import math
import statistics
import sys

import torch
import torch.nn.functional as F

KV_HEADS, Q_HEADS, HEAD_DIM, WINDOW = 8, 32, 128, 32


def snapkv(q_win, k, v, cp, kernel=7):
    b, hq, w, d = q_win.shape
    hkv, length = k.shape[1], k.shape[2]
    g = hq // hkv
    logits = torch.einsum("bhgwd,bhld->bhgwl", q_win.view(b, hkv, g, w, d).float(), k.float()) / math.sqrt(d)
    pos = torch.arange(length, device=k.device)
    query_pos = length - w + torch.arange(w, device=k.device)
    logits.masked_fill_(pos[None, :] > query_pos[:, None], float("-inf"))
    attn = torch.softmax(logits, dim=-1)
    prefix = length - w
    scores = attn[..., :prefix].sum(dim=-2).mean(dim=2)  # [b, hkv, prefix]
    pooled = F.max_pool1d(scores, kernel_size=kernel, stride=1, padding=kernel // 2)
    idx = pooled.topk(cp - w, dim=-1).indices.sort(dim=-1).values
    gather = idx[..., None].expand(-1, -1, -1, d)
    k_new = torch.cat([k[:, :, :prefix].gather(2, gather), k[:, :, prefix:]], dim=2)
    v_new = torch.cat([v[:, :, :prefix].gather(2, gather), v[:, :, prefix:]], dim=2)
    return k_new, v_new


def time_call(fn, flush, iters):
    for _ in range(2):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        flush.zero_()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if not torch.cuda.is_available():
        print("torch_snapkv.py: no CUDA device")
        return
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * getattr(props, "L2_cache_size", 64 << 20), dtype=torch.uint8, device="cuda")
    print(f"# torch {torch.__version__} on {props.name}; SnapKV selection + compaction, bf16, "
          f"{Q_HEADS} q heads / {KV_HEADS} kv heads, d={HEAD_DIM}, W={WINDOW}; median of {iters}, L2 flushed")
    print(f"{'batch':>5} {'len':>7} {'cp':>5} {'torch_us':>10}")
    for batch in (1, 8):
        for length in (32768, 131072):
            k = torch.randn(batch, KV_HEADS, length, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            q = torch.randn(batch, Q_HEADS, WINDOW, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            for cp in (1024, 2048, 4096):
                try:
                    us = time_call(lambda: snapkv(q, k, v, cp), flush, iters)
                    print(f"{batch:>5} {length:>7} {cp:>5} {us:>10.1f}", flush=True)
                except torch.OutOfMemoryError:
                    print(f"{batch:>5} {length:>7} {cp:>5} {'OOM':>10}", flush=True)
                    torch.cuda.empty_cache()
            del k, v, q
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
