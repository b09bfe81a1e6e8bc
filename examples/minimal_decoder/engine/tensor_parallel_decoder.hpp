#pragma once
// A decoder sharded over N ranks (engine/tensor_parallel.hpp): one Decoder per rank, each on its own
// backend with its shard's config, weights and policy options, run by one thread per rank in
// lockstep; the ranks' all-reduces go through `Comm` (HostAllReduce for CPU ranks). prefill and
// decode return the full logits, [B, vocab_size]: the ranks' LM-head slices side by side.
//
// One thread per rank, not one process: the ranks share the host weights they are sliced from and
// the prompts, and a test compares them with an unsharded decoder in the same process. With N = 1 the
// same path runs one Decoder and no all-reduce.

#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/tensor_parallel.hpp"

namespace minimal_decoder {

template <class Backend, class Comm>
class TensorParallelDecoder {
 public:
  // One backend per rank (they outlive this object); `weights` are the full model's.
  TensorParallelDecoder(const std::vector<Backend*>& backends, const ModelConfig& full, const HostWeights& weights,
                        const PolicyOptions& policy, const DecoderLimits& limits)
      : full_(full), ranks_(int(backends.size())), comm_(ranks_) {
    for (int r = 0; r < ranks_; ++r) {
      shards_.push_back(tensor_parallel_shard(full, ranks_, r));
      configs_.push_back(std::make_unique<ModelConfig>(shards_.back().config(full)));
      weights_.push_back(std::make_unique<BackendWeights<Backend>>(*backends[std::size_t(r)], *configs_.back(),
                                                                   shard_weights(weights, full, shards_.back())));
      DecoderRank rank;
      rank.rank = r;
      rank.ranks = ranks_;
      if (ranks_ > 1) rank.all_reduce = [this, r](float* data, std::int64_t n) { comm_.all_reduce(r, data, n); };
      decoders_.push_back(std::make_unique<Decoder<Backend>>(*backends[std::size_t(r)], *configs_.back(), *weights_.back(),
                                                             shard_policy(policy, full, shards_.back()), limits,
                                                             std::move(rank)));
    }
  }

  int ranks() const { return ranks_; }
  const TensorParallelShard& shard(int r) const { return shards_[std::size_t(r)]; }
  Decoder<Backend>& rank_decoder(int r) { return *decoders_[std::size_t(r)]; }

  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts) {
    return gather(int(prompts.size()), on_every_rank([&](Decoder<Backend>& d) { return d.prefill(prompts); }));
  }
  std::vector<float> decode(const std::vector<std::int32_t>& next) {
    return gather(int(next.size()), on_every_rank([&](Decoder<Backend>& d) { return d.decode(next); }));
  }

 private:
  // f(rank's decoder) on every rank at once, one thread each; the first failure is rethrown once the
  // other ranks have given up (the all-reduce is aborted, so none waits for the failed rank).
  template <class F>
  std::vector<std::vector<float>> on_every_rank(F&& f) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks_));
    if (ranks_ == 1) {
      out[0] = f(*decoders_[0]);
      return out;
    }
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks_));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks_; ++r)
      threads.emplace_back([&, r] {
        try {
          out[std::size_t(r)] = f(*decoders_[std::size_t(r)]);
        } catch (...) {
          errors[std::size_t(r)] = std::current_exception();
          comm_.abort();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    return out;
  }

  // Row b of the result is the ranks' rows b side by side (rank r's slice starts at first_vocab).
  std::vector<float> gather(int rows, const std::vector<std::vector<float>>& parts) const {
    const int V = full_.vocab_size;
    std::vector<float> logits(std::size_t(rows) * V);
    for (int r = 0; r < ranks_; ++r) {
      const TensorParallelShard& s = shards_[std::size_t(r)];
      for (int b = 0; b < rows; ++b)
        std::copy(parts[std::size_t(r)].begin() + std::int64_t(b) * s.vocab,
                  parts[std::size_t(r)].begin() + std::int64_t(b + 1) * s.vocab,
                  logits.begin() + std::int64_t(b) * V + s.first_vocab);
    }
    return logits;
  }

  ModelConfig full_;
  int ranks_;
  Comm comm_;
  std::vector<TensorParallelShard> shards_;
  // Decoders keep references to their config and weights: each lives at a fixed address.
  std::vector<std::unique_ptr<ModelConfig>> configs_;
  std::vector<std::unique_ptr<BackendWeights<Backend>>> weights_;
  std::vector<std::unique_ptr<Decoder<Backend>>> decoders_;
};

}  // namespace minimal_decoder
