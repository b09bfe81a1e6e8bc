"""kvsift.topk: per row, the k best positions of [0, length) with sink and recent positions forced in.

Ragged lengths, then a check against torch.topk on the unforced middle of each row.

    PYTHONPATH=python python examples/python/topk.py [--device cuda]
"""

from __future__ import annotations

import argparse

import torch

import kvsift


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--k", type=int, default=64)
    args = p.parse_args()
    torch.manual_seed(0)
    rows, width, sink, recent = 8, 4096, 4, 16
    scores = torch.randn(rows, width, device=args.device)
    lengths = torch.randint(args.k, width + 1, (rows,), dtype=torch.int32, device=args.device)
    sel = kvsift.topk(scores, args.k, lengths=lengths, sink=sink, recent=recent)
    print(f"indices {tuple(sel.indices.shape)} int32, counts {sel.counts.tolist()}")
    for r in range(rows):
        n, c = int(lengths[r]), int(sel.counts[r])
        got = sel.indices[r, :c].tolist()               # ascending positions
        forced = set(range(sink)) | set(range(n - recent, n))
        middle = scores[r, sink : n - recent]
        best = torch.topk(middle, args.k - len(forced)).indices + sink
        assert set(got) == forced | set(best.tolist()), r
    print(f"row 0 (length {int(lengths[0])}): first 8 {sel.indices[0, :8].tolist()}, last 4 "
          f"{sel.indices[0, int(sel.counts[0]) - 4 : int(sel.counts[0])].tolist()}")
    print("every row = sink + recent + torch.topk of the rest: ok")


if __name__ == "__main__":
    main()
