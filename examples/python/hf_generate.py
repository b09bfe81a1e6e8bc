#!/usr/bin/env python3
"""Greedy generation with a Hugging Face Llama / Qwen3 model decoding through kvsift.

    python examples/python/hf_generate.py --model DIR --prompt "Once upon a time" --policy clusterattn \
        --capacity 1024 --window 32
    # the passkey checkpoint (docs/fidelity.md): prompt 0 of 2048 tokens under LycheeDecode, against dense
    python examples/python/hf_generate.py --model $KVSIFT_TEST_MODEL_DIR --prompt-file prompts_shared.txt \
        --prompt-length 2048 --policy lycheedecode --roles examples/minimal_decoder/roles/passkey-llama-13m.roles \
        --max-new-tokens 5 --compare

Everything kvsift-specific is the one call ``kvsift.hf.enable(model, policy, **options)``; ``generate``
is transformers' own. Needs transformers (5.x) and kvsift (pip install ./python).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face checkpoint folder (LlamaForCausalLM / Qwen3ForCausalLM)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the checkpoint's tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, space separated")
    src.add_argument("--prompt-file", help="a passkey prompt file ('ANSWER d1..d5 | ids' lines), relative to --model or a path")
    p.add_argument("--prompt-length", type=int, default=None, help="--prompt-file: the first prompt of this many tokens")
    p.add_argument("--policy", default="dense", help="dense, clusterattn, snapkv, streamingllm, h2o, lycheedecode")
    p.add_argument("--capacity", type=int, default=128, help="compressing policies: tokens kept per KV head")
    p.add_argument("--window", type=int, default=8, help="compressing policies: observation window")
    p.add_argument("--theta", type=float, default=0.5, help="clusterattn: density threshold")
    p.add_argument("--num-block", type=int, default=128, help="clusterattn: cluster granularity")
    p.add_argument("--roles", help="lycheedecode: roles file")
    p.add_argument("--budget", type=int, default=128, help="lycheedecode: tokens per sparse head")
    p.add_argument("--page-size", type=int, default=None, help="a paged cache with pages of this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--compare", action="store_true", help="also generate with transformers' SDPA attention")
    return p.parse_args()


def policy_options(args: argparse.Namespace) -> dict:
    name = args.policy.lower()
    if name == "dense":
        return {}
    if name == "lycheedecode":
        return {"roles": args.roles, "budget": args.budget}
    options = {"capacity": args.capacity, "window": args.window}
    if name == "clusterattn":
        options.update(theta=args.theta, num_block=args.num_block)
    return options


def prompt_ids(args: argparse.Namespace, model_dir: Path):
    if args.prompt_ids:
        return [int(x) for x in args.prompt_ids.split()], None
    if args.prompt_file:
        path = Path(args.prompt_file)
        path = path if path.is_file() else model_dir / path
        for line in path.read_text().splitlines():
            head, _, ids = line.partition("|")
            tokens = [int(x) for x in ids.split()]
            if args.prompt_length is None or len(tokens) == args.prompt_length:
                return tokens, [int(x) for x in head.split()[1:]]
        sys.exit(f"hf_generate.py: no prompt of {args.prompt_length} tokens in {path}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))(args.prompt)["input_ids"], None


def main() -> None:
    args = parse_args()
    import transformers

    import kvsift.hf

    model_dir = Path(args.model)
    dtype = getattr(torch, args.dtype)
    ids, answer = prompt_ids(args, model_dir)
    x = torch.tensor([ids], device=args.device)
    gen = dict(attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens, do_sample=False)

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa")
    model = model.to(args.device).eval()
    reference = model.generate(x, **gen)[0, len(ids):].tolist() if args.compare else None

    kvsift.hf.enable(model, args.policy, page_size=args.page_size, **policy_options(args))   # the only kvsift line
    start = time.time()
    out = model.generate(x, **gen)[0, len(ids):].tolist()
    seconds = time.time() - start

    print(f"prompt: {len(ids)} tokens; policy: {model._kvsift_policy.describe()}; {seconds:.2f} s")
    print("kvsift:", *out)
    if reference is not None:
        print("sdpa:  ", *reference, "(same)" if reference == out else "(differs)")
    if answer is not None:
        print("answer:", *answer, "(correct)" if out[: len(answer)] == answer else "(wrong)")


if __name__ == "__main__":
    main()
