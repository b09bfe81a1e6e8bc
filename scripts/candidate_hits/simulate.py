#!/usr/bin/env python3
"""How often LycheeDecode's score candidates would hold on learned attention (CPU, numpy only).

Runs the passkey-llama-13m checkpoint (a trained Llama, ../shared/models in the workspace) on its
evaluation prompts: dense prefill, then greedy decode steps, in float32 with a KV cache. At every decode
step, for every layer and KV head, it forms the raw group-mean score row LycheeDecode's retrieval heads
emit (s_t = mean over the group's query heads of q . k_t, post-RoPE, no scale) and replays the score
candidates' threshold rule (next_candidate_threshold, include/kvsift/ops/score_candidates.hpp, ported
below): a step's list holds every scored-region position at or above the threshold the step before
left; it is used when it holds the budget and fits the capacity (twice the budget, as 8192 keys for a
4096 budget at 128K), else the full search runs and re-seeds the threshold from its bracket (here: the
score at rank 1.25 x budget + 64, about where the sampled bracket ends).

Usage: simulate.py MODEL_DIR [--lengths 2048] [--steps 32] [--prompts 4]
Prints, per (length, budget), the fraction of (step, layer, head) selections that used the list and
the list's mean size over the budget.
"""
import argparse
import json
import math
import struct

import numpy as np


