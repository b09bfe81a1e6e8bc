#pragma once
// A decoder sharded over N ranks (engine/tensor_parallel.hpp): one Decoder per rank, each on its own
// backend with its shard's config, weights (TensorParallelWeights) and policy options, run by one
// thread per rank in lockstep; the ranks' all-reduces go through `Comm` (HostAllReduce for CPU ranks).
// prefill and decode return the full logits, [B, vocab_size]: the ranks' LM-head slices side by
// side. It has the members of Decoder that the decode loop (generate.hpp) uses, so
// generate_tensor_parallel below runs the same loop over it.
//
// One thread per rank, not one process: the ranks share the host weights they are sliced from (or
// each generates its own shard on its device) and the prompts, and a test compares them with an
// unsharded decoder in the same process. With N = 1 the same path runs one Decoder and no all-reduce.

#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/generate.hpp"
#include "engine/tensor_parallel.hpp"
#include "engine/tensor_parallel_weights.hpp"

namespace minimal_decoder {

template <class Backend, class Comm>
class TensorParallelDecoder {
 public:
  // Over `weights`' ranks and backends (the weights and `comm`, of as many ranks, outlive this object).
  TensorParallelDecoder(Comm& comm, const TensorParallelWeights<Backend>& weights, const PolicyOptions& policy,
                        const DecoderLimits& limits)
      : TensorParallelDecoder(comm, nullptr, &weights, policy, limits) {}
  // One backend per rank and a communicator of as many ranks (both outlive this object); `weights` are
  // the full model's, sliced and uploaded here for this decoder alone.
  TensorParallelDecoder(const std::vector<Backend*>& backends, Comm& comm, const ModelConfig& full, const HostWeights& weights,
                        const PolicyOptions& policy, const DecoderLimits& limits)
      : TensorParallelDecoder(comm, std::make_unique<TensorParallelWeights<Backend>>(backends, full, weights), nullptr, policy,
                              limits) {}

  // Each rank's decoder is freed on its own device (then owned weights, likewise).
  ~TensorParallelDecoder() {
    for (int r = ranks_ - 1; r >= 0; --r) {
      try {
        weights_.backend(r).make_current();
      } catch (...) {  // a destructor must not throw; the frees below then run on the current device
      }
      decoders_[std::size_t(r)].reset();
    }
  }
  TensorParallelDecoder(const TensorParallelDecoder&) = delete;
  TensorParallelDecoder& operator=(const TensorParallelDecoder&) = delete;

  int ranks() const { return ranks_; }
  const TensorParallelShard& shard(int r) const { return weights_.shard(r); }
  Decoder<Backend>& rank_decoder(int r) { return *decoders_[std::size_t(r)]; }

  // Decoder's calls, on every rank; the progress of a prefill is rank 0's.
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts,
                             const typename Decoder<Backend>::Progress& progress = {}) {
    return gather(int(prompts.size()), on_every_rank([&](Decoder<Backend>& d) {
                    return d.prefill(prompts, &d == decoders_[0].get() ? progress : typename Decoder<Backend>::Progress());
                  }));
  }
  std::vector<float> synthetic_prefill(const std::vector<int>& lengths, std::uint64_t seed) {
    return gather(int(lengths.size()), on_every_rank([&](Decoder<Backend>& d) { return d.synthetic_prefill(lengths, seed); }));
  }
  std::vector<float> decode(const std::vector<std::int32_t>& next) {
    return gather(int(next.size()), on_every_rank([&](Decoder<Backend>& d) { return d.decode(next); }));
  }
  void set_attention_timing(bool on) {
    for (auto& d : decoders_) d->set_attention_timing(on);
  }
  void set_graph_steps(bool on) {
    for (auto& d : decoders_) d->set_graph_steps(on);
  }
  // Rank 0's wall clock: the ranks run each call together, and each waits for the others at its
  // all-reduces.
  const StepTiming& timing() const { return decoders_[0]->timing(); }
  // Summed over the ranks: what all of them read (a replicated KV head counts once per replica).
  std::int64_t step_bytes() const { return sum([](const Decoder<Backend>& d) { return d.step_bytes(); }); }
  std::int64_t kv_bytes_used() const { return sum([](const Decoder<Backend>& d) { return d.kv_bytes_used(); }); }
  std::int64_t kv_bytes_allocated() const { return sum([](const Decoder<Backend>& d) { return d.kv_bytes_allocated(); }); }

