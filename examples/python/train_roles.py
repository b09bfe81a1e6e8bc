"""End-to-end HardKuma role training (LycheeDecode's objective) on a passkey checkpoint, then the passkey
accuracy of the learned roles.

The student mixes each (layer >= 1, KV head)'s dense and sparse attention outputs by a HardKuma gate;
the loss is the squared distance of its logits to the dense teacher's on the passkey digits plus the
Lagrangian term lambda * relu(E||z||_0 - N_target) / N (kvsift.training, docs/python.md "Role training").

    PYTHONPATH=python python examples/python/train_roles.py --model DIR --roles-out learned.roles \
        [--device cuda] [--lengths 1024 --limit 16 --steps 300] [--eval-lengths 1024,2048 --eval-limit 16]

DIR is a transformers Llama checkpoint with prompts_train.txt (training) and prompts_shared.txt
(evaluation) in the passkey format. Evaluation runs through kvsift.hf (kvsift's decode ops) at each
--eval-budgets value, beside --compare roles files (e.g. the C++ trainer's) and layer 0 alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import kvsift
from kvsift.training import RoleTrainingConfig, passkey_accuracy, read_passkey_prompts, train_roles


def ints(text: str):
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path, help="checkpoint folder (config.json, prompt files)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: the student's matmuls are tiny, and several threads on shared cores "
                        "spin-wait; measured 25x slower with 2 threads beside another build)")
    p.add_argument("--train-prompts", type=Path, help="default: MODEL/prompts_train.txt")
    p.add_argument("--lengths", type=ints, default=[1024], help="training prompt lengths (comma-separated)")
    p.add_argument("--limit", type=int, default=16, help="training prompts per length")
    p.add_argument("--target-heads", type=int, default=2, help="N_target: retrieval heads beyond layer 0")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--lambda-lr", type=float, default=1e-3)
    p.add_argument("--budget", type=int, default=128, help="the student's selection budget")
    p.add_argument("--sink", type=int, default=8)
    p.add_argument("--recent", type=int, default=16)
    p.add_argument("--constraint", default="one_sided", choices=["one_sided", "two_sided"])
    p.add_argument("--loss-norm", default="teacher", choices=["teacher", "none"])
    p.add_argument("--chain", default="retrieval", choices=["retrieval", "previous_layer"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--roles-out", type=Path, help="write the learned roles file here")
    p.add_argument("--eval-prompts", type=Path, help="default: MODEL/prompts_shared.txt")
    p.add_argument("--eval-lengths", type=ints, default=[1024, 2048], help="empty: no evaluation")
    p.add_argument("--eval-limit", type=int, default=16, help="evaluation prompts per length")
    p.add_argument("--eval-budgets", type=ints, default=[128, 64])
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--compare", type=Path, action="append", default=[], help="another roles file to evaluate")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()

    import transformers

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32,
                                                              attn_implementation="sdpa").to(args.device).eval()
    train_file = args.train_prompts or args.model / "prompts_train.txt"
    prompts = [q for n in args.lengths for q in read_passkey_prompts(train_file, n, args.limit)]
    if not prompts:
        print(f"no training prompts of lengths {args.lengths} in {train_file}", file=sys.stderr)
        return 2
    cfg = RoleTrainingConfig(target_heads=args.target_heads, steps=args.steps, prompts_per_step=args.prompts_per_step,
                             budget=args.budget, sink=args.sink, recent=args.recent, lr=args.lr,
                             lambda_lr=args.lambda_lr, constraint=args.constraint, loss_norm=args.loss_norm, chain=args.chain, seed=args.seed,
                             log_every=args.log_every)
    result = train_roles(model, prompts, cfg)
    total = time.perf_counter() - t_start
    print(f"prompts {len(prompts)} (lengths {args.lengths}); prepare {result.prepare_seconds:.1f} s, "
          f"train {result.train_seconds:.1f} s ({args.steps} steps), total with model load {total:.1f} s")
    print("E[Kuma(a, b)] per gate (layers >= 1):")
    for l, row in enumerate(result.kuma_mean.tolist(), 1):
        print(f"  layer {l}: " + "  ".join(f"{x:.3f}" for x in row))
    print("learned retrieval heads beyond layer 0:", result.learned_heads())
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    provenance = [f"From examples/python/train_roles.py --lengths {','.join(map(str, args.lengths))} --limit {args.limit} "
                  f"({len(prompts)} prompts of prompts_train.txt) on {device_name}, "
                  f"prepare {result.prepare_seconds:.1f} s, train {result.train_seconds:.1f} s."]
    print(result.roles_file_text(provenance))
    if args.roles_out:
        result.save(str(args.roles_out), provenance)

    report = {"learned": result.learned_heads(), "prepare_s": result.prepare_seconds, "train_s": result.train_seconds,
              "history": result.history, "kuma_mean": result.kuma_mean.tolist(), "accuracy": {}}
    if args.eval_lengths:
        import kvsift.hf as hf

        c = model.config
        layer0 = kvsift.HeadRoles(c.num_hidden_layers, c.num_key_value_heads,
                                  tuple(tuple([i == 0] * c.num_key_value_heads) for i in range(c.num_hidden_layers)))
        role_sets = {"learned": result.roles, "layer 0 only": layer0}
        for path in args.compare:
            role_sets[path.name] = kvsift.HeadRoles.load(path, expected_layers=c.num_hidden_layers,
                                                         expected_kv_heads=c.num_key_value_heads)
        policies = {f"{name} @ {bud}": hf.make_policy("lycheedecode", roles=roles, budget=bud, sink=args.sink,
                                                       recent=args.recent)
                    for bud in args.eval_budgets for name, roles in role_sets.items()}
        policies["dense"] = hf.make_policy("dense")
        eval_file = args.eval_prompts or args.model / "prompts_shared.txt"
        for n in args.eval_lengths:
            eval_prompts = read_passkey_prompts(eval_file, n, args.eval_limit)
            t0 = time.perf_counter()
            counts = passkey_accuracy(model, eval_prompts, policies, batch=args.eval_batch)
            print(f"L={n}: {len(eval_prompts)} prompts, {time.perf_counter() - t0:.1f} s")
            for label, k in counts.items():
                print(f"  {label:40s} {k}/{len(eval_prompts)}")
            report["accuracy"][str(n)] = {label: [k, len(eval_prompts)] for label, k in counts.items()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
