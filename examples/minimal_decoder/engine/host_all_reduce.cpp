#include "engine/host_all_reduce.hpp"

#include <algorithm>
#include <string>

#include "engine/errors.hpp"

namespace minimal_decoder {

HostAllReduce::HostAllReduce(int ranks)
    : ranks_(ranks), inputs_(std::size_t(std::max(ranks, 1)), nullptr), sizes_(std::size_t(std::max(ranks, 1)), 0) {
  if (ranks < 1) throw DecoderError("an all-reduce needs at least one rank");
}

void HostAllReduce::arrive_and_wait(std::unique_lock<std::mutex>& lock) {
  if (aborted_) throw DecoderError("tensor parallelism: another rank failed");
  const std::uint64_t gen = generation_;
  if (++arrived_ == ranks_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  if (generation_ == gen) throw DecoderError("tensor parallelism: another rank failed");
}

void HostAllReduce::all_reduce(int rank, float* data, std::int64_t n) {
  std::unique_lock<std::mutex> lock(mutex_);
  inputs_[std::size_t(rank)] = data;
  sizes_[std::size_t(rank)] = n;
  arrive_and_wait(lock);  // every rank's buffer is published
  for (int r = 0; r < ranks_; ++r)
    if (sizes_[std::size_t(r)] != n)
      throw DecoderError("tensor parallelism: ranks reduce " + std::to_string(n) + " and " +
                         std::to_string(sizes_[std::size_t(r)]) + " values at the same point");
  lock.unlock();
  std::vector<float> sum(std::size_t(n), 0.f);
  for (int r = 0; r < ranks_; ++r) {
    const float* in = inputs_[std::size_t(r)];
    for (std::int64_t i = 0; i < n; ++i) sum[std::size_t(i)] += in[i];
  }
  lock.lock();
  arrive_and_wait(lock);  // every rank has read every buffer
  lock.unlock();
  std::copy(sum.begin(), sum.end(), data);
}

void HostAllReduce::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = false;
  arrived_ = 0;
}

void HostAllReduce::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  cv_.notify_all();
}

}  // namespace minimal_decoder