def load(model_dir):
    index = json.load(open(model_dir + "/model.safetensors.index.json"))["weight_map"]
    w = {}
    for shard in sorted(set(index.values())):
        with open(model_dir + "/" + shard, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            assert t["dtype"] == "BF16"
            u = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            w[name] = u.view(np.float32).reshape(t["shape"])
    return w


def next_threshold(kth, used, listed, budget, extra_fraction=0.25):
    extra = float(int(budget * extra_fraction) + 64)
    scale = extra / float(listed - budget) if listed > budget else 8.0
    scale = min(max(scale, 0.125), 8.0)
    gap = kth - used
    t = kth - gap * scale
    if gap == 0.0:
        return used
    return t if (gap > 0.0 and math.isfinite(t)) else math.nan


class Llama:
    def __init__(self, w, cfg):
        self.w, self.cfg = w, cfg
        self.hq, self.hkv, self.d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.layers = cfg["num_hidden_layers"]
        inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, self.d, 2, dtype=np.float64) / self.d))
        pos = np.arange(cfg["max_position_embeddings"], dtype=np.float64)[:, None] * inv[None, :]
        ang = np.concatenate([pos, pos], axis=1)
        self.cos, self.sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    def norm(self, x, name):
        v = (x * x).mean(-1, keepdims=True)
        return x / np.sqrt(v + self.cfg["rms_norm_eps"]) * self.w[name]

    def rope(self, x, positions):  # x [n, heads, d]
        h = self.d // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return x * self.cos[positions][:, None, :] + rot * self.sin[positions][:, None, :]

    def forward(self, ids, cache, queries):
        """ids [n] at positions len(cache) ...; appends K/V; queries[l] = the last position's q [hq, d]."""
        w, n = self.w, len(ids)
        start = cache[0][0].shape[0] if cache[0] is not None else 0
        positions = np.arange(start, start + n)
        x = w["model.embed_tokens.weight"][ids]
        for l in range(self.layers):
            p = f"model.layers.{l}."
            h = self.norm(x, p + "input_layernorm.weight")
            q = self.rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, self.hq, self.d), positions)
            k = self.rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, self.hkv, self.d), positions)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, self.hkv, self.d)
            if cache[l] is None:
                cache[l] = (k, v)
            else:
                cache[l] = (np.concatenate([cache[l][0], k]), np.concatenate([cache[l][1], v]))
            K, V = cache[l]
            queries[l] = q[-1]
            g = self.hq // self.hkv
            out = np.empty((n, self.hq, self.d), dtype=np.float32)
            for c0 in range(0, n, 256):  # causal attention in query chunks
                c1 = min(n, c0 + 256)
                for hh in range(self.hq):
                    s = q[c0:c1, hh] @ K[:, hh // g].T / math.sqrt(self.d)  # [chunk, T]
                    qpos = positions[c0:c1][:, None]
                    s = np.where(np.arange(K.shape[0])[None, :] <= qpos, s, -np.inf)
                    s = np.exp(s - s.max(-1, keepdims=True))
                    out[c0:c1, hh] = (s / s.sum(-1, keepdims=True)) @ V[:, hh // g]
            x = x + out.reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate = h @ w[p + "mlp.gate_proj.weight"].T
            up = h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        x = self.norm(x[-1], "model.norm.weight")
        return x @ w["lm_head.weight"].T


def read_prompts(path, length, count):
    out = []
    for line in open(path):
        ids = [int(t) for t in line.split("|")[1].split()]
        if len(ids) == length:
            out.append(ids)
        if len(out) == count:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--budget-fractions", default="0.03125,0.0625,0.125")
    ap.add_argument("--sink", type=int, default=8)
    ap.add_argument("--recent", type=int, default=16)
    ap.add_argument("--variants", default="0.25:2",
                    help="rule variants EXTRA:CAPACITY, comma-separated: the target's extra over the budget "
                         "and the list's capacity, in budgets (the kernel today: 0.25:2)")
    args = ap.parse_args()
    cfg = json.load(open(args.model + "/config.json"))
    m = Llama(load(args.model), cfg)
    g = m.hq // m.hkv
    fractions = [float(x) for x in args.budget_fractions.split(",")]
    variants = [tuple(float(y) for y in v.split(":")) for v in args.variants.split(",")]
    fractions = [(f, v) for f in [float(x) for x in args.budget_fractions.split(",")] for v in variants]
    for length in [int(x) for x in args.lengths.split(",")]:
        stats = {f: [0, 0, 0.0, 0, 0] for f in fractions}  # used, selections, sum of listed / budget, short, over
        for ids in read_prompts(args.model + "/prompts_shared.txt", length, args.prompts):
            cache, queries = [None] * m.layers, [None] * m.layers
            thresholds = {f: {} for f in fractions}
            token = int(np.argmax(m.forward(np.array(ids), cache, queries)))
            for step in range(args.steps + 1):  # step 0 seeds every threshold with a full search
                token = int(np.argmax(m.forward(np.array([token]), cache, queries)))
                for l in range(m.layers):
                    K = cache[l][0]  # [T, hkv, d]
                    qm = queries[l].reshape(m.hkv, g, m.d).mean(axis=1)
                    scores = np.einsum("hd,thd->ht", qm, K)
                    n = scores.shape[1]
                    for f in fractions:
                        budget = max(1, int(f[0] * n) - args.sink - args.recent)
                        extra_fraction, capacity_budgets = f[1]
                        capacity = int(capacity_budgets * budget) + 64
                        for h in range(m.hkv):
                            region = scores[h, args.sink:n - args.recent]
                            srt = -np.sort(-region)
                            kth = float(srt[budget - 1])
                            t = thresholds[f].get((l, h), math.nan)
                            listed = int((region >= t).sum()) if not math.isnan(t) else 0
                            used = step > 0 and budget <= listed <= capacity
                            if step > 0:
                                stats[f][0] += used
                                stats[f][1] += 1
                                stats[f][2] += listed / budget
                                stats[f][3] += listed < budget
                                stats[f][4] += listed > capacity
                            if used:
                                thresholds[f][(l, h)] = next_threshold(kth, t, listed, budget, extra_fraction)
                            else:
                                rank = min(len(srt), int(1.25 * budget) + 64)
                                thresholds[f][(l, h)] = next_threshold(kth, float(srt[rank - 1]), rank, budget,
                                                                       extra_fraction)
        for f in fractions:
            u, n, s, short, over = stats[f]
            print(f"length {length}, budget {f[0]:.4f} of the row, extra {f[1][0]}, capacity {f[1][1]}: list used {u}/{n} = {u / max(n, 1):.3f} "
                  f"(short {short}, over capacity {over}), mean list / budget {s / max(n, 1):.2f}", flush=True)


if __name__ == "__main__":
    main()
