// Policy names, descriptions and the kvsift configurations they map to (policy.hpp).

#include "engine/policy.hpp"

#include <algorithm>
#include <cstdio>

#include <kvsift/gates/roles_file.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

const char* policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::kDense: return "dense";
    case PolicyKind::kClusterAttn: return "clusterattn";
    case PolicyKind::kSnapKV: return "snapkv";
    case PolicyKind::kStreamingLLM: return "streaming";
    case PolicyKind::kLycheeDecode: return "lycheedecode";
  }
  return "?";
}

PolicyKind parse_policy(const std::string& s) {
  for (PolicyKind k : kAllPolicies)
    if (s == policy_name(k)) return k;
  throw DecoderError("--policy " + s + " is not one of dense, clusterattn, snapkv, streaming, lycheedecode");
}

kvsift::PromptCompressionConfig PolicyOptions::compression_config() const {
  kvsift::PromptCompressionConfig c = compression;
  c.policy = kind == PolicyKind::kClusterAttn ? kvsift::CompressionPolicy::kClusterAttn
             : kind == PolicyKind::kSnapKV    ? kvsift::CompressionPolicy::kSnapKV
                                              : kvsift::CompressionPolicy::kStreamingLLM;
  return c;
}

std::string PolicyOptions::roles_label() const {
  if (!lycheedecode.roles_file.empty()) return lycheedecode.roles_file;
  return lycheedecode.roles.empty() ? "layer 0 only" : lycheedecode.roles_name;
}

namespace {
std::string number(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(x));
  return buf;
}
}  // namespace

std::string PolicyOptions::settings() const {
  if (kind == PolicyKind::kLycheeDecode)
    return lycheedecode.mode + ", budget " + std::to_string(lycheedecode.budget) + ", sink " + std::to_string(lycheedecode.sink) + ", recent " +
           std::to_string(lycheedecode.recent) + ", roles " + roles_label() +
           (lycheedecode.correction_interval ? ", correction every " + std::to_string(lycheedecode.correction_interval) : "");
  if (!compresses_prompt()) return "";
  const auto& c = compression;
  std::string s = "Cp " + std::to_string(c.capacity) + ", W " + std::to_string(c.window);
  if (kind == PolicyKind::kClusterAttn) s += ", theta " + number(c.theta) + ", num_block " + std::to_string(c.num_block);
  if (kind == PolicyKind::kStreamingLLM) s += ", sinks " + std::to_string(c.sinks);
  return s;
}

std::string PolicyOptions::describe() const {
  const std::string s = settings();
  return s.empty() ? policy_name(kind) : std::string(policy_name(kind)) + " (" + s + ")";
}

kvsift::LycheeDecodeConfig lycheedecode_config(const LycheeDecodeOptions& o, int num_layers, int num_q_heads, int num_kv_heads,
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

void validate_policy(const PolicyOptions& p, int num_layers, int num_q_heads, int num_kv_heads, int head_dim,
                     int max_prompt_len) {
  if (p.kind == PolicyKind::kLycheeDecode) {
    check(kvsift::validate_lycheedecode_config(lycheedecode_config(p.lycheedecode, num_layers, num_q_heads, num_kv_heads, head_dim, 1,
                                                       max_prompt_len + 1)),
          "--policy lycheedecode");
    if (p.lycheedecode.correction_interval > max_prompt_len)
      throw DecoderError("--correction-interval " + std::to_string(p.lycheedecode.correction_interval) +
                         " exceeds the prompt length " + std::to_string(max_prompt_len));
  }
  if (!p.compresses_prompt()) return;
  check(kvsift::validate(p.compression_config()), "--policy " + p.describe());
  // The one check that needs the prompt (compress_prompt would make it too, but only after prefill).
  if (max_prompt_len <= p.compression.window)
    throw DecoderError("--policy " + p.describe() + ": window = " + std::to_string(p.compression.window) +
                       " must be < the prompt length " + std::to_string(max_prompt_len) +
                       " (a window covering the prompt leaves nothing to score)");
}

}  // namespace minimal_decoder
