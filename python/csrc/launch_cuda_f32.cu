// float32 instantiations of launch_cuda.cuh, and the device-facts cache (one translation unit has it).
#include <mutex>

#include "launch_cuda.cuh"

KVSIFT_TORCH_INSTANTIATE_CUDA(float)

namespace kvsift_torch {
namespace cuda_launch {

kvsift::Status device_facts(int device, kvsift::DeviceFacts* facts) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static kvsift::DeviceFacts cache[kMaxDevices];
  KVSIFT_REQUIRE(device >= 0 && device < kMaxDevices, kInvalidArgument, "device = ", device, " must be in [0, ",
                 kMaxDevices, ")");
  std::lock_guard<std::mutex> lock(mutex);
  if (cache[device].num_sms == 0) KVSIFT_TRY(kvsift::cuda::query_device_facts(device, &cache[device]));
  *facts = cache[device];
  return kvsift::Status();
}

}  // namespace cuda_launch
}  // namespace kvsift_torch
