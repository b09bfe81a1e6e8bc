"""The passkey protocol of the trained checkpoint (docs/fidelity.md), through transformers + kvsift.hf.

Shared by test_hf_passkey.py (a CPU subset) and test_hf_passkey_gpu.py (the full 2K/8K table).

The checkpoint: ``KVSIFT_TEST_MODEL_DIR`` (as for the C++ fidelity test), else ``.model/passkey-llama-13m``
in the repository root; tests that need it are skipped without it.

Protocol (the checkpoint's README, ``minimal_decoder --eval-passkey``): dense prefill of the whole
prompt (it ends with QUERY); d1 = argmax of the prefill's last logits; then 4 greedy decode steps
under the policy, each fed the previous digit; a prompt counts when all five digits match. The
prefill is the same for every policy, so it runs once per batch (``KvsiftCache.fork``), as
in the C++ decoder; each policy then runs ``model.generate`` from the forked cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

import kvsift

REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO_ROOT / "examples" / "minimal_decoder" / "roles"
TRAINED_ROLES = ROLES_DIR / "passkey-llama-13m.roles"


def model_dir() -> Optional[Path]:
    """The passkey checkpoint folder, or None when there is none."""
    env = os.environ.get("KVSIFT_TEST_MODEL_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT / ".model" / "passkey-llama-13m")
    for c in candidates:
        if (c / "config.json").is_file() and (c / "prompts_shared.txt").is_file():
            return c
    return None


def require_model_dir() -> Path:
    d = model_dir()
    if d is None:
        pytest.skip("no passkey checkpoint: set KVSIFT_TEST_MODEL_DIR (or put it at .model/passkey-llama-13m)")
    return d


def load_prompts(path: Path, length: int, limit: Optional[int] = None) -> List[Tuple[List[int], List[int]]]:
    """``(answer, ids)`` of the prompts of ``length`` tokens in a passkey prompt file, in file order."""
    out = []
    for line in path.read_text().splitlines():
        if "|" not in line:
            continue
        head, ids_text = line.split("|", 1)
        ids = [int(x) for x in ids_text.split()]
        if len(ids) != length:
            continue
        answer = [int(x) for x in head.split()[1:]]
        out.append((answer, ids))
        if limit is not None and len(out) == limit:
            break
    return out


def load_model(directory: Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
               attn_implementation: str = "eager"):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=dtype, attn_implementation=attn_implementation)
    return model.to(device).eval()


def cache_kwarg(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def layer0_only_roles(layers: int, kv_heads: int) -> kvsift.HeadRoles:
    """LycheeDecode's control: layer 0 retrieval, every other head sparse."""
    rows = tuple(tuple([i == 0] * kv_heads) for i in range(layers))
    return kvsift.HeadRoles(layers, kv_heads, rows)


def table_policies(model) -> Dict[str, object]:
    """The policies of docs/fidelity.md's passkey tables (Cp = 128, W = 8)."""
    import kvsift.hf as hf

    c = model.config
    return {
        "dense": hf.make_policy("dense"),
        "ClusterAttn θ=0.5 nb=128": hf.make_policy("clusterattn", capacity=128, window=8, theta=0.5, num_block=128),
        "SnapKV max-pool 7": hf.make_policy("snapkv", capacity=128, window=8, pool="max", pool_kernel=7),
        "StreamingLLM 4 sinks": hf.make_policy("streamingllm", capacity=128, window=8, sink=4),
        "LycheeDecode layer 0 only": hf.make_policy(
            "lycheedecode", roles=layer0_only_roles(c.num_hidden_layers, c.num_key_value_heads),
            budget=128, sink=8, recent=16),
        "LycheeDecode trained roles": hf.make_policy("lycheedecode", roles=TRAINED_ROLES, budget=128, sink=8, recent=16),
    }


@dataclass
class PasskeyResult:
    outputs: List[List[int]]   # the five generated digits of each prompt
    answers: List[List[int]]

    @property
    def correct(self) -> List[bool]:
        return [o == a for o, a in zip(self.outputs, self.answers)]

    @property
    def count(self) -> int:
        return sum(self.correct)


def run_passkey(model, prompts: Sequence[Tuple[List[int], List[int]]], policies: Dict[str, object],
                batch: int = 8) -> Dict[str, PasskeyResult]:
    """Every policy on every prompt (all of one length), one shared dense prefill per batch."""
    import kvsift.hf as hf

    hf.enable(model, "dense")  # the attention implementation; each cache carries its own policy
    device = next(model.parameters()).device
    name = cache_kwarg(model)
    results = {p: PasskeyResult([], []) for p in policies}
    for start in range(0, len(prompts), batch):
        part = prompts[start : start + batch]
        ids = torch.tensor([p[1] for p in part], device=device)
        with torch.no_grad():
            cache = hf.make_cache(model, "dense", keep_queries=8, reserve=8)
            logits = model(input_ids=ids, use_cache=True, **{name: cache}).logits
            d1 = logits[:, -1].argmax(-1, keepdim=True)
            for label, policy in policies.items():
                forked = cache.fork(policy)
                out = model.generate(torch.cat([ids, d1], 1), attention_mask=torch.ones_like(ids[:, :1]).expand(-1, ids.shape[1] + 1),
                                     max_new_tokens=4, do_sample=False, **{name: forked})
                digits = torch.cat([d1, out[:, -4:]], 1).tolist()
                results[label].outputs.extend(digits)
                results[label].answers.extend(p[0] for p in part)
    return results


def format_table(columns: Dict[str, Dict[str, PasskeyResult]]) -> str:
    """A markdown table: one row per policy, one column per prompt set."""
    labels = list(next(iter(columns.values())).keys())
    lines = ["| policy | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label in labels:
        cells = []
        for col in columns.values():
            r = col[label]
            cells.append(f"{r.count / len(r.answers):.3f} ({r.count}/{len(r.answers)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
