#pragma once
// The weights of a tensor-parallel model (engine/tensor_parallel.hpp): one shard per rank, each in its
// rank's backend memory, with the shard's description and ModelConfig. Where a shard comes from is
// the caller's: the slice of the full model's host weights (shard_weights, then uploaded), or made
// on the rank itself from its shard, e.g. the device random weights (cuda/cuda_engine.hpp:
// random_device_weights(be, full, seed, shard)), so that no process ever holds the whole model. Built
// once and shared by every TensorParallelDecoder over it (generate_tensor_parallel's policy decoder
// and its --check reference).

#include <functional>
#include <memory>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/decoder.hpp"
#include "engine/tensor_parallel.hpp"

namespace minimal_decoder {

template <class Backend>
class TensorParallelWeights {
 public:
  // Rank r's weights for its shard, made on `be` (rank r's backend, its device current).
  using MakeShard = std::function<BackendWeights<Backend>(const Backend& be, const TensorParallelShard& shard)>;

  // One rank per backend (the backends outlive this object); rank r's weights are make(r's backend,
  // r's shard of `full`).
  TensorParallelWeights(const std::vector<Backend*>& backends, const ModelConfig& full, const MakeShard& make)
      : full_(full), backends_(backends) {
    if (backends_.empty()) throw DecoderError("tensor parallelism needs at least one rank");
    const int ranks = int(backends_.size());
    for (int r = 0; r < ranks; ++r) {
      backends_[std::size_t(r)]->make_current();  // the rank's buffers go to its device
      shards_.push_back(tensor_parallel_shard(full, ranks, r));
      configs_.push_back(std::make_unique<ModelConfig>(shards_.back().config(full)));
      weights_.push_back(std::make_unique<BackendWeights<Backend>>(make(*backends_[std::size_t(r)], shards_.back())));
    }
  }
  // Each rank's slice of the full model's host weights.
  TensorParallelWeights(const std::vector<Backend*>& backends, const ModelConfig& full, const HostWeights& weights)
      : TensorParallelWeights(backends, full, [&](const Backend& be, const TensorParallelShard& s) {
          return BackendWeights<Backend>(be, s.config(full), shard_weights(weights, full, s));
        }) {}

  // Each rank's weights are freed on its own device.
  ~TensorParallelWeights() {
    for (std::size_t r = weights_.size(); r-- > 0;) {
      try {
        backends_[r]->make_current();
      } catch (...) {  // a destructor must not throw; the frees below then run on the current device
      }
      weights_[r].reset();
    }
  }
  TensorParallelWeights(const TensorParallelWeights&) = delete;
  TensorParallelWeights& operator=(const TensorParallelWeights&) = delete;

  int ranks() const { return int(backends_.size()); }
  const ModelConfig& full_config() const { return full_; }
  const std::vector<Backend*>& backends() const { return backends_; }
  Backend& backend(int r) const { return *backends_[std::size_t(r)]; }
  const TensorParallelShard& shard(int r) const { return shards_[std::size_t(r)]; }
  // The model as rank r runs it (TensorParallelShard::config) and its weights; both live at fixed
  // addresses for the life of this object (decoders keep references to them).
  const ModelConfig& config(int r) const { return *configs_[std::size_t(r)]; }
  const BackendWeights<Backend>& weights(int r) const { return *weights_[std::size_t(r)]; }

 private:
  ModelConfig full_;
  std::vector<Backend*> backends_;
  std::vector<TensorParallelShard> shards_;
  std::vector<std::unique_ptr<ModelConfig>> configs_;
  std::vector<std::unique_ptr<BackendWeights<Backend>>> weights_;
};

}  // namespace minimal_decoder
