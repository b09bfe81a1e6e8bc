#!/usr/bin/env python3
"""torch.topk(x, k, sorted=False) on the shapes of bench_topk, timed like kvsift's benchmarks:
CUDA events around each call, L2 flushed before every iteration, median of the iterations."""
import statistics
import sys

import torch


def shapes():
    for rows in (8, 32, 64, 256):
        for n in (32768, 131072):
            for k in (1024, 2048, 4096):
                yield rows, n, k
    for rows in (8, 64, 256):
        yield rows, 2048, 64


def time_topk(x, k, flush, iters):
    for _ in range(3):
        torch.topk(x, k, dim=-1, sorted=False)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        flush.zero_()
        start.record()
        torch.topk(x, k, dim=-1, sorted=False)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if not torch.cuda.is_available():
        print("torch_topk.py: no CUDA device")
        return
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 64 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"torch {torch.__version__} on {props.name}; median of {iters}, L2 flushed")
    print(f"{'rows':>5} {'n':>7} {'k':>5} {'torch.topk us':>14}")
    for rows, n, k in shapes():
        x = torch.rand(rows, n, device="cuda", generator=gen) * 2 - 1
        us = time_topk(x, k, flush, iters)
        print(f"{rows:>5} {n:>7} {k:>5} {us:>14.1f}")
        del x


if __name__ == "__main__":
    main()
