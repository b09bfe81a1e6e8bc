#pragma once
// Which attention policy the decode loop runs, and its options.
//
//   dense        every cached token, every step (the reference)
//   clusterattn  prompt cache compressed once per layer after prefill (kvsift::compress_prompt),
//   snapkv       then ordinary dense decode over the compressed cache; decode tokens are appended
//   streaming    to it and keep their original RoPE positions
//   lychee       LycheeDecode hybrid-head sparse decode (kvsift::LycheeDecodePolicy): dense prefill, then
//                per layer retrieval KV heads attend densely and select tokens, sparse heads attend
//                to the selection of the latest retrieval head of the same index; optional cache
//                correction every N steps
//
// Options map one-to-one onto kvsift::PromptCompressionConfig and kvsift::LycheeDecodeConfig, whose
// own validation (called before anything is allocated) produces the error messages for bad values.

#include <cstdio>
#include <string>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <kvsift/kvsift.hpp>
#include <kvsift/policy/lycheedecode.hpp>

#include "errors.hpp"

namespace minimal_decoder {

enum class PolicyKind { kDense, kClusterAttn, kSnapKV, kStreamingLLM, kLychee };

inline const char* policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::kDense: return "dense";
    case PolicyKind::kClusterAttn: return "clusterattn";
    case PolicyKind::kSnapKV: return "snapkv";
    case PolicyKind::kStreamingLLM: return "streaming";
    case PolicyKind::kLychee: return "lychee";
  }
  return "?";
}

inline PolicyKind parse_policy(const std::string& s) {
  for (PolicyKind k : {PolicyKind::kDense, PolicyKind::kClusterAttn, PolicyKind::kSnapKV, PolicyKind::kStreamingLLM,
                       PolicyKind::kLychee})
    if (s == policy_name(k)) return k;
  throw DecoderError("--policy " + s + " is not one of dense, clusterattn, snapkv, streaming, lychee");
}

struct LycheeOptions {
  std::string mode = "token";  // token | ratio | block
  int budget = 4096;           // token mode: tokens per row; block mode: blocks per row
  double rho = 0.7;            // ratio mode: fraction of tokens dropped
  int sink = 128, recent = 256;
  int block_size = 64;
  std::string roles_file;       // empty: layer 0 retrieval, every other head sparse
  // Roles in memory ([layers * kv_heads], 1 = retrieval), used when roles_file is empty: tools that
  // try many role sets (the passkey head probe) need no files.
  std::vector<std::uint8_t> roles;
  std::string roles_name;  // how reports name the in-memory roles
  int correction_interval = 0;  // 0 = no cache correction
};

struct PolicyOptions {
  PolicyKind kind = PolicyKind::kDense;
  // ClusterAttn / SnapKV / StreamingLLM: capacity (Cp), window (W), theta, num_block, pool, sinks.
  kvsift::PromptCompressionConfig compression;
  LycheeOptions lychee;

  bool compresses_prompt() const {
    return kind == PolicyKind::kClusterAttn || kind == PolicyKind::kSnapKV || kind == PolicyKind::kStreamingLLM;
  }
  kvsift::PromptCompressionConfig compression_config() const {
    kvsift::PromptCompressionConfig c = compression;
    c.policy = kind == PolicyKind::kClusterAttn ? kvsift::CompressionPolicy::kClusterAttn
               : kind == PolicyKind::kSnapKV    ? kvsift::CompressionPolicy::kSnapKV
                                                : kvsift::CompressionPolicy::kStreamingLLM;
    return c;
  }
  std::string roles_label() const {
    if (!lychee.roles_file.empty()) return lychee.roles_file;
    return lychee.roles.empty() ? "layer 0 only" : lychee.roles_name;
  }
  static std::string number(float x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", double(x));
    return buf;
  }
  std::string describe() const {
    if (kind == PolicyKind::kLychee)
      return "lychee (" + lychee.mode + ", budget " + std::to_string(lychee.budget) + ", sink " + std::to_string(lychee.sink) +
             ", recent " + std::to_string(lychee.recent) + ", roles " + roles_label() +
             (lychee.correction_interval ? ", correction every " + std::to_string(lychee.correction_interval) : "") + ")";
    if (!compresses_prompt()) return policy_name(kind);
    const auto& c = compression;
    std::string s = std::string(policy_name(kind)) + " (Cp " + std::to_string(c.capacity) + ", W " + std::to_string(c.window);
    if (kind == PolicyKind::kClusterAttn) s += ", theta " + number(c.theta) + ", num_block " + std::to_string(c.num_block);
    if (kind == PolicyKind::kStreamingLLM) s += ", sinks " + std::to_string(c.sinks);
    return s + ")";
  }
};

// kvsift's LycheeDecode configuration for this model and these capacities.
inline kvsift::LycheeDecodeConfig lychee_config(const LycheeOptions& o, int num_layers, int num_q_heads, int num_kv_heads,
                                                int head_dim, int max_batch, int max_kv_length) {
  kvsift::LycheeDecodeConfig c;
  c.num_layers = num_layers;
  c.num_q_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  if (!o.roles_file.empty()) {
    check(kvsift::read_head_roles_file(o.roles_file, &c.roles, num_layers, num_kv_heads), "--roles " + o.roles_file);
  } else if (!o.roles.empty()) {
    if (o.roles.size() != std::size_t(num_layers) * num_kv_heads) throw DecoderError("LycheeDecode roles: wrong table size");
    check(kvsift::make_head_roles(num_layers, num_kv_heads, o.roles.data(), &c.roles), "LycheeDecode roles");
  } else {
    std::vector<std::uint8_t> layer0_only(std::size_t(num_layers) * num_kv_heads, 0);
    std::fill_n(layer0_only.begin(), num_kv_heads, std::uint8_t(1));
    check(kvsift::make_head_roles(num_layers, num_kv_heads, layer0_only.data(), &c.roles), "default head roles");
  }
  c.max_batch = max_batch;
  c.max_kv_length = max_kv_length;
  c.selection = o.mode == "ratio" ? kvsift::LycheeDecodeSelection::kRatio
                : o.mode == "block" ? kvsift::LycheeDecodeSelection::kBlock
                                    : kvsift::LycheeDecodeSelection::kToken;
  c.budget = o.budget;
  c.num_blocks = o.budget;
  c.rho = o.rho;
  c.sink = o.sink;
  c.recent = o.recent;
  c.block_size = o.block_size;
  c.correction_interval = o.correction_interval;
  return c;
}

// Rejects what cannot run, before any buffer is allocated. The checks are kvsift's own.
inline void validate_policy(const PolicyOptions& p, int num_layers, int num_q_heads, int num_kv_heads, int head_dim,
                            int max_prompt_len) {
  if (p.kind == PolicyKind::kLychee) {
    check(kvsift::validate_lycheedecode_config(lychee_config(p.lychee, num_layers, num_q_heads, num_kv_heads, head_dim, 1,
                                                       max_prompt_len + 1)),
          "--policy lychee");
    if (p.lychee.correction_interval > max_prompt_len)
      throw DecoderError("--correction-interval " + std::to_string(p.lychee.correction_interval) +
                         " exceeds the prompt length " + std::to_string(max_prompt_len));
  }
  if (!p.compresses_prompt()) return;
  kvsift::PromptCompressionShape shape{1, num_kv_heads, num_q_heads, max_prompt_len};
  check(kvsift::detail::validate_compression_config(p.compression_config(), shape), "--policy " + p.describe());
}

}  // namespace minimal_decoder
