#pragma once
// Tensor parallelism, the arithmetic: which heads, rows and columns of a Llama model one of N ranks
// owns (Megatron-style), and the slicing of the host weights and the policy options for it.
//
//   q / k / v, gate / up   column-parallel: rank r computes its own query heads, KV heads and slice of
//                          the MLP's intermediate features (rows of those matrices)
//   o, down                row-parallel: rank r multiplies its slice of the inputs (columns) and the
//                          ranks' partial outputs are summed (one all-reduce each, per layer)
//   LM head                vocab-parallel: rank r computes the logits of its vocabulary slice; the
//                          driver concatenates them
//   embedding, norms       replicated
//
// KV heads: with N <= Hkv each rank owns Hkv / N of them (N must divide Hkv); with N > Hkv each KV
// head is replicated on N / Hkv ranks (N must be a multiple of Hkv), and each of those ranks owns
// Hq / N of its query heads (dense and StreamingLLM only: see shard_policy). kvsift's policies then
// run per rank over its own heads: the KV cache,
// the LycheeDecode index table and roles, and ClusterAttn's compression are per rank, and none of
// them needs data from another rank (a sparse head reuses the selection of the same head index from
// an earlier layer, which the same rank owns).

#include <cstdint>

#include "engine/checkpoint.hpp"
#include "engine/model_config.hpp"
#include "engine/policy.hpp"

namespace minimal_decoder {

// What rank `rank` of `ranks` owns. Ranges are [first, first + count).
struct TensorParallelShard {
  int rank = 0, ranks = 1;
  int first_q_head = 0, q_heads = 0;
  int first_kv_head = 0, kv_heads = 0;  // kv_heads is 1 when KV heads are replicated
  int kv_replicas = 1;                  // ranks holding each of this rank's KV heads
  int first_intermediate = 0, intermediate = 0;
  int first_vocab = 0, vocab = 0;  // the LM-head rows (logits) this rank computes

  // The model as this rank runs it: its heads and intermediate size; vocab_size stays the model's
  // (the embedding is replicated; the LM head's rows are `vocab`).
  ModelConfig config(const ModelConfig& full) const;
};

// Rank `rank`'s shard of `c` over `ranks` ranks; a DecoderError names the field that does not divide.
TensorParallelShard tensor_parallel_shard(const ModelConfig& c, int ranks, int rank);

// The rows and columns of `w` that the shard owns (the layout of TensorParallelShard's comment).
HostWeights shard_weights(const HostWeights& w, const ModelConfig& full, const TensorParallelShard& s);

// The policy options as the shard runs them: LycheeDecode's roles become those of the shard's KV
// heads (a roles file is read here, for the full model, and sharded with kvsift::shard_head_roles).
// With replicated KV heads the policies that score a KV head with its query group (ClusterAttn,
// SnapKV, LycheeDecode) are refused: the group is split over the replicas.
PolicyOptions shard_policy(const PolicyOptions& p, const ModelConfig& full, const TensorParallelShard& s);

}  // namespace minimal_decoder
