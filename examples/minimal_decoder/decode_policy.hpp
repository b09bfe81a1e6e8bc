#pragma once
// Which attention policy the decode loop runs, and its options.
//
//   dense        every cached token, every step (the reference)
//   clusterattn  prompt cache compressed once per layer after prefill (kvsift::compress_prompt),
//   snapkv       then ordinary dense decode over the compressed cache; decode tokens are appended
//   streaming    to it and keep their original RoPE positions
//   lychee       LycheeDecode hybrid-head sparse decode (kvsift policy/lycheedecode*): not wired yet,
//                see docs/minimal_decoder.md
//
// Options map one-to-one onto kvsift::PromptCompressionConfig, whose own validation (called before
// anything is allocated) produces the error messages for bad values.

#include <cstdio>
#include <string>

#include <kvsift/kvsift.hpp>

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

// LycheeDecode options, parsed so the command line is stable, but not run yet (see policy_name).
struct LycheeOptions {
  std::string mode = "token";  // token | ratio | block
  int budget = 4096;
  std::string roles_file;
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
  static std::string number(float x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", double(x));
    return buf;
  }
  std::string describe() const {
    if (!compresses_prompt()) return policy_name(kind);
    const auto& c = compression;
    std::string s = std::string(policy_name(kind)) + " (Cp " + std::to_string(c.capacity) + ", W " + std::to_string(c.window);
    if (kind == PolicyKind::kClusterAttn) s += ", theta " + std::to_string(c.theta) + ", num_block " + std::to_string(c.num_block);
    if (kind == PolicyKind::kStreamingLLM) s += ", sinks " + std::to_string(c.sinks);
    return s + ")";
  }
};

// Rejects what cannot run, before any buffer is allocated. The shape check is kvsift's own.
inline void validate_policy(const PolicyOptions& p, int num_q_heads, int num_kv_heads, int max_prompt_len) {
  if (p.kind == PolicyKind::kLychee)
    throw DecoderError(
        "--policy lychee is not available yet: kvsift's LycheeDecode policy (issue 7) has no committed decode-step "
        "API to call; use dense, clusterattn, snapkv or streaming");
  if (!p.compresses_prompt()) return;
  kvsift::PromptCompressionShape shape{1, num_kv_heads, num_q_heads, max_prompt_len};
  check(kvsift::detail::validate_compression_config(p.compression_config(), shape), "--policy " + p.describe());
}

}  // namespace minimal_decoder
