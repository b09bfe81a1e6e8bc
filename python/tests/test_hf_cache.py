"""kvsift.hf on tiny random Llama / Qwen3 models (no checkpoint): kvsift attention against transformers'
eager attention, the cache's bookkeeping, compression and its fork, LycheeDecode's chain of index rows
against a float64 reference, and bad input."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

import kvsift  # noqa: E402
import kvsift.hf as hf  # noqa: E402
from kvsift.hf.lycheedecode import lycheedecode_layer  # noqa: E402


def tiny_llama(heads=4, kv_heads=2, layers=2, seed=0, qwen3=False, **extra):
    torch.manual_seed(seed)
    common = dict(vocab_size=128, hidden_size=heads * 64, intermediate_size=256, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64, max_position_embeddings=4096,
                  attn_implementation="eager", **extra)
    if qwen3:
        config = transformers.Qwen3Config(**common)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    # Larger weights than the default init, so the logits are not flat and greedy tokens are stable.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    return model.eval()


def generate(model, ids, new_tokens, **kwargs):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         return_dict_in_generate=True, output_logits=True, pad_token_id=0, eos_token_id=None, **kwargs)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def prompts(batch, length, vocab=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=g)


@pytest.mark.parametrize("qwen3", [False, True], ids=["llama", "qwen3"])
def test_dense_equals_eager(qwen3):
    model = tiny_llama(qwen3=qwen3)
    ids = prompts(2, 40)
    ref_tokens, ref_logits = generate(model, ids, 6)
    hf.enable(model, "dense")
    assert model.config._attn_implementation == "kvsift"
    tokens, logits = generate(model, ids, 6)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=2e-4, rtol=1e-4)
    hf.disable(model)
    assert model.config._attn_implementation == "eager"
    assert torch.equal(generate(model, ids, 6)[0], ref_tokens)


def test_chunked_prefill_equals_eager():
    # group 4: kvsift takes at most 4095 // 4 = 1023 queries per call, so a 1100-token prompt is two chunks
    model = tiny_llama(heads=4, kv_heads=1, layers=1)
    ids = prompts(1, 1100)
    with torch.no_grad():
        ref = model(ids).logits
        hf.enable(model, "dense")
        out = model(ids).logits                     # no cache: the keys are the whole prompt
        cache = hf.make_cache(model)
        with_cache = model(ids, use_cache=True, **{_cache_kwarg(model): cache}).logits
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(with_cache, ref, atol=2e-4, rtol=1e-4)
    assert cache.get_seq_length() == 1100 and cache.stored_length() == 1100


def _cache_kwarg(model):
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@pytest.mark.parametrize("policy", ["clusterattn", "snapkv", "streamingllm", "h2o"])
def test_compression_with_room_for_the_prompt_is_dense(policy):
    model = tiny_llama()
    ids = prompts(2, 30)
    ref_tokens, ref_logits = generate(model, ids, 5)
    hf.enable(model, policy, capacity=64, window=8)
    tokens, logits = generate(model, ids, 5)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("policy", ["clusterattn", "snapkv", "streamingllm", "h2o"])
def test_compression_shrinks_the_cache_and_fork_matches(policy):
    model = tiny_llama()
    ids = prompts(2, 200)
    options = dict(capacity=48, window=8)
    ref_tokens, ref_logits = generate(model, ids, 4)
    hf.enable(model, policy, **options)
    cache = hf.make_cache(model)
    tokens, logits = generate(model, ids, 4, **{_cache_kwarg(model): cache})
    # the prompt is compressed to capacity slots; positions keep counting from the prompt length
    assert cache.stored_length() == 48 + 3 and cache.get_seq_length() == 200 + 3
    assert all(cache.stored_length(l) == 51 for l in range(2))
    assert not torch.allclose(logits, ref_logits, atol=1e-3)   # 152 of 200 tokens are gone: it must show
    # One dense prefill, forked under the policy, gives the same steps as compressing in the attention.
    hf.enable(model, "dense")
    dense = hf.make_cache(model, keep_queries=-1 if policy == "h2o" else 8)
    name = _cache_kwarg(model)
    with torch.no_grad():
        first = model(ids, use_cache=True, **{name: dense}).logits[:, -1]
    forked = dense.fork(policy, **options)
    assert forked.stored_length() == 48 and forked.get_seq_length() == 200
    nxt = first.argmax(-1, keepdim=True)
    more, more_logits = generate(model, torch.cat([ids, nxt], 1), 3, **{name: forked})
    assert torch.equal(torch.cat([nxt, more], 1), tokens)
    torch.testing.assert_close(more_logits, logits[:, 1:], atol=1e-5, rtol=1e-5)


def test_lycheedecode_with_budget_over_the_context_is_dense():
    model = tiny_llama(layers=3)
    ids = prompts(2, 60)
    ref_tokens, ref_logits = generate(model, ids, 5)
    roles = kvsift.HeadRoles(3, 2, ((True, True), (False, True), (False, False)))
    hf.enable(model, "lycheedecode", roles=roles, budget=96, sink=4, recent=8)
    tokens, logits = generate(model, ids, 5)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=2e-4, rtol=1e-4)
    # a small budget changes the answer's logits (the sparse heads see 16 of 60+ tokens)
    hf.enable(model, "lycheedecode", roles=roles, budget=16, sink=4, recent=8)
    assert not torch.allclose(generate(model, ids, 5)[1], ref_logits, atol=1e-3)


def _selection_reference(scores, budget, sink, recent):
    """Per row: the forced sink/recent positions plus the best others by score (ties to the lower position)."""
    n = scores.shape[-1]
    forced = set(range(min(sink, n))) | set(range(max(n - recent, 0), n))
    order = sorted((p for p in range(n) if p not in forced), key=lambda p: (-float(scores[p]), p))
    return sorted(forced | set(order[: max(budget - len(forced), 0)]))


def _attend(q, k, v, positions, scale):
    s = (q @ k[positions].T) * scale
    return torch.softmax(s, -1) @ v[positions]


def test_lycheedecode_chain_against_reference():
    # roles: layer 0 RR; layer 1 SR; layer 2 SS -> head 0 of layers 1 and 2 reads layer 0's selection of
    # head 0, head 1 of layer 2 reads layer 1's selection of head 1.
    torch.manual_seed(3)
    batch, kv_heads, group, dim, n = 2, 2, 3, 64, 70
    roles = kvsift.HeadRoles(3, 2, ((True, True), (False, True), (False, False)))
    policy = hf.make_policy("lycheedecode", roles=roles, budget=20, sink=4, recent=6)
    cache = hf.KvsiftCache(SimpleNamespace(num_hidden_layers=3, num_key_value_heads=kv_heads,
                                           num_attention_heads=kv_heads * group), policy)
    scale = dim ** -0.5
    keys = [torch.randn(batch, kv_heads, n, dim) for _ in range(3)]
    vals = [torch.randn(batch, kv_heads, n, dim) for _ in range(3)]
    qs = [torch.randn(batch, kv_heads * group, 1, dim) for _ in range(3)]
    sel = {}  # (b, head) -> positions, the chain as it stands
    for l in range(3):
        layer = cache.layers[l]
        layer.update(keys[l][:, :, : n - 1], vals[l][:, :, : n - 1])
        layer.prefilled = True
        layer.update(keys[l][:, :, n - 1 :], vals[l][:, :, n - 1 :])
        out = lycheedecode_layer(layer, qs[l], policy.lycheedecode, scale)
        for b in range(batch):
            for h in range(kv_heads):
                k = keys[l][b, h].double()
                v = vals[l][b, h].double()
                positions = list(range(n)) if roles.is_retrieval(l, h) else sel[(b, h)]
                for g in range(group):
                    q = qs[l][b, h * group + g, 0].double()
                    torch.testing.assert_close(out[b, h * group + g, 0].double(), _attend(q, k, v, positions, scale),
                                               atol=1e-5, rtol=1e-5)
                if roles.is_retrieval(l, h):
                    qbar = qs[l][b, h * group : (h + 1) * group, 0].double().mean(0)
                    sel[(b, h)] = _selection_reference(k @ qbar, 20, 4, 6)
        table = cache.index_table
        for b in range(batch):
            for h in range(kv_heads):
                assert table.indices[b, h, : int(table.counts[b, h])].tolist() == sel[(b, h)], (l, b, h)


def test_bad_input():
    with pytest.raises(ValueError, match="policy = 'nope'"):
        hf.make_policy("nope")
    with pytest.raises(ValueError, match="roles is required"):
        hf.make_policy("lycheedecode")
    with pytest.raises(ValueError, match="budget = 10 must be >= sink \\+ recent = 24"):
        hf.make_policy("lycheedecode", roles=kvsift.HeadRoles(1, 1, ((True,),)), budget=10)
    with pytest.raises(ValueError, match="layer 0 must be all retrieval"):
        hf.make_policy("lycheedecode", roles=kvsift.HeadRoles(2, 2, ((True, False), (True, True))))
    with pytest.raises(ValueError, match="capacity = 8 must be > window = 8"):
        hf.make_policy("snapkv", capacity=8, window=8)
    with pytest.raises(ValueError, match="unknown option\\(s\\) \\['thetaa'\\]"):
        hf.make_policy("clusterattn", thetaa=0.1)
    with pytest.raises(ValueError, match="window = 0 must be an int >= 1"):
        hf.make_policy("clusterattn", window=0)
    with pytest.raises(ValueError, match="sink is for"):
        hf.make_policy("snapkv", sink=3)
    model = tiny_llama()
    with pytest.raises(ValueError, match="roles are for 3 layers x 2 KV heads, the model has 2 layers x 2 KV heads"):
        hf.enable(model, "lycheedecode", roles=kvsift.HeadRoles(3, 2, ((True, True),) * 3))
    assert model.config._attn_implementation == "eager"  # a refused enable changes nothing
    with pytest.raises(NotImplementedError, match="head_dim = 32"):
        hf.enable(transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1)), "dense")
    with pytest.raises(NotImplementedError, match="model_type = 'gpt2'"):
        hf.enable(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=1)), "dense")
    hf.enable(model, "dense")
    ids = prompts(2, 12)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with pytest.raises(ValueError, match="attention_mask has padding"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)
    with pytest.raises(RuntimeError, match="no backward"):
        model(ids)  # grad mode on, parameters require grad
    dense = hf.make_cache(model)  # no queries kept
    with torch.no_grad():
        model(prompts(1, 30), use_cache=True, **{_cache_kwarg(model): dense})
    with pytest.raises(ValueError, match="needs the last 8 prompt queries, 0 were kept"):
        dense.fork("snapkv", capacity=16, window=8)
    with pytest.raises(ValueError, match="fork needs a dense cache"):
        hf.make_cache(model, "snapkv").fork("dense")
    with pytest.raises(ValueError, match="reserve = 0"):
        hf.make_cache(model, reserve=0)


@pytest.mark.parametrize("mode", ["beams", "return_sequences"])
def test_beam_search_and_repeated_batches_equal_eager(mode):
    # generate reorders the cache (beam search) or repeats its batch (num_return_sequences)
    model = tiny_llama()
    ids = prompts(2, 30)
    extra = dict(num_beams=3, do_sample=False) if mode == "beams" else dict(do_sample=True, top_k=1,
                                                                           num_return_sequences=2)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, pad_token_id=0, eos_token_id=None, **extra)
    ref = model.generate(ids, **kwargs)
    hf.enable(model, "dense")
    assert torch.equal(model.generate(ids, **kwargs), ref)


# --- paged caches (page pools + block table per layer) ---------------------------------------------

def test_paged_store_reads_what_was_written_through_its_block_table():
    from kvsift.hf.paged import PagedStore

    torch.manual_seed(5)
    batch, heads, dim, page = 3, 2, 8, 4
    store = PagedStore(batch, heads, dim, torch.float32, torch.device("cpu"), page, capacity=6)
    assert store.capacity == 8 and tuple(store.keys.shape) == (2 * batch, heads, page, dim)
    ref_k = torch.randn(batch, heads, 23, dim)
    ref_v = torch.randn(batch, heads, 23, dim)
    for start, end in ((0, 5), (5, 6), (6, 17), (17, 23)):  # crossing pages, growing the pool twice
        before = store.keys.clone(), store.block_table.clone()
        store.write(start, ref_k[:, :, start:end], ref_v[:, :, start:end])
        # growing keeps every page id and its contents
        assert torch.equal(store.block_table[:, : before[1].shape[1]], before[1])
        kept = before[0] != 0  # what was written before; this write only fills slots that were still zero
        assert torch.equal(store.keys[: before[0].shape[0]][kept], before[0][kept])
        k, v = store.read(end)
        assert torch.equal(k, ref_k[:, :, :end]) and torch.equal(v, ref_v[:, :, :end])
        assert torch.equal(store.read_keys(end), ref_k[:, :, :end])
    assert store.capacity >= 23
    table = store.block_table
    assert table.dtype == torch.int32 and len(set(table.flatten().tolist())) == table.numel()
    assert (table[:, 1:] - table[:, :-1] == batch).all()  # interleaved: no sequence's pages are adjacent
    # a sequence's token t lives at pool[table[b, t // page], :, t % page]
    b, t = 2, 13
    assert torch.equal(store.keys[int(table[b, t // page]), :, t % page], ref_k[b, :, t])


@pytest.mark.parametrize("page_size", [16, 5])
def test_paged_dense_equals_eager(page_size):
    model = tiny_llama()
    ids = prompts(2, 40)
    ref_tokens, ref_logits = generate(model, ids, 6)
    hf.enable(model, "dense", page_size=page_size)
    tokens, logits = generate(model, ids, 6)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=2e-4, rtol=1e-4)
    # reserve 1: the pool grows in every decode step
    cache = hf.make_cache(model, reserve=1)
    assert cache.page_size == page_size and "page_size" in repr(cache)
    tokens, logits = generate(model, ids, 6, **{_cache_kwarg(model): cache})
    assert torch.equal(tokens, ref_tokens)
    assert cache.stored_length() == 45 and cache.layers[0].paged.capacity >= 45  # 40 + 5 fed back
    hf.disable(model)
    assert not hasattr(model, "_kvsift_page_size")


@pytest.mark.parametrize("policy", ["clusterattn", "h2o", "lycheedecode"])
def test_paged_policies_equal_contiguous(policy):
    # The same policy over a paged cache reads the same tokens: the same tokens and logits.
    model = tiny_llama(layers=3)
    ids = prompts(2, 120)
    options = dict(capacity=40, window=8)
    if policy == "lycheedecode":
        options = dict(roles=kvsift.HeadRoles(3, 2, ((True, True), (False, True), (False, False))), budget=24, sink=4,
                       recent=8)
    hf.enable(model, policy, **options)
    ref_tokens, ref_logits = generate(model, ids, 5)
    hf.enable(model, policy, page_size=16, **options)
    cache = hf.make_cache(model)
    tokens, logits = generate(model, ids, 5, **{_cache_kwarg(model): cache})
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    expect = 40 + 4 if policy != "lycheedecode" else 120 + 4
    assert all(cache.stored_length(l) == expect for l in range(3))


def test_paged_fork_and_beam_search():
    model = tiny_llama()
    ids = prompts(2, 100)
    name = _cache_kwarg(model)
    hf.enable(model, "snapkv", capacity=32, window=8)
    ref_tokens, ref_logits = generate(model, ids, 4)
    hf.enable(model, "dense", page_size=8)
    dense = hf.make_cache(model, keep_queries=8)
    with torch.no_grad():
        first = model(ids, use_cache=True, **{name: dense}).logits[:, -1]
    forked = dense.fork("snapkv", capacity=32, window=8)
    assert forked.page_size == 8 and forked.stored_length() == 32
    nxt = first.argmax(-1, keepdim=True)
    more, more_logits = generate(model, torch.cat([ids, nxt], 1), 3, **{name: forked})
    assert torch.equal(torch.cat([nxt, more], 1), ref_tokens)
    torch.testing.assert_close(more_logits, ref_logits[:, 1:], atol=1e-5, rtol=1e-5)
    # beam search reorders the paged cache: new pages per row, the same sequences as eager
    hf.disable(model)
    kwargs = dict(attention_mask=torch.ones_like(ids[:, :30]), max_new_tokens=6, pad_token_id=0, eos_token_id=None,
                  num_beams=3, do_sample=False)
    ref = model.generate(ids[:, :30], **kwargs)
    hf.enable(model, "dense", page_size=8)
    assert torch.equal(model.generate(ids[:, :30], **kwargs), ref)
    with pytest.raises(ValueError, match="page_size = 0 must be None or an int >= 1"):
        hf.enable(model, "dense", page_size=0)


def test_lycheedecode_step_bounds():
    # The step object is sized at layer 0 by the longest layer; a later layer holding more raises
    # (the op would clamp), and a non-default attention scale is refused.
    roles = kvsift.HeadRoles(2, 1, ((True,), (False,)))
    policy = hf.make_policy("lycheedecode", roles=roles, budget=8, sink=2, recent=2)
    cache = hf.KvsiftCache(SimpleNamespace(num_hidden_layers=2, num_key_value_heads=1, num_attention_heads=2),
                           policy, reserve=1)
    q = torch.randn(1, 2, 1, 64)
    first, second = cache.layers
    first.update(torch.randn(1, 1, 10, 64), torch.randn(1, 1, 10, 64))
    with pytest.raises(NotImplementedError, match="scaling = 0.5"):
        lycheedecode_layer(first, q, policy.lycheedecode, 0.5)
    lycheedecode_layer(first, q, policy.lycheedecode, None)
    second.update(torch.randn(1, 1, 20, 64), torch.randn(1, 1, 20, 64))
    with pytest.raises(RuntimeError, match="holds 20 tokens, more than the LycheeDecode step was sized for \\(11\\)"):
        lycheedecode_layer(second, q, policy.lycheedecode, None)
