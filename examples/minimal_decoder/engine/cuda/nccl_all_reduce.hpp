#pragma once
// The all-reduce of tensor-parallel GPU ranks (one thread per GPU, engine/tensor_parallel_decoder.hpp)
// over NCCL: one communicator per rank from ncclCommInitAll, each collective an in-place float sum on
// the rank's own stream, so it is ordered with the rank's kernels and captured into its step's CUDA
// graph like them. Built when CMake finds NCCL (MINIMAL_DECODER_NCCL); the header compiles without nvcc.
//
// Checked at construction: at least one rank, one distinct GPU per rank, all of the same model (the
// shards are equal, so a slower GPU would hold every step back), and NCCL 2.9 or later (CUDA graph
// capture of collectives).

#include <cstdint>
#include <vector>

#include <nccl.h>

#include "engine/cuda/cuda_backend.hpp"

namespace minimal_decoder {

class NcclAllReduce {
 public:
  explicit NcclAllReduce(const std::vector<CudaBackend*>& ranks);
  ~NcclAllReduce();
  NcclAllReduce(const NcclAllReduce&) = delete;
  NcclAllReduce& operator=(const NcclAllReduce&) = delete;

  // Queues the sum of every rank's `data` into each rank's `data` on rank `rank`'s stream; returns at
  // once (every rank's thread must queue it, at the same point of the same step).
  void all_reduce(int rank, float* data, std::int64_t n);
  // A rank failed: nothing on the host waits for a collective, so there is nothing to unblock; the
  // ranks that did queue it would wait on the device, which is why a failed step means a new
  // decoder (and communicator).
  void abort() {}
  void reset() {}

 private:
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
};

}  // namespace minimal_decoder
