#!/usr/bin/env python3
"""kvsift's decode-attention and top-k benchmark rows beside FlashInfer's, from one device call.

    scripts/compare-flashinfer.py KVSIFT.json [KVSIFT.json ...] FLASHINFER.csv [--launch graph|direct]

KVSIFT.json: Google Benchmark output of bench_decode_attention and/or bench_topk
(--benchmark_out=FILE --benchmark_out_format=json); FLASHINFER.csv: the peer benchmark's CSV
(columns op,variant,rows_or_batch,n_or_kvlen,k_or_selected,page_size,us_median,...,valid,GBps,launch),
written in the same call. Prints one Markdown table per op: per kvsift row its median, the floor
(the bytes the benchmark counts over the read ceiling it measured), the fraction of that ceiling,
FlashInfer's best validated variant on the same shape and the ratio (> 1: kvsift is faster).

Shapes matched: dense decode (contiguous or paged, any page size) against FlashInfer's dense rows of
that batch and length; token gathers of 4096 against its page-1 gathers of 4096; top-k rows x n, k
(no forced sink or recent tokens) against its top-k of that shape. Rows without a counterpart show "—".
Only FlashInfer rows marked valid and launched as `--launch` (default graph: kvsift's harness replays
graphs) count. Standard library only.
"""
import argparse
import csv
import json
import re
import sys


def kvsift_rows(paths):
    """(op, key, label, us, floor_us, of_ceiling) for every kvsift row with a counterpart shape."""
    for path in paths:
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                if b.get("run_type", "iteration") != "iteration" or "us_median" not in b:
                    continue
                name, us = b["name"], b["us_median"]
                ceiling = b["TB/s"] / b["of_ceiling"] if b.get("of_ceiling") else 0.0
                floor = b["MB"] / ceiling if ceiling > 0 and "MB" in b else float("nan")
                frac = b.get("of_ceiling", float("nan"))
                parts = name.split("/")
                if parts[0] in ("BM_Contiguous", "BM_Paged") and len(parts) >= 5:
                    kind, batch, length = parts[1], int(parts[2]), int(parts[3])
                    if kind == "dense":
                        yield "decode", ("dense", batch, length), name, us, floor, frac
                    elif kind.startswith("gather_token_4096"):
                        yield "decode", ("gather4096", batch, length), name, us, floor, frac
                    else:
                        yield "decode", None, name, us, floor, frac
                elif parts[0] == "BM_TopK":
                    args = dict(re.findall(r"(\w+):(-?\d+)", name))
                    if args.get("sink", "0") == "0" and args.get("recent", "0") == "0":
                        key = (int(args["rows"]), int(args["n"]), int(args["k"]))
                        yield "topk", key, name, us, floor, frac


def flashinfer_best(path, launch):
    """{(op, key): (us, variant)}: the fastest valid FlashInfer variant per shape."""
    best = {}
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            if r.get("valid") != "PASS" or r.get("launch") != launch:
                continue
            a, n, k = int(r["rows_or_batch"]), int(r["n_or_kvlen"]), int(r["k_or_selected"])
            if r["op"] == "decode":
                key = ("decode", ("dense", a, n) if k == 0 else ("gather4096", a, n) if k == 4096 else None)
            elif r["op"] == "topk":
                key = ("topk", (a, n, k))
            else:
                continue
            us = float(r["us_median"])
            if key[1] is not None and (key not in best or us < best[key][0]):
                best[key] = (us, r["variant"])
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="kvsift JSON file(s), then the FlashInfer CSV")
    ap.add_argument("--launch", default="graph", choices=("graph", "direct"))
    args = ap.parse_args()
    if len(args.files) < 2:
        ap.error("need at least one kvsift JSON and the FlashInfer CSV")
    best = flashinfer_best(args.files[-1], args.launch)
    tables = {}
    for op, key, name, us, floor, frac in kvsift_rows(args.files[:-1]):
        fi = best.get((op, key)) if key is not None else None
        fi_cell = f"{fi[0]:.1f} ({fi[1]})" if fi else "—"
        ratio = f"{fi[0] / us:.2f}×" if fi else "—"
        tables.setdefault(op, []).append(f"| {name} | {us:.1f} | {floor:.1f} | {frac:.0%} | {fi_cell} | {ratio} |")
    if not tables:
        print("no kvsift rows found", file=sys.stderr)
        return 1
    for op, rows in tables.items():
        print(f"\n{op} (FlashInfer: its best valid variant, {args.launch} launches, same call)\n")
        print("| kvsift row | kvsift µs | floor µs | of the read ceiling | FlashInfer µs (variant) | FlashInfer / kvsift |")
        print("|---|---|---|---|---|---|")
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
