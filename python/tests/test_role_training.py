"""End-to-end role training (kvsift.training): the gated student against transformers and against
kvsift.hf's LycheeDecode decode, a tiny training run on a random Llama (the loss falls, lambda moves,
the roles file round-trips), bad input, and a short run on the passkey checkpoint (skipped without it).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import kvsift  # noqa: E402
import kvsift.hf as hf  # noqa: E402
from kvsift.training import (GatedStudent, Lagrangian, RoleTrainingConfig, prepare_prompts,  # noqa: E402
                             read_passkey_prompts, train_roles)
from hf_passkey import TRAINED_ROLES, cache_kwarg, load_model, model_dir  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    # The student's matmuls are tiny: one thread is fastest, and several spin-wait on shared CI cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_llama(layers=3, kv_heads=2, heads=4, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=heads * 64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, head_dim=64, max_position_embeddings=512,
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the default init: peaked attention, non-flat logits
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    return model.eval()


def random_prompts(n, length, answer=4, vocab=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, length + answer), generator=g).tolist()
    return [(row[length:], row[:length]) for row in ids]


def test_open_gates_are_the_dense_model():
    model = tiny_llama()
    student = GatedStudent(model, budget=8, sink=2, recent=2)
    (answer, ids), = random_prompts(1, 40)
    state = student.prepare(torch.tensor(ids), torch.tensor(answer[:-1]))
    with torch.no_grad():
        ref = model(torch.tensor([ids + answer[:-1]])).logits[0, len(ids):]
    torch.testing.assert_close(state.teacher_logits, ref, atol=1e-4, rtol=1e-4)
    # a budget over the whole context: sparse = dense, whatever the gates
    wide = GatedStudent(model, budget=64, sink=2, recent=2)
    z = torch.zeros(3, 2)
    torch.testing.assert_close(wide.decode_logits(state, z), ref, atol=1e-4, rtol=1e-4)
    # a small budget with closed gates changes the logits (the test can fail)
    assert (student.decode_logits(state, z) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("rows", ["RR RS SR", "RR SS SS", "RR SR RS"])
def test_binary_gates_decode_as_kvsift_hf_lycheedecode(rows):
    """z in {0, 1}: the student's teacher-forced decode is LycheeDecode's (kvsift's ops, through kvsift.hf)."""
    model = tiny_llama()
    roles = kvsift.HeadRoles.parse("kvsift-head-roles v1 layers=3 kv_heads=2\n" + "\n".join(rows.split()) + "\n")
    z = roles.to_tensor().float()
    student = GatedStudent(model, budget=8, sink=2, recent=2)
    (answer, ids), = random_prompts(1, 48, seed=3)
    state = student.prepare(torch.tensor(ids), torch.tensor(answer[:-1]))
    ours = student.decode_logits(state, z).detach()

    hf.enable(model, "dense")
    try:
        cache = hf.make_cache(model, "lycheedecode", roles=roles, budget=8, sink=2, recent=2)
        name = cache_kwarg(model)
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=True, **{name: cache})
            theirs = torch.cat([model(input_ids=torch.tensor([[t]]), use_cache=True, **{name: cache}).logits[0]
                                for t in answer[:-1]])
    finally:
        hf.disable(model)
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)


def test_tiny_training_task_loss_falls_when_gates_are_free():
    """No constraint (the target is every gate): the distillation gradient alone opens the gates."""
    model = tiny_llama()
    cfg = RoleTrainingConfig(target_heads=4, steps=40, budget=8, sink=2, recent=2, lr=0.05, log_every=1, seed=2)
    result = train_roles(model, random_prompts(4, 48, seed=5), cfg, log=lambda _: None)
    task = [h["task"] for h in result.history]
    assert sum(task[-5:]) < 0.5 * sum(task[:5]), task
    assert result.history[-1]["expected_l0"] > result.history[0]["expected_l0"]
    assert result.history[-1]["lam"] == cfg.lambda_init   # never above the target: lambda stays


