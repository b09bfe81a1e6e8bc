#pragma once
// The all-reduce of tensor-parallel ranks that are threads of one process over host memory (the CPU
// backend): every rank calls all_reduce with its buffer of the same length at the same point of the
// same step, and each gets the sum over the ranks, added in rank order, so every rank holds the
// same bits. A rank that fails calls abort(): the others' pending and later calls throw instead of
// waiting for it forever; once every rank has returned, reset() makes the communicator usable again.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace minimal_decoder {

class HostAllReduce {
 public:
  explicit HostAllReduce(int ranks);
  void all_reduce(int rank, float* data, std::int64_t n);
  void abort();
  void reset();  // only while no rank is inside all_reduce

 private:
  // Blocks until every rank has arrived (a reusable barrier); throws once aborted.
  void arrive_and_wait(std::unique_lock<std::mutex>& lock);

  int ranks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const float*> inputs_;
  std::vector<std::int64_t> sizes_;
};

}  // namespace minimal_decoder
