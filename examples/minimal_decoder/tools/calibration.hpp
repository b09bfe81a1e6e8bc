#pragma once
// --calibrate-clusterattn: for every theta, kvsift::calibrate_num_block over the num_block
// candidates on every layer (the decode queries are those of dense decoding of the answer, positions
// L..L+3), averaged over layers and prompts; next to it, the passkey accuracy of each setting on the
// same prompts. Training prompts only: the evaluation set must not choose the setting.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "tools/passkey_eval.hpp"
#include "tools/passkey_tool_options.hpp"

namespace minimal_decoder {

// One length's table (calibration.cpp): cosine[t * N + n] summed over prompts, correct likewise.
void print_calibration_table(const PasskeyToolOptions& o, int length, int prompts, const std::vector<double>& cosine,
                             const std::vector<int>& correct);

template <class Backend>
int run_calibrate_clusterattn(Backend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                              const BackendWeights<Backend>& weights) {
  const std::vector<PasskeyCase> all = read_passkey_file(o.prompt_file);
  const int T = int(o.thetas.size()), N = int(o.num_blocks.size()), steps = kPasskeyDigits - 1;
  const int Hq = config.num_q_heads, D = config.head_dim;
  kvsift::PromptCompressionConfig base = o.policy.compression;
  base.policy = kvsift::CompressionPolicy::kClusterAttn;
  std::printf("ClusterAttn calibration (%s): Cp %d, W %d; mean cosine of full vs kept attention (decode queries,\n"
              "all layers and heads) and passkey accuracy, per theta x num_block\n",
              o.prompt_file.c_str(), base.capacity, base.window);
  for (int L : o.lengths) {
    std::vector<double> cosine(std::size_t(T * N), 0.0);
    std::vector<int> correct(std::size_t(T * N), 0);
    int prompts = 0;
    for (const auto& cases : passkey_batches(all, L, o.limit, o.batch)) {
      const int B = int(cases.size());
      std::vector<std::int32_t> first;
      auto source = passkey_prefill(be, config, weights, cases, o.prefill_chunk, base.window, &first);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) {
          PolicyOptions p = o.policy;
          p.kind = PolicyKind::kClusterAttn;
          p.compression.theta = o.thetas[std::size_t(t)];
          p.compression.num_block = o.num_blocks[std::size_t(n)];
          correct[std::size_t(t * N + n)] += passkey_decode(be, config, weights, *source, first, cases, p, o.prefill_chunk).correct;
        }
      // Decode queries [layer][B, steps, Hq, D] of the dense continuation.
      const std::vector<std::vector<float>> dq = collect_decode_queries(be, config, *source, cases);
      std::vector<std::int32_t> lens;
      for (const PasskeyCase& c : cases) lens.push_back(std::int32_t(c.prompt.size()));
      auto lengths = be.template alloc<std::int32_t>(lens.size());
      be.upload(lengths.data(), lens.data(), lens.size());
      const kvsift::PromptCompressionShape shape{B, config.num_kv_heads, Hq, L};
      using KV = typename Backend::KvType;
      auto scratch_k = be.template alloc<KV>(std::size_t(B) * config.kv_dim() * base.capacity);
      auto scratch_v = be.template alloc<KV>(std::size_t(B) * config.kv_dim() * base.capacity);
      const auto scratch = kvsift::make_bhsd(scratch_k.data(), scratch_v.data(), B, config.num_kv_heads, base.capacity, D,
                                             lengths.data());
      auto queries = be.template alloc<float>(dq[0].size());
      std::size_t ws_bytes = 0;
      check(kvsift::calibrate_num_block_workspace_bytes(be.exec(), base, shape, steps, &ws_bytes), "calibration workspace");
      auto ws = be.template alloc<unsigned char>(ws_bytes);
      for (int t = 0; t < T; ++t) {
        kvsift::PromptCompressionConfig c = base;
        c.theta = o.thetas[std::size_t(t)];
        for (int l = 0; l < config.num_layers; ++l) {
          be.upload(queries.data(), dq[std::size_t(l)].data(), dq[std::size_t(l)].size());
          kvsift::NumBlockCalibration result;
          // kvsift: the cosine of full vs kept attention for every num_block candidate, on this layer.
          check(kvsift::calibrate_num_block(be.exec(), c, shape, source->cache_view(l, lengths.data()),
                                            source->window_queries(l, c.window), nullptr,
                                            kvsift::make_query_rows<float>(queries.data(), steps, Hq, D), steps,
                                            o.num_blocks, scratch, &result, kvsift::Workspace{ws.data(), ws.size()}),
                "calibrate_num_block (layer " + std::to_string(l) + ")");
          for (int n = 0; n < N; ++n)
            cosine[std::size_t(t * N + n)] += result.table[std::size_t(n)].mean_cosine * B / config.num_layers;
        }
      }
      prompts += B;
      if (o.verbose) std::fprintf(stderr, "calibration L=%d: %d prompts done\n", L, prompts);
    }
    print_calibration_table(o, L, prompts, cosine, correct);
  }
  return 0;
}

}  // namespace minimal_decoder
