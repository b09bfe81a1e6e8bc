#include "engine/tensor_parallel.hpp"

#include <string>
#include <vector>

#include <kvsift/kv/head_roles.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

ModelConfig TensorParallelShard::config(const ModelConfig& full) const {
  ModelConfig c = full;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.intermediate_size = intermediate;
  if (ranks > 1) c.name = full.name + " (tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ")";
  return c;
}

TensorParallelShard tensor_parallel_shard(const ModelConfig& c, int ranks, int rank) {
  const std::string tp = "--tp " + std::to_string(ranks);
  if (ranks < 1) throw DecoderError(tp + ": the number of ranks must be >= 1");
  if (rank < 0 || rank >= ranks) throw DecoderError(tp + ": rank " + std::to_string(rank) + " is out of range");
  const int hq = c.num_q_heads, hkv = c.num_kv_heads;
  if (hq % ranks != 0)
    throw DecoderError(tp + ": num_attention_heads = " + std::to_string(hq) + " is not a multiple of the ranks");
  if (ranks <= hkv ? hkv % ranks != 0 : ranks % hkv != 0)
    throw DecoderError(tp + ": num_key_value_heads = " + std::to_string(hkv) +
                       " must be a multiple of the ranks, or the ranks a multiple of it (each KV head then "
                       "replicated on ranks / num_key_value_heads ranks)");
  if (c.intermediate_size % ranks != 0)
    throw DecoderError(tp + ": intermediate_size = " + std::to_string(c.intermediate_size) + " is not a multiple of the ranks");
  TensorParallelShard s;
  s.rank = rank;
  s.ranks = ranks;
  s.q_heads = hq / ranks;
  s.first_q_head = rank * s.q_heads;
  if (ranks <= hkv) {
    s.kv_heads = hkv / ranks;
    s.first_kv_head = rank * s.kv_heads;
  } else {
    s.kv_replicas = ranks / hkv;
    s.kv_heads = 1;
    s.first_kv_head = rank / s.kv_replicas;
  }
  s.intermediate = c.intermediate_size / ranks;
  s.first_intermediate = rank * s.intermediate;
  // The vocabulary need not divide: rank r takes [r V / N, (r + 1) V / N).
  s.first_vocab = int(std::int64_t(rank) * c.vocab_size / ranks);
  s.vocab = int(std::int64_t(rank + 1) * c.vocab_size / ranks) - s.first_vocab;
  return s;
}

namespace {

// Rows [first, first + count) of a row-major [rows, cols] matrix.
std::vector<float> rows_of(const std::vector<float>& m, std::int64_t cols, std::int64_t first, std::int64_t count) {
  return std::vector<float>(m.begin() + first * cols, m.begin() + (first + count) * cols);
}

// Columns [first, first + count) of a row-major [rows, cols] matrix.
std::vector<float> cols_of(const std::vector<float>& m, std::int64_t rows, std::int64_t cols, std::int64_t first,
                           std::int64_t count) {
  std::vector<float> out(std::size_t(rows * count));
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(m.begin() + r * cols + first, m.begin() + r * cols + first + count, out.begin() + r * count);
  return out;
}

}  // namespace

HostWeights shard_weights(const HostWeights& w, const ModelConfig& full, const TensorParallelShard& s) {
  const std::int64_t H = full.hidden_size, D = full.head_dim, I = full.intermediate_size;
  const std::int64_t q0 = std::int64_t(s.first_q_head) * D, nq = std::int64_t(s.q_heads) * D;
  const std::int64_t k0 = std::int64_t(s.first_kv_head) * D, nk = std::int64_t(s.kv_heads) * D;
  HostWeights out;
  out.embed = w.embed;
  out.final_norm = w.final_norm;
  out.lm_head = rows_of(w.lm_head, H, s.first_vocab, s.vocab);
  for (const LayerWeights& l : w.layers) {
    LayerWeights o;
    o.attn_norm = l.attn_norm;
    o.mlp_norm = l.mlp_norm;
    o.q_norm = l.q_norm;
    o.k_norm = l.k_norm;
    o.wq = rows_of(l.wq, H, q0, nq);
    o.wk = rows_of(l.wk, H, k0, nk);
    o.wv = rows_of(l.wv, H, k0, nk);
    o.wo = cols_of(l.wo, H, std::int64_t(full.num_q_heads) * D, q0, nq);
    o.w_gate = rows_of(l.w_gate, H, s.first_intermediate, s.intermediate);
    o.w_up = rows_of(l.w_up, H, s.first_intermediate, s.intermediate);
    o.w_down = cols_of(l.w_down, H, I, s.first_intermediate, s.intermediate);
    out.layers.push_back(std::move(o));
  }
  return out;
}

PolicyOptions shard_policy(const PolicyOptions& p, const ModelConfig& full, const TensorParallelShard& s) {
  // ClusterAttn, SnapKV and LycheeDecode score a KV head with the mean over its group's queries; a
  // replicated KV head's group is split over its replicas, so each would score (and select) alone.
  if (s.kv_replicas > 1 && (p.kind == PolicyKind::kClusterAttn || p.kind == PolicyKind::kSnapKV ||
                            p.kind == PolicyKind::kLycheeDecode))
    throw DecoderError("--tp " + std::to_string(s.ranks) + " replicates each of the " + std::to_string(full.num_kv_heads) +
                       " KV heads on " + std::to_string(s.kv_replicas) + " ranks, which split its query group; --policy " +
                       policy_name(p.kind) + " scores a KV head with its whole group: use --tp <= " +
                       std::to_string(full.num_kv_heads) + " (or --policy dense / streaming)");
  PolicyOptions out = p;
  if (p.kind != PolicyKind::kLycheeDecode || s.ranks == 1) return out;
  // The full model's roles, as lycheedecode_config would make them, then the shard's heads.
  const kvsift::LycheeDecodeConfig whole =
      lycheedecode_config(p.lycheedecode, full.num_layers, full.num_q_heads, full.num_kv_heads, full.head_dim, 1, 1);
  kvsift::HeadRoles mine;
  check(kvsift::shard_head_roles(whole.roles, s.first_kv_head, s.kv_heads, &mine), "LycheeDecode roles of the shard");
  out.lycheedecode.roles.assign(std::size_t(full.num_layers) * s.kv_heads, 0);
  for (int l = 0; l < full.num_layers; ++l)
    for (int h = 0; h < s.kv_heads; ++h)
      out.lycheedecode.roles[std::size_t(l) * s.kv_heads + h] = mine.is_retrieval(l, h) ? 1 : 0;
  out.lycheedecode.roles_name = p.roles_label() + " (KV heads " + std::to_string(s.first_kv_head) + ".." +
                                std::to_string(s.first_kv_head + s.kv_heads - 1) + ")";
  out.lycheedecode.roles_file.clear();
  return out;
}

}  // namespace minimal_decoder
