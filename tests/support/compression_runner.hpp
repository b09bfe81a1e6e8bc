#pragma once
// Runs compress_prompt on the host into a fresh BHSD destination and keeps every output for checks.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/workspace.hpp"
#include "kvsift/policy/prompt_compression.hpp"
#include "support/prompt_fixtures.hpp"

namespace kvsift_test {

struct HostCompression {
  std::vector<float> k, v;
  std::vector<std::int32_t> new_lengths, positions, dst_lengths;
  int heads = 0, slots = 0;
  kvsift::Status status;

  HostCompression(Prompt& p, const kvsift::PromptCompressionConfig& c, const float* lse = nullptr) {
    kvsift::PromptCompressionShape shape{p.batch, p.kv_heads, p.q_heads, p.capacity};
    heads = c.heads == kvsift::ScoreHeads::kKvHeadMean ? p.kv_heads : p.q_heads;
    slots = c.capacity;
    k.assign(std::size_t(p.batch) * heads * slots * p.head_dim, -9.f);
    v = k;
    new_lengths.assign(p.batch, -1);
    positions.assign(std::size_t(p.batch) * heads * slots, -2);
    dst_lengths.assign(p.batch, slots);
    auto dst = kvsift::make_bhsd(k.data(), v.data(), p.batch, heads, slots, p.head_dim, dst_lengths.data());
    const kvsift::host::Exec exec;
    std::size_t bytes = 0;
    status = kvsift::compress_prompt_workspace_bytes(exec, c, shape, &bytes);
    if (!status.ok()) return;
    std::vector<unsigned char> ws(bytes + kvsift::kWorkspaceAlignment);
    void* base = reinterpret_cast<void*>(kvsift::align_up(reinterpret_cast<std::uintptr_t>(ws.data())));
    kvsift::CompactOutputs out{new_lengths.data(), positions.data(), slots};
    status = kvsift::compress_prompt(exec, c, shape, p.view(), p.queries(), lse, dst, out, kvsift::Workspace{base, bytes});
  }
  // Kept prefix positions of row r (slots before the window).
  std::vector<int> kept_prefix(int r, int len, int window) const {
    std::vector<int> kept;
    const int w = window < len ? window : len;
    for (int s = 0; s < slots; ++s) {
      const int p = positions[std::size_t(r) * slots + s];
      if (p >= 0 && p < len - w) kept.push_back(p);
    }
    return kept;
  }
};

}  // namespace kvsift_test
