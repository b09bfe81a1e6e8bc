#pragma once
// Device memory for GPU tests: RAII buffers, copies, and poisoning of outputs before a run.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include <doctest/doctest.h>

#include "support/host_buffer.hpp"

#define KVSIFT_TEST_CUDA(call)                                                    \
  do {                                                                            \
    const cudaError_t kvsift_test_err_ = (call);                                  \
    REQUIRE_MESSAGE(kvsift_test_err_ == cudaSuccess, #call, " failed: ", cudaGetErrorString(kvsift_test_err_)); \
  } while (0)

namespace kvsift_test {


template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_) KVSIFT_TEST_CUDA(cudaMalloc(&ptr_, n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr; o.n_ = 0; }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }

  T* get() const { return ptr_; }
  std::size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_) KVSIFT_TEST_CUDA(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) KVSIFT_TEST_CUDA(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    if (n_) KVSIFT_TEST_CUDA(cudaMemset(ptr_, kPoisonByte, n_ * sizeof(T)));
  }

 private:
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

// Wait for the kernels of a test and surface asynchronous errors (bad addresses, traps).
inline void sync_and_check() {
  KVSIFT_TEST_CUDA(cudaGetLastError());
  KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
}

}  // namespace kvsift_test
