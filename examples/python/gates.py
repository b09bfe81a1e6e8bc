"""HardKuma head gates in PyTorch: a few steps of LycheeDecode-style role training on a toy objective.

Each (layer, KV head) has a gate z = HardKuma(a, b) that mixes a "dense" and a "sparse" attention output;
the loss is the distance to the dense output plus a Lagrangian penalty lambda * (E||z||_0 / N - target).
Sampling and the expected L0 are kvsift ops whose backward is kvsift's closed form; the rest is torch
autograd. After training, the deterministic gate E[K] > 0.5 gives the roles file LycheeDecode reads.

    PYTHONPATH=python python examples/python/gates.py [--device cuda] [--steps 200]
"""

from __future__ import annotations

import argparse

import torch

import kvsift


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--target", type=float, default=0.25, help="desired density of retrieval heads")
    args = p.parse_args()
    torch.manual_seed(0)
    shape = (args.layers, args.kv_heads)

    # Raw free parameters initialised to 1 (Kuma(1, 1) = uniform), as LycheeDecode does.
    a = torch.ones(shape, device=args.device, requires_grad=True)
    b = torch.ones(shape, device=args.device, requires_grad=True)
    opt = torch.optim.Adam([a, b], lr=0.02)
    # A toy teacher: how much each head's sparse output differs from its dense one (bigger = needs R).
    importance = torch.rand(shape, device=args.device) ** 3
    lam = 2.0

    for step in range(args.steps):
        u = kvsift.hardkuma_noise(shape, device=args.device)          # u ~ U(1e-3, 1 - 1e-3)
        z = kvsift.hardkuma_sample(a, b, u)                           # differentiable in a, b
        task = (importance * (1 - z)).square().sum()                  # distance to the dense output
        density = kvsift.hardkuma_expected_l0(a, b, reduction="mean")  # closed-form E||z||_0 / N
        loss = task + lam * (density - args.target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lam = min(20.0, lam * float(torch.exp(0.01 * (density.detach() - args.target).clamp(min=0))))
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  density {density.item():.3f}  lambda {lam:.3f}")

    stats = kvsift.hardkuma_stats(a.detach(), b.detach())
    print("E[K] per gate:\n", stats.kuma_mean.cpu())
    print("eval gate (E[K] > 0.5):\n", kvsift.hardkuma_eval_gate(a, b).cpu())
    roles = kvsift.head_roles_from_gates(a, b)  # layer 0 forced to retrieval
    print(roles.format())


if __name__ == "__main__":
    main()
