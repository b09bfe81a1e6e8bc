// The CUDA backend's members that launch kernels or call cuBLAS (cuda_backend.hpp). Each mirrors a
// HostBackend member; the kernels are in cuda_kernels.cuh and cuda_gemv.cuh.

#include "engine/cuda/cuda_backend.hpp"

#include <kvsift/kvsift.cuh>

#include "engine/cuda/cuda_gemv.cuh"
#include "engine/cuda/cuda_kernels.cuh"

namespace minimal_decoder {

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DecoderError(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw DecoderError(std::string(what) + ": cuBLAS status " + std::to_string(int(st)));
}

bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

namespace {

// The decode GEMV takes a few rows of 16-byte aligned float input and 8-element weight chunks.
bool gemv_applies(const float* x, int n, const CudaBackend::Matrix& w) {
  return n <= kernels::kGemvMaxRows && w.cols % 8 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

// A bad launch configuration shows up here without synchronizing.
void launched(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

}  // namespace

CudaBackend::CudaBackend(int device) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  name_ = std::string("GPU ") + prop.name + " (cuBLAS bf16, kvsift CUDA)";
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_.reset(s);
  exec_ = Exec::for_current_device(s);
  if (exec_.device.num_sms == 0) throw DecoderError("kvsift: could not read the device facts of GPU " + std::to_string(device));
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  cublas_.reset(h);
  cublas_check(cublasSetStream(h, s), "cublasSetStream");
  // A fixed cuBLAS workspace: without it cuBLAS may allocate on first use of a kernel, which a
  // captured graph cannot do.
  cublas_ws_ = DeviceBuffer<unsigned char>(kCublasWorkspaceBytes);
  cublas_check(cublasSetWorkspace(h, cublas_ws_.data(), cublas_ws_.size()), "cublasSetWorkspace");
}

CudaBackend::Matrix CudaBackend::make_matrix(const std::vector<float>& w, int rows, int cols) const {
  std::vector<__nv_bfloat16> b(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) b[i] = __float2bfloat16_rn(w[i]);
  Matrix m{DeviceBuffer<__nv_bfloat16>(w.size()), rows, cols};
  cuda_check(cudaMemcpy(m.data.data(), b.data(), b.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice),
             "weight upload");
  return m;
}

CudaBackend::Matrix CudaBackend::random_matrix(int rows, int cols, float scale, std::uint64_t seed) const {
  Matrix m{DeviceBuffer<__nv_bfloat16>(std::size_t(rows) * cols), rows, cols};
  fill_normal(m.data.data(), std::int64_t(rows) * cols, seed, scale);
  return m;
}

template <class T>
void CudaBackend::fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const {
  kernels::fill_normal<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(out, n, seed, scale);
  launched("fill_normal");
}
template void CudaBackend::fill_normal<float>(float*, std::int64_t, std::uint64_t, float) const;
template void CudaBackend::fill_normal<kvsift::bfloat16_t>(kvsift::bfloat16_t*, std::int64_t, std::uint64_t, float) const;
template void CudaBackend::fill_normal<__nv_bfloat16>(__nv_bfloat16*, std::int64_t, std::uint64_t, float) const;

void CudaBackend::embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const {
  if (n == 0) return;
  kernels::embed<<<unsigned(n), kernels::kThreads, 0, stream()>>>(tokens, n, table.data.data(), table.cols, out);
  launched("embed");
}

void CudaBackend::rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const {
  if (rows == 0) return;
  // dim is 64..16K: 128 threads for a head's q/k norm, 256 for the hidden state
  const int threads = dim <= 128 ? 128 : kernels::kThreads;
  kernels::rms_norm<<<unsigned(rows), unsigned(threads), 0, stream()>>>(x, dim, w, eps, y);
  launched("rms_norm");
}

// Row-major W [out, in] is column-major W^T with ld = in, so in cuBLAS' column-major terms
// C[out, n] = op_T(W)[out, in] * X[in, n], all leading dimensions contiguous.
void CudaBackend::linear(const float* x, int n, const Matrix& w, float* y) const {
  if (n == 0) return;
  if (gemv_applies(x, n, w)) {
    kernels::launch_gemv_bf16(w.data.data(), w.rows, w.cols, x, n, y, stream());
    launched("gemv_bf16");
    return;
  }
  const std::int64_t elems = std::int64_t(n) * w.cols;
  if (std::size_t(elems) > gemm_input_.size()) gemm_input_ = DeviceBuffer<__nv_bfloat16>(std::size_t(elems));  // prefill only
  kernels::to_bf16<<<kernels::blocks_for(elems), kernels::kThreads, 0, stream()>>>(x, elems, gemm_input_.data());
  launched("to_bf16");
  const float alpha = 1.f, beta = 0.f;
  cublas_check(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &alpha, w.data.data(), CUDA_R_16BF,
                            w.cols, gemm_input_.data(), CUDA_R_16BF, w.cols, &beta, y, CUDA_R_32F, w.rows,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void CudaBackend::linear_shared_input(const float* x, int n,
                                      std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
  if (n == 0) return;
  bool fused = outputs.size() <= std::size_t(kernels::kGemvMaxTargets);
  for (const auto& o : outputs) fused = fused && gemv_applies(x, n, *o.first) && o.first->cols == outputs.begin()->first->cols;
  if (!fused) {
    for (const auto& o : outputs) linear(x, n, *o.first, o.second);
    return;
  }
  kernels::GemvTargets targets{};
  for (const auto& o : outputs) {
    targets.w[targets.count] = o.first->data.data();
    targets.rows[targets.count] = o.first->rows;
    targets.y[targets.count] = o.second;
    ++targets.count;
  }
  kernels::launch_gemv_bf16(targets, outputs.begin()->first->cols, x, n, stream());
  launched("gemv_bf16 (shared input)");
}

void CudaBackend::silu_mul(float* gate, const float* up, std::int64_t n) const {
  if (n == 0) return;
  kernels::silu_mul<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(gate, up, n);
  launched("silu_mul");
}

void CudaBackend::add(float* x, const float* y, std::int64_t n) const {
  if (n == 0) return;
  kernels::add<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(x, y, n);
  launched("add");
}

void CudaBackend::add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps,
                               float* out) const {
  if (rows == 0) return;
  kernels::add_rms_norm<<<unsigned(rows), kernels::kThreads, 0, stream()>>>(x, y, dim, w, eps, out);
  launched("add_rms_norm");
}

void CudaBackend::silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const {
  if (n == 0) return;
  if (gemv_applies(gate, n, w) && reinterpret_cast<std::uintptr_t>(up) % 16 == 0) {
    kernels::launch_gemv_bf16(w.data.data(), w.rows, w.cols, gate, n, y, stream(), up);
    launched("gemv_bf16 (SwiGLU)");
    return;
  }
  silu_mul(gate, up, std::int64_t(n) * w.cols);
  linear(gate, n, w, y);
}

void CudaBackend::rope(float* x, const std::int32_t* positions, int n, int heads, int head_dim, float theta) const {
  if (n == 0) return;
  kernels::rope<<<kernels::blocks_for(std::int64_t(n) * (head_dim / 2)), kernels::kThreads, 0, stream()>>>(
      x, positions, n, heads, head_dim, theta);
  launched("rope");
}

template <class View>
void CudaBackend::store_kv(const float* k, const float* v, int n, const std::int32_t* seq, const std::int32_t* slot,
                           const View& cache) const {
  if (n == 0) return;
  const std::int64_t elems = std::int64_t(n) * cache.num_kv_heads * cache.head_dim;
  kernels::store_kv<<<kernels::blocks_for(elems), kernels::kThreads, 0, stream()>>>(k, v, n, seq, slot, cache);
  launched("store_kv");
}
template void CudaBackend::store_kv(const float*, const float*, int, const std::int32_t*, const std::int32_t*,
                                    const kvsift::ContiguousKV<CudaBackend::KvType>&) const;
template void CudaBackend::store_kv(const float*, const float*, int, const std::int32_t*, const std::int32_t*,
                                    const kvsift::PagedKV<CudaBackend::KvType>&) const;

void CudaBackend::narrow_to_bf16(const float* x, std::int64_t n, kvsift::bfloat16_t* y) const {
  if (n == 0) return;
  kernels::to_bf16<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(x, n, reinterpret_cast<__nv_bfloat16*>(y));
  launched("to_bf16");
}
void CudaBackend::widen_from_bf16(const kvsift::bfloat16_t* x, std::int64_t n, float* y) const {
  if (n == 0) return;
  kernels::from_bf16<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(reinterpret_cast<const __nv_bfloat16*>(x), n, y);
  launched("from_bf16");
}

void CudaBackend::scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row,
                               float* dst) const {
  if (n == 0) return;
  kernels::scatter_rows<<<kernels::blocks_for(std::int64_t(n) * row_elems), kernels::kThreads, 0, stream()>>>(
      src, n, row_elems, dst_row, dst);
  launched("scatter_rows");
}

}  // namespace minimal_decoder
