"""kvsift.hf on the trained passkey checkpoint, CPU: greedy generate through kvsift equals transformers'
own attention token for token, and the passkey table on a subset of prompts_shared.txt equals what the
C++ minimal decoder answers on the same prompts, prompt by prompt and digit by digit.

Skipped without the checkpoint (KVSIFT_TEST_MODEL_DIR, or .model/passkey-llama-13m) or transformers.
About 70 s on 2 CPU cores, nearly all of it kvsift's host-reference prefill attention.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import kvsift.hf as hf  # noqa: E402
from hf_passkey import load_model, load_prompts, require_model_dir, run_passkey, table_policies  # noqa: E402

# What the C++ decoder answers on the first 3 prompts of 1024 tokens and the first 2 of 2048 of
# prompts_shared.txt (the five digits per prompt), from
#   minimal_decoder --model $M --eval-passkey $M/prompts_shared.txt --lengths 1024,2048 --limit 3 --eval-batch 3 \
#     --cp 128 --window 8 --eval-clusterattn 0.5:128 --lycheedecode-budget 128 --lycheedecode-sink 8 \
#     --lycheedecode-recent 16 --roles examples/minimal_decoder/roles/passkey-llama-13m.roles --device cpu --json out.json
# (CPU backend, kvsift's host reference). The answers are dense's row; a wrong row is the policy's own
# mistake, which the Python path must make too.
ANSWERS = {1024: [[15, 15, 19, 14, 17], [14, 11, 18, 13, 16], [11, 13, 18, 15, 17]],
           2048: [[17, 16, 10, 19, 18], [15, 10, 11, 17, 19]]}
CPP_OUTPUTS = {
    "dense": ANSWERS,
    "ClusterAttn θ=0.5 nb=128": ANSWERS,
    "SnapKV max-pool 7": {1024: [[15, 15, 19, 14, 219], [14, 11, 18, 13, 162], [11, 13, 18, 15, 15]],
                          2048: [[17, 16, 10, 19, 181], [15, 10, 11, 17, 17]]},
    "StreamingLLM 4 sinks": {1024: [[15, 13, 13, 11, 11], [14, 15, 379, 111, 173], [11, 18, 405, 447, 455]],
                             2048: [[17, 15, 16, 11, 16], [15, 17, 16, 11, 16]]},
    "LycheeDecode layer 0 only": {1024: [[15, 18, 11, 12, 16], [14, 14, 13, 17, 2], [11, 19, 16, 11, 11]],
                                  2048: [[17, 15, 11, 17, 11], [15, 14, 17, 11, 16]]},
    "LycheeDecode trained roles": ANSWERS,
}


@pytest.fixture(scope="module")
def checkpoint():
    return require_model_dir()


def test_dense_generate_equals_transformers_attention(checkpoint):
    prompts = load_prompts(checkpoint / "prompts_shared.txt", 1024, limit=2)
    ids = torch.tensor([p[1] for p in prompts])
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    reference = {}
    for impl in ("eager", "sdpa"):
        model = load_model(checkpoint, attn_implementation=impl)
        reference[impl] = model.generate(ids, **kwargs)[:, ids.shape[1]:]
    hf.enable(model, "dense")
    ours = model.generate(ids, **kwargs)[:, ids.shape[1]:]
    assert torch.equal(ours, reference["eager"]) and torch.equal(ours, reference["sdpa"])
    assert ours[:, :5].tolist() == [p[0] for p in prompts]  # and it is the passkey


def test_passkey_table_equals_the_cpp_decoder(checkpoint):
    model = load_model(checkpoint)
    policies = table_policies(model)
    for length, limit in ((1024, 3), (2048, 2)):
        prompts = load_prompts(checkpoint / "prompts_shared.txt", length, limit=limit)
        assert [p[0] for p in prompts] == ANSWERS[length]
        results = run_passkey(model, prompts, policies, batch=limit)
        for label, result in results.items():
            assert result.outputs == CPP_OUTPUTS[label][length], (label, length)
