#pragma once
// Which attention policy the decode loop runs, and its options.
//
//   dense        every cached token, every step (the reference)
//   clusterattn  prompt cache compressed once per layer after prefill (kvsift::compress_prompt),
//   snapkv       then ordinary dense decode over the compressed cache; decode tokens are appended
//   streaming    to it and keep their original RoPE positions
//   lycheedecode LycheeDecode hybrid-head sparse decode (kvsift::LycheeDecodePolicy): dense prefill, then
//                per layer retrieval KV heads attend densely and select tokens, sparse heads attend
//                to the selection of the latest retrieval head of the same index; optional cache
//                correction every N steps
//
// Options map one-to-one onto kvsift::PromptCompressionConfig and kvsift::LycheeDecodeConfig, whose
// own validation (called before anything is allocated) produces the error messages for bad values.

#include <cstdint>
#include <string>
#include <vector>

#include <kvsift/policy/lycheedecode_config.hpp>
#include <kvsift/policy/prompt_compression.hpp>

namespace minimal_decoder {

enum class PolicyKind { kDense, kClusterAttn, kSnapKV, kStreamingLLM, kLycheeDecode };

// Every policy, in the order --compare and the passkey table list them.
inline constexpr PolicyKind kAllPolicies[] = {PolicyKind::kDense, PolicyKind::kClusterAttn, PolicyKind::kSnapKV,
                                              PolicyKind::kStreamingLLM, PolicyKind::kLycheeDecode};

const char* policy_name(PolicyKind k);  // the --policy spelling
PolicyKind parse_policy(const std::string& s);

struct LycheeDecodeOptions {
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
  LycheeDecodeOptions lycheedecode;

  bool compresses_prompt() const {
    return kind == PolicyKind::kClusterAttn || kind == PolicyKind::kSnapKV || kind == PolicyKind::kStreamingLLM;
  }
  kvsift::PromptCompressionConfig compression_config() const;
  std::string roles_label() const;
  // The policy's name and the settings it runs with, e.g. "snapkv (Cp 128, W 16)".
  std::string describe() const;
  // Only the settings part of describe(), e.g. "Cp 128, W 16" ("" for dense).
  std::string settings() const;
};

// kvsift's LycheeDecode configuration for this model and these capacities.
kvsift::LycheeDecodeConfig lycheedecode_config(const LycheeDecodeOptions& o, int num_layers, int num_q_heads, int num_kv_heads,
                                         int head_dim, int max_batch, int max_kv_length);

// Rejects what cannot run, before any buffer is allocated. The checks are kvsift's own.
void validate_policy(const PolicyOptions& p, int num_layers, int num_q_heads, int num_kv_heads, int head_dim,
                     int max_prompt_len);

}  // namespace minimal_decoder
