#include "engine/cuda/nccl_all_reduce.hpp"

#include <cstring>
#include <string>

#include "engine/errors.hpp"

namespace minimal_decoder {

namespace {
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw DecoderError(std::string(what) + ": " + ncclGetErrorString(r));
}
}  // namespace

NcclAllReduce::NcclAllReduce(const std::vector<CudaBackend*>& ranks) {
  const int n = int(ranks.size());
  if (n < 1) throw DecoderError("tensor parallelism needs at least one GPU rank");
  int version = 0;
  nccl_check(ncclGetVersion(&version), "ncclGetVersion");
  if (version < 20900)
    throw DecoderError("NCCL " + std::to_string(version) + " is too old: tensor parallelism captures its collectives "
                       "into CUDA graphs, which needs NCCL 2.9 or later");
  std::vector<int> devices;
  std::string first_name;
  for (int r = 0; r < n; ++r) {
    const int d = ranks[std::size_t(r)]->device();
    for (int e : devices)
      if (e == d) throw DecoderError("tensor parallelism: ranks " + std::to_string(r) + " and another share GPU " + std::to_string(d) +
                                     " (one GPU per rank)");
    devices.push_back(d);
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    if (r == 0) first_name = prop.name;
    else if (first_name != prop.name)
      throw DecoderError("tensor parallelism: GPU " + std::to_string(d) + " is a " + prop.name + ", GPU " + std::to_string(devices[0]) +
                         " a " + first_name + " (the ranks' shards are equal: use GPUs of one model)");
    streams_.push_back(ranks[std::size_t(r)]->stream());
  }
  comms_.assign(std::size_t(n), nullptr);
  nccl_check(ncclCommInitAll(comms_.data(), n, devices.data()), "ncclCommInitAll");
}

NcclAllReduce::~NcclAllReduce() {
  for (ncclComm_t c : comms_)
    if (c) ncclCommDestroy(c);
}

void NcclAllReduce::all_reduce(int rank, float* data, std::int64_t n) {
  nccl_check(ncclAllReduce(data, data, std::size_t(n), ncclFloat, ncclSum, comms_[std::size_t(rank)], streams_[std::size_t(rank)]),
             "ncclAllReduce");
}

}  // namespace minimal_decoder
