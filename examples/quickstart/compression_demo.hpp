#pragma once
// Quickstart part 2: compress a synthetic long prompt with each policy (ClusterAttn, SnapKV,
// StreamingLLM, H2O-prefill) and report what was kept, how close attention over the compressed cache
// stays to attention over the full one, and the time. Written once over the backend (Exec).
//
// The prompt hides a "needle": a contiguous span of keys that the window's queries (the end of the
// prompt) and the later decode queries both look for, as a question about a passage would.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

namespace quickstart {

struct SyntheticPrompt {
  int len, kv_heads = 2, q_heads = 8, head_dim = 64, window = 32, decode_queries = 4;
  int needle_begin, needle_len = 200;
  std::vector<float> k, v, window_q, all_q, decode_q;
  std::vector<std::int32_t> lengths{0};

  explicit SyntheticPrompt(int length) : len(length), needle_begin(length / 3) {
    lengths[0] = len;
    std::mt19937 rng(7);
    std::normal_distribution<float> noise(0.f, 0.3f);
    std::vector<float> needle(head_dim);
    for (auto& x : needle) x = noise(rng) * 2.f;
    auto fill = [&](std::vector<float>& x, std::size_t n) {
      x.resize(n);
      for (auto& e : x) e = noise(rng);
    };
    fill(k, std::size_t(kv_heads) * len * head_dim);
    fill(v, k.size());
    fill(all_q, std::size_t(len) * q_heads * head_dim);
    fill(decode_q, std::size_t(decode_queries) * q_heads * head_dim);
    for (int h = 0; h < kv_heads; ++h)
      for (int t = needle_begin; t < needle_begin + needle_len; ++t)
        for (int e = 0; e < head_dim; ++e) k[(std::size_t(h) * len + t) * head_dim + e] += needle[e];
    for (int t = len - window; t < len; ++t)
      for (int e = 0; e < q_heads * head_dim; ++e) all_q[std::size_t(t) * q_heads * head_dim + e] += needle[e % head_dim];
    for (int t = 0; t < decode_queries; ++t)
      for (int e = 0; e < q_heads * head_dim; ++e) decode_q[std::size_t(t) * q_heads * head_dim + e] += needle[e % head_dim];
    window_q.assign(all_q.end() - std::ptrdiff_t(window) * q_heads * head_dim, all_q.end());
  }
};

// Buffers of one backend: Mem copies host vectors into that backend's memory.
template <class Exec, class Mem>
int run_compression_demo(const Exec& exec, Mem& mem, const SyntheticPrompt& p, const char* backend) {
  using namespace kvsift;
  const int capacity = 1024;
  std::printf("\nprompt compression on %s: prompt of %d tokens, %d KV heads, %d query heads, head_dim %d, "
              "budget Cp = %d (window %d), needle of %d tokens at %d\n",
              backend, p.len, p.kv_heads, p.q_heads, p.head_dim, capacity, p.window, p.needle_len, p.needle_begin);
  std::printf("  %-13s %8s %14s %16s %10s\n", "policy", "kept", "needle kept", "attn cosine", "time ms");
  float* k = mem.upload(p.k);
  float* v = mem.upload(p.v);
  std::int32_t* lengths = mem.upload(p.lengths);
  const auto src = make_bhsd(k, v, 1, p.kv_heads, p.len, p.head_dim, lengths);
  const auto decode_q = make_query_rows<float>(mem.upload(p.decode_q), p.decode_queries, p.q_heads, p.head_dim);
  const auto window_q = make_query_rows<float>(mem.upload(p.window_q), p.window, p.q_heads, p.head_dim);
  const auto all_q = make_query_rows<float>(mem.upload(p.all_q), p.len, p.q_heads, p.head_dim);
  float* dk = mem.template alloc<float>(std::size_t(p.kv_heads) * capacity * p.head_dim);
  float* dv = mem.template alloc<float>(std::size_t(p.kv_heads) * capacity * p.head_dim);
  std::int32_t* dst_len = mem.upload(std::vector<std::int32_t>{capacity});
  std::int32_t* new_len = mem.template alloc<std::int32_t>(1);
  std::int32_t* positions = mem.template alloc<std::int32_t>(std::size_t(p.kv_heads) * capacity);
  float* cosine = mem.template alloc<float>(std::size_t(p.q_heads) * p.decode_queries);
  const auto dst = make_bhsd(dk, dv, 1, p.kv_heads, capacity, p.head_dim, dst_len);

  for (auto policy : {CompressionPolicy::kClusterAttn, CompressionPolicy::kSnapKV, CompressionPolicy::kStreamingLLM,
                      CompressionPolicy::kH2OPrefill}) {
    PromptCompressionConfig c;
    c.policy = policy;
    c.capacity = capacity;
    c.window = p.window;
    c.theta = 0.05f;  // above this prompt's flat background of about W / L per token
    const PromptCompressionShape shape{1, p.kv_heads, p.q_heads, p.len};
    std::size_t bytes = 0;
    Status st = compress_prompt_workspace_bytes(exec, c, shape, &bytes);
    if (!st.ok()) {
      std::printf("error: %s\n", st.to_string().c_str());
      return 1;
    }
    const Workspace ws{mem.template alloc<unsigned char>(bytes), bytes};
    const auto& q = policy == CompressionPolicy::kH2OPrefill ? all_q : window_q;
    // The row's name goes out before the policy runs: H2O-prefill scores every prompt query against
    // every key, about a second on a CPU, and the row says what is running meanwhile.
    std::printf("  %-13s", to_string(policy));
    std::fflush(stdout);
    const double ms = mem.time_ms([&] {
      return compress_prompt(exec, c, shape, src, q, nullptr, dst, CompactOutputs{new_len, positions, capacity}, ws);
    });
    if (ms < 0) return 1;
    const KeptPositions kept{positions, p.kv_heads, p.kv_heads, capacity, capacity};
    st = attention_cosine(exec, src, decode_q, p.decode_queries, 0.f, kept, cosine);
    std::vector<std::int32_t> pos_h(std::size_t(p.kv_heads) * capacity);
    std::vector<float> cos_h(std::size_t(p.q_heads) * p.decode_queries);
    if (st.ok()) st = read_to_host(exec, pos_h.data(), positions, pos_h.size() * sizeof(std::int32_t));
    if (st.ok()) st = read_to_host(exec, cos_h.data(), cosine, cos_h.size() * sizeof(float));
    if (!st.ok()) {
      std::printf("error: %s\n", st.to_string().c_str());
      return 1;
    }
    int needle = 0;
    for (int s = 0; s < capacity; ++s) needle += pos_h[s] >= p.needle_begin && pos_h[s] < p.needle_begin + p.needle_len;
    double mean_cos = 0;
    for (float x : cos_h) mean_cos += x;
    mean_cos /= double(cos_h.size());
    std::printf(" %7.1f%% %9d / %3d %16.4f %10.2f\n", 100.0 * capacity / p.len, needle, p.needle_len, mean_cos, ms);
  }
  return 0;
}

}  // namespace quickstart
