// main for GPU tests: without a usable CUDA device the whole executable reports skipped (exit 77,
// which ctest maps to "Skipped" through SKIP_RETURN_CODE) with the reason, instead of passing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <cstdio>

#include "crash_trace.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device available (%s); GPU tests run on a machine with a GPU.\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU tests on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  kvsift_test::install_crash_trace();
  doctest::Context context(argc, argv);
  return context.run();
}
