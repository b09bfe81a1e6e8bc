"""kvsift.hf on the trained passkey checkpoint, CUDA: the full passkey table of docs/fidelity.md
(16 prompts each of 2048 and 8192 tokens of prompts_shared.txt, every policy) through transformers,
against the C++ minimal decoder's counts on the same prompts; and dense generate equal to
transformers' eager and SDPA attention on long prompts.

Skipped without a GPU, a CUDA build of kvsift, the checkpoint or transformers. Set
KVSIFT_HF_PASSKEY_TABLE=FILE to also write the table as markdown (pytest -s prints it too).
KVSIFT_HF_DTYPE=bfloat16 runs the model in bf16 instead of float32.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

pytest.importorskip("transformers")

import kvsift  # noqa: E402
import kvsift.hf as hf  # noqa: E402
from hf_passkey import format_table, load_model, load_prompts, require_model_dir, run_passkey, table_policies  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not kvsift.built_with_cuda(),
                                reason="needs a CUDA device and a CUDA build of kvsift")

# docs/fidelity.md, "Results on the GPU": minimal_decoder --device gpu on the same 16 + 16 prompts
# (the CPU backend's counts are the same in every row).
CPP_COUNTS = {
    "dense": {2048: 16, 8192: 16},
    "ClusterAttn θ=0.5 nb=128": {2048: 16, 8192: 16},
    "SnapKV max-pool 7": {2048: 2, 8192: 2},
    "StreamingLLM 4 sinks": {2048: 1, 8192: 0},
    "LycheeDecode layer 0 only": {2048: 0, 8192: 0},
    "LycheeDecode trained roles": {2048: 16, 8192: 16},
}


def _dtype():
    return getattr(torch, os.environ.get("KVSIFT_HF_DTYPE", "float32"))


@pytest.fixture(scope="module")
def checkpoint():
    return require_model_dir()


@pytest.mark.parametrize("length", [2048, 8192])
def test_dense_generate_equals_transformers_attention_gpu(checkpoint, length):
    prompts = load_prompts(checkpoint / "prompts_shared.txt", length, limit=4)
    ids = torch.tensor([p[1] for p in prompts], device="cuda")
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    reference = {}
    for impl in ("eager", "sdpa"):
        model = load_model(checkpoint, "cuda", _dtype(), attn_implementation=impl)
        reference[impl] = model.generate(ids, **kwargs)[:, ids.shape[1]:]
    hf.enable(model, "dense")
    ours = model.generate(ids, **kwargs)[:, ids.shape[1]:]
    assert torch.equal(ours, reference["eager"]) and torch.equal(ours, reference["sdpa"])
    assert ours[:, :5].tolist() == [p[0] for p in prompts]


def test_passkey_table_gpu(checkpoint):
    model = load_model(checkpoint, "cuda", _dtype())
    policies = table_policies(model)
    columns = {}
    for length in (2048, 8192):
        prompts = load_prompts(checkpoint / "prompts_shared.txt", length)
        assert len(prompts) == 16
        start = time.time()
        columns[f"L={length}"] = run_passkey(model, prompts, policies, batch=8)
        torch.cuda.synchronize()
        print(f"\nL={length}: {time.time() - start:.1f} s for 16 prompts x {len(policies)} policies")
    table = format_table(columns)
    print(f"\nkvsift.hf passkey accuracy ({torch.cuda.get_device_name()}, model {_dtype()}):\n{table}")
    if os.environ.get("KVSIFT_HF_PASSKEY_TABLE"):
        with open(os.environ["KVSIFT_HF_PASSKEY_TABLE"], "w") as f:
            f.write(table + "\n")
    counts = {label: {L: columns[f"L={L}"][label].count for L in (2048, 8192)} for label in policies}
    assert counts == CPP_COUNTS
