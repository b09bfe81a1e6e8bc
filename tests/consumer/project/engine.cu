// CUDA consumer: the device backend through kvsift.cuh.
#include <kvsift/kvsift.cuh>

#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("engine: built; no CUDA device, so the kernel was not run\n");
    return 0;
  }
  const int B = 1, H = 2, S = 4, D = 8, n = B * H * S * D;
  std::vector<float> k(n);
  for (int i = 0; i < n; ++i) k[i] = float(i + 1);
  float *dk, *dout;
  std::int32_t* dlen;
  cudaMalloc(&dk, n * sizeof(float));
  cudaMalloc(&dout, 2 * n * sizeof(float));
  cudaMalloc(&dlen, sizeof(std::int32_t));
  cudaMemcpy(dk, k.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dlen, &S, sizeof S, cudaMemcpyHostToDevice);
  const auto kv = kvsift::make_bhsd(dk, dk, B, H, S, D, dlen);
  kvsift::Status st = kvsift::cuda::copy_kv_to_dense(kvsift::cuda::Exec::for_current_device(), kv, S, dout, dout + n);
  if (st.ok()) st = kvsift::from_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> out(n);
  cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost);
  const bool ok = st.ok() && out == k;
  std::printf("engine: %s\n", ok ? "ok" : st.to_string().c_str());
  cudaFree(dk);
  cudaFree(dout);
  cudaFree(dlen);
  return ok ? 0 : 1;
}
