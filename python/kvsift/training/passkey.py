"""The passkey protocol for measuring learned roles (docs/fidelity.md): prompt files and accuracy through
``kvsift.hf`` (kvsift's ops decode, transformers runs the model).

Prompt files hold one prompt per line, ``ANSWER d1 .. d5 | id id ...`` (token ids ending with QUERY).
A prompt counts as correct when the dense prefill's argmax (d1) and the 4 greedy decode steps under the
policy, each fed the previous digit, give all five digits. The prefill is dense for every policy, so it
runs once per batch and each policy decodes from a fork of its cache.
"""

from __future__ import annotations

import inspect
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

Prompt = Tuple[List[int], List[int]]


def read_passkey_prompts(path: Union[str, "os.PathLike[str]"], length: Optional[int] = None,
                         limit: Optional[int] = None) -> List[Prompt]:
    """``(answer digits, prompt ids)`` of a passkey prompt file, in file order; only prompts of
    ``length`` tokens when given, at most ``limit`` of them."""
    out: List[Prompt] = []
    with open(os.fspath(path), encoding="ascii") as f:
        for n, line in enumerate(f, 1):
            if "|" not in line:
                continue
            head, ids_text = line.split("|", 1)
            words = head.split()
            if not words or words[0] != "ANSWER":
                raise ValueError(f"{os.fspath(path)}: line {n} must start with 'ANSWER' (got {head.strip()[:20]!r})")
            ids = [int(x) for x in ids_text.split()]
            if length is not None and len(ids) != length:
                continue
            out.append(([int(x) for x in words[1:]], ids))
            if limit is not None and len(out) == limit:
                break
    return out


def _cache_kwarg(model) -> str:
    # transformers 5.24 renamed forward's past_key_values to cache
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def passkey_outputs(model, prompts: Sequence[Prompt], policies: Dict[str, object],
                    batch: int = 8) -> Dict[str, List[List[int]]]:
    """The generated digits of every prompt (all of one length) under each ``kvsift.hf`` policy.

    ``policies``: label -> :func:`kvsift.hf.make_policy` result. The model is switched to kvsift's
    attention (``kvsift.hf.enable``) and left so.
    """
    import kvsift.hf as hf

    hf.enable(model, "dense")
    device = next(model.parameters()).device
    name = _cache_kwarg(model)
    digits = len(prompts[0][0]) if prompts else 0
    outputs: Dict[str, List[List[int]]] = {label: [] for label in policies}
    for start in range(0, len(prompts), batch):
        part = prompts[start : start + batch]
        ids = torch.tensor([p[1] for p in part], device=device)
        with torch.no_grad():
            cache = hf.make_cache(model, "dense", reserve=digits)
            d1 = model(input_ids=ids, use_cache=True, **{name: cache}).logits[:, -1].argmax(-1, keepdim=True)
            for label, policy in policies.items():
                out = model.generate(torch.cat([ids, d1], 1), attention_mask=torch.ones_like(ids[:, :1]).expand(-1, ids.shape[1] + 1),
                                     max_new_tokens=digits - 1, do_sample=False, **{name: cache.fork(policy)})
                outputs[label].extend(torch.cat([d1, out[:, ids.shape[1] + 1:]], 1).tolist())
    return outputs


def passkey_accuracy(model, prompts: Sequence[Prompt], policies: Dict[str, object],
                     batch: int = 8) -> Dict[str, int]:
    """Correct prompts (all digits right) per policy label; see :func:`passkey_outputs`."""
    outs = passkey_outputs(model, prompts, policies, batch)
    return {label: sum(o == p[0] for o, p in zip(o_list, prompts)) for label, o_list in outs.items()}


__all__ = ["Prompt", "passkey_accuracy", "passkey_outputs", "read_passkey_prompts"]
