#pragma once
// Quickstart part 3: one LycheeDecode decode step through a synthetic multi-layer model, against
// dense decode of the same step. Layer 0 is all retrieval (it always is); in every later layer one KV
// head (a different one per layer) is a retrieval head and the other seven are sparse heads that
// attend only to the tokens the most recent retrieval head of their index selected. Each layer's cache hides a needle (a span of keys its query
// looks for, at the same positions in every layer), so selection matters: fidelity is the relative error of the attention outputs against
// dense. Written once over the backend (Exec); Mem provides that backend's memory and clock.

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace quickstart {

template <class Exec, class Mem>
int run_lycheedecode_demo(Exec exec, Mem& mem, int context, const char* backend) {
  using namespace kvsift;
  using bf16 = bfloat16_t;
  constexpr int kLayers = 8, kQHeads = 32, kKvHeads = 8, kHeadDim = 64;
  LycheeDecodeConfig c;
  c.num_layers = kLayers;
  c.num_q_heads = kQHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  std::vector<std::uint8_t> roles(kLayers * kKvHeads, 0);
  for (int h = 0; h < kKvHeads; ++h) roles[h] = 1;                 // layer 0: all retrieval
  for (int l = 1; l < kLayers; ++l) roles[l * kKvHeads + l % kKvHeads] = 1;  // later: one retrieval head
  Status st = make_head_roles(kLayers, kKvHeads, roles.data(), &c.roles);
  c.max_batch = 1;
  c.max_kv_length = context;
  c.selection = LycheeDecodeSelection::kToken;
  c.budget = 512;
  c.sink = 16;
  c.recent = 64;
  LycheeDecodePolicy decoder;
  if (st.ok()) st = LycheeDecodePolicy::create(c, &decoder);
  if (!st.ok()) {
    std::printf("error: %s\n", st.to_string().c_str());
    return 1;
  }

  // Per layer: random K/V and query, and a needle: a span of 64 keys the layer's query points at. The
  // span sits at the same positions in every layer, as the passage a question is about does in a
  // real model; that shared relevance is what lets a sparse head reuse another layer's selection.
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.f, 0.5f);
  std::vector<bf16*> k(kLayers), v(kLayers), q(kLayers), out_dense(kLayers), out_sparse(kLayers);
  const std::size_t kv_elems = std::size_t(kKvHeads) * context * kHeadDim, q_elems = std::size_t(kQHeads) * kHeadDim;
  for (int l = 0; l < kLayers; ++l) {
    std::vector<float> dir(kHeadDim);
    for (auto& x : dir) x = noise(rng) * 3.f;  // peaked attention, as a retrieval pattern is
    std::vector<bf16> hk(kv_elems), hv(kv_elems), hq(q_elems);
    const int needle = context / 3;
    for (int h = 0; h < kKvHeads; ++h)
      for (int t = 0; t < context; ++t)
        for (int e = 0; e < kHeadDim; ++e) {
          const std::size_t i = (std::size_t(h) * context + t) * kHeadDim + e;
          hk[i] = from_float<bf16>(noise(rng) + (t >= needle && t < needle + 64 ? dir[e] : 0.f));
          hv[i] = from_float<bf16>(noise(rng));
        }
    for (std::size_t i = 0; i < q_elems; ++i) hq[i] = from_float<bf16>(noise(rng) + dir[i % kHeadDim]);
    k[l] = mem.upload(hk);
    v[l] = mem.upload(hv);
    q[l] = mem.upload(hq);
    out_dense[l] = mem.template alloc<bf16>(q_elems);
    out_sparse[l] = mem.template alloc<bf16>(q_elems);
  }
  std::int32_t* lengths = mem.upload(std::vector<std::int32_t>{context});
  auto view = [&](int l) { return make_bhsd(k[l], v[l], 1, kKvHeads, context, kHeadDim, lengths); };

  // Dense decode: every head of every layer over the whole cache.
  std::vector<DecodeAttentionParams<bf16>> dense(kLayers);
  std::size_t dense_bytes = 0;
  for (int l = 0; l < kLayers; ++l) {
    dense[l] = make_decode_attention_params<bf16>(q[l], out_dense[l], 1, kQHeads, kHeadDim);
    if (st.ok()) st = decode_attention_workspace_bytes(exec, view(l), dense[l], &dense_bytes);
  }
  void* dense_ws = mem.template alloc<unsigned char>(dense_bytes);
  // LycheeDecode: state (the index table) and one workspace for every layer.
  LycheeDecodeState state;
  void* state_mem = mem.template alloc<unsigned char>(decoder.state_bytes());
  if (st.ok()) st = decoder.make_state(state_mem, decoder.state_bytes(), &state);
  std::size_t ws_bytes = 0;
  if (st.ok()) st = decoder.workspace_bytes<bf16>(exec, &ws_bytes);
  void* ws = mem.template alloc<unsigned char>(ws_bytes);
  if (!st.ok()) {
    std::printf("error: %s\n", st.to_string().c_str());
    return 1;
  }

  const double dense_ms = mem.time_ms([&] {
    for (int l = 0; l < kLayers; ++l) KVSIFT_TRY(decode_attention(exec, view(l), dense[l], Workspace{dense_ws, dense_bytes}));
    return Status();
  });
  const double sparse_ms = mem.time_ms([&] {
    state.restart_step();
    for (int l = 0; l < kLayers; ++l)
      KVSIFT_TRY(decoder.decode_layer(exec, state, l, view(l), make_query_io<bf16>(q[l], out_sparse[l], 1, kQHeads, kHeadDim),
                                      Workspace{ws, ws_bytes}));
    return Status();
  });
  if (dense_ms < 0 || sparse_ms < 0) return 1;

  std::printf("\nLycheeDecode on %s: %d layers, %d query heads, %d KV heads (layer 0 all retrieval, then 1 retrieval + "
              "7 sparse), context %d, token budget %d (sink %d, recent %d)\n",
              backend, kLayers, kQHeads, kKvHeads, context, c.budget, c.sink, c.recent);
  std::printf("  %-6s %22s\n", "layer", "rel. error vs dense");
  for (int l = 0; l < kLayers; ++l) {
    std::vector<bf16> a(q_elems), b(q_elems);
    st = read_to_host(exec, a.data(), out_dense[l], q_elems * sizeof(bf16));
    if (st.ok()) st = read_to_host(exec, b.data(), out_sparse[l], q_elems * sizeof(bf16));
    if (!st.ok()) {
      std::printf("error: %s\n", st.to_string().c_str());
      return 1;
    }
    double num = 0, den = 0;
    for (std::size_t i = 0; i < q_elems; ++i) {
      const double d = to_float(a[i]), s = to_float(b[i]);
      num += (s - d) * (s - d);
      den += d * d;
    }
    std::printf("  %-6d %22.4f\n", l, std::sqrt(num / den));
  }
  std::printf("  step time: dense %.3f ms, LycheeDecode %.3f ms (%.2fx)\n", dense_ms, sparse_ms, dense_ms / sparse_ms);
  return 0;
}

}  // namespace quickstart