def test_tiny_training_lambda_moves_roles_round_trip(tmp_path):
    model = tiny_llama()
    prompts = random_prompts(4, 48, seed=5)
    cfg = RoleTrainingConfig(target_heads=1, steps=40, budget=8, sink=2, recent=2, lr=0.05, lambda_lr=0.05,
                             log_every=1, seed=2)
    lines = []
    result = train_roles(model, prompts, cfg, log=lines.append)
    assert len(result.history) == 40 and len(lines) == 40
    assert result.history[-1]["lam"] > cfg.lambda_init                          # one-sided: lambda only grows
    assert result.history[-1]["expected_l0"] < 0.5 * result.history[0]["expected_l0"]  # the penalty closes gates
    assert result.a.shape == (2, 2) and result.kuma_mean.shape == (2, 2)
    assert all(p.requires_grad for p in model.parameters())                     # restored after training
    path = tmp_path / "tiny.roles"
    result.save(str(path), ["a tiny test run"])
    loaded = kvsift.HeadRoles.load(path, expected_layers=3, expected_kv_heads=2)
    assert loaded == result.roles and loaded.retrieval[0] == (True, True)
    text = path.read_text()
    assert text.startswith("# a tiny test run\n") and "kvsift-head-roles v1 layers=3 kv_heads=2" in text
    expect = [(l, h) for l in (1, 2) for h in (0, 1) if result.kuma_mean[l - 1, h] > 0.5]
    assert result.learned_heads() == expect


def test_two_sided_lagrangian_lowers_lambda_below_target():
    lag = Lagrangian(target=3.0, gates=6, lam=2.0, lr=0.5, one_sided=False)
    for _ in range(5):
        lag.penalty(torch.tensor(1.0))
    assert lag.lam < 2.0
    one = Lagrangian(target=3.0, gates=6, lam=2.0, lr=0.5)
    term = one.penalty(torch.tensor(1.0, requires_grad=True))
    assert one.lam == 2.0 and float(term.detach()) == 0.0


def test_bad_input():
    model = tiny_llama(layers=2)
    with pytest.raises(ValueError, match="budget = 4 must be >= 1 and >= sink \\+ recent"):
        GatedStudent(model, budget=4, sink=3, recent=2)
    with pytest.raises(ValueError, match="steps = 0"):
        RoleTrainingConfig(steps=0)
    with pytest.raises(ValueError, match="loss_norm = 'l1'"):
        RoleTrainingConfig(loss_norm="l1")
    with pytest.raises(ValueError, match="constraint = 'both'"):
        RoleTrainingConfig(constraint="both")
    with pytest.raises(ValueError, match="target_heads = 5 must be <= the gates"):
        train_roles(model, random_prompts(1, 20), RoleTrainingConfig(target_heads=5, steps=1, budget=8, sink=2, recent=2))
    with pytest.raises(ValueError, match="prompts is empty"):
        train_roles(model, [], RoleTrainingConfig(steps=1))
    student = GatedStudent(model, budget=8, sink=2, recent=2)
    state = prepare_prompts(student, random_prompts(1, 20))[0]
    with pytest.raises(ValueError, match=r"z shape \[3, 2\] must be \[layers, kv_heads\] = \[2, 2\]"):
        student.decode_logits(state, torch.ones(3, 2))
    with pytest.raises(ValueError, match="Lagrangian: target = 9"):
        Lagrangian(target=9, gates=4)


def test_passkey_checkpoint_short_run():
    """On the passkey checkpoint: the student with open gates is the model, the C++ trainer's roles
    lose less than layer 0 alone, and a short run opens (4, 1), the head that reads the passkey."""
    directory = model_dir()
    if directory is None:
        pytest.skip("no passkey checkpoint: set KVSIFT_TEST_MODEL_DIR (or put it at .model/passkey-llama-13m)")
    model = load_model(directory)
    prompts = read_passkey_prompts(directory / "prompts_train.txt", 1024, limit=4)
    assert len(prompts) == 4 and all(len(a) == 5 for a, _ in prompts)
    student = GatedStudent(model, budget=128, sink=8, recent=16)
    states = prepare_prompts(student, prompts)
    answer, ids = prompts[0]
    with torch.no_grad():
        ref = model(torch.tensor([ids + answer[:-1]])).logits[0, len(ids):]
    torch.testing.assert_close(states[0].teacher_logits, ref, atol=1e-3, rtol=1e-4)
    assert states[0].teacher_logits.argmax(-1).tolist() == answer[1:]
    layer0 = torch.zeros(8, 2)
    layer0[0] = 1
    trained = kvsift.HeadRoles.load(TRAINED_ROLES).to_tensor().float()
    with torch.no_grad():
        for s in states:
            closed = (student.decode_logits(s, layer0) - s.teacher_logits).square().sum()
            cpp = (student.decode_logits(s, trained) - s.teacher_logits).square().sum()
            assert cpp < 0.5 * closed
    cfg = RoleTrainingConfig(target_heads=2, steps=60, lr=0.03)
    result = train_roles(model, prompts, cfg)
    k = result.kuma_mean
    assert (3, 1) == divmod(int(k.argmax()), 2), k   # row 3 of layers >= 1 is layer 4
    assert result.roles.is_retrieval(4, 1)