 private:
  // f(rank's decoder) on every rank at once, one thread each; the first failure is rethrown once the
  // other ranks have given up (the all-reduce is aborted, so none waits for the failed rank, and
  // reset once they all have returned). A call that fails before any rank changed its state (every
  // check of a step comes first) leaves the decoder usable; one that fails inside a step leaves the
  // ranks at different points: prefill again.
  template <class F>
  std::vector<std::vector<float>> on_every_rank(F&& f) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(ranks_));
    if (ranks_ == 1) {
      weights_.backend(0).make_current();
      out[0] = f(*decoders_[0]);
      return out;
    }
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks_));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks_; ++r)
      threads.emplace_back([&, r] {
        try {
          weights_.backend(r).make_current();
          out[std::size_t(r)] = f(*decoders_[std::size_t(r)]);
        } catch (...) {
          errors[std::size_t(r)] = std::current_exception();
          comm_.abort();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) {
        comm_.reset();
        std::rethrow_exception(e);
      }
    return out;
  }

  template <class F>
  std::int64_t sum(F&& f) const {
    std::int64_t s = 0;
    for (const auto& d : decoders_) s += f(*d);
    return s;
  }

  // Row b of the result is the ranks' rows b side by side (rank r's slice starts at first_vocab).
  std::vector<float> gather(int rows, const std::vector<std::vector<float>>& parts) const {
    const int V = full_.vocab_size;
    std::vector<float> logits(std::size_t(rows) * V);
    for (int r = 0; r < ranks_; ++r) {
      const TensorParallelShard& s = weights_.shard(r);
      for (int b = 0; b < rows; ++b)
        std::copy(parts[std::size_t(r)].begin() + std::int64_t(b) * s.vocab,
                  parts[std::size_t(r)].begin() + std::int64_t(b + 1) * s.vocab,
                  logits.begin() + std::int64_t(b) * V + s.first_vocab);
    }
    return logits;
  }

  // Over `shared`, or with shared null over `owned` (the host-weights constructor's own copy).
  TensorParallelDecoder(Comm& comm, std::unique_ptr<TensorParallelWeights<Backend>> owned,
                        const TensorParallelWeights<Backend>* shared, const PolicyOptions& policy, const DecoderLimits& limits)
      : owned_(std::move(owned)),
        weights_(shared ? *shared : *owned_),
        full_(weights_.full_config()),
        ranks_(weights_.ranks()),
        comm_(comm) {
    for (int r = 0; r < ranks_; ++r) {
      weights_.backend(r).make_current();  // the rank's buffers go to its device
      DecoderRank rank;
      rank.rank = r;
      rank.ranks = ranks_;
      if (ranks_ > 1) rank.all_reduce = [this, r](float* data, std::int64_t n) { comm_.all_reduce(r, data, n); };
      decoders_.push_back(std::make_unique<Decoder<Backend>>(weights_.backend(r), weights_.config(r), weights_.weights(r),
                                                             shard_policy(policy, full_, weights_.shard(r)), limits,
                                                             std::move(rank)));
    }
  }
  // Declared first, destroyed last: the decoders keep references into the weights.
  std::unique_ptr<TensorParallelWeights<Backend>> owned_;
  const TensorParallelWeights<Backend>& weights_;
  ModelConfig full_;
  int ranks_;
  Comm& comm_;
  std::vector<std::unique_ptr<Decoder<Backend>>> decoders_;
};

// generate() (generate.hpp) over `weights`' ranks: the same decode loop, sampling, --check and
// --soak, with a TensorParallelDecoder over those weights as the model (the policy's and --check's
// dense one share them); `comm` has one rank per backend.
template <class Backend, class Comm>
GenerationReport generate_tensor_parallel(Comm& comm, const TensorParallelWeights<Backend>& weights,
                                          const GenerationRequest& req) {
  const ModelConfig& config = weights.full_config();
  GenerationReport report = detail::generate_admitted(config, req, [&](const GenerationRequest& admitted, const std::vector<int>& origin) {
    return detail::generate_batch(
        [&](const PolicyOptions& policy, const DecoderLimits& limits) {
          return std::make_unique<TensorParallelDecoder<Backend, Comm>>(comm, weights, policy, limits);
        },
        [&] {
          std::int64_t total = 0;
          for (Backend* be : weights.backends()) {
            be->make_current();
            const std::int64_t m = be->device_memory_in_use();
            if (m < 0) return std::int64_t(-1);
            total += m;
          }
          return total;
        },
        config, admitted, origin);
  });
  report.ranks = weights.ranks();
  return report;
}

// The same over the full model's host weights, sliced onto `backends` (one rank each) once.
template <class Backend, class Comm>
GenerationReport generate_tensor_parallel(const std::vector<Backend*>& backends, Comm& comm, const ModelConfig& config,
                                          const HostWeights& weights, const GenerationRequest& req) {
  const TensorParallelWeights<Backend> shards(backends, config, weights);
  return generate_tensor_parallel<Backend, Comm>(comm, shards, req);
}

}  // namespace minimal_decoder
