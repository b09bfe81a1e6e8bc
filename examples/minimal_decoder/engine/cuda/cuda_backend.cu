// The CUDA backend's members that launch kernels or call cuBLAS (cuda_backend.hpp). Each mirrors a
// HostBackend member; the kernels are in cuda_kernels.cuh and cuda_gemv.cuh.

#include "engine/cuda/cuda_backend.hpp"

#include <kvsift/kvsift.cuh>

#include <cstdlib>
#include <cstring>

#include "engine/cuda/cuda_gemv.cuh"
#include "engine/cuda/cuda_gemv_mma.cuh"
#include "engine/cuda/cuda_gemv_pipelined.cuh"
#include "engine/cuda/cuda_kernels.cuh"
#include "engine/cuda/cuda_pdl.cuh"

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

// An environment switch: unset = `fallback`; "0", "off", "false", "no" = false; anything else true.
bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  for (const char* off : {"0", "off", "false", "no"})
    if (std::strcmp(v, off) == 0) return false;
  return true;
}

// The GEMV targets of several projections of one input (at most kGemvMaxTargets; the caller checks).
kernels::GemvTargets gemv_targets(std::initializer_list<std::pair<const CudaBackend::Matrix*, float*>> outputs) {
  kernels::GemvTargets targets{};
  for (const auto& o : outputs) {
    targets.w[targets.count] = o.first->data.data();
    targets.rows[targets.count] = o.first->rows;
    targets.y[targets.count] = o.second;
    ++targets.count;
  }
  return targets;
}

}  // namespace

template <class... Params, class... Args>
void CudaBackend::launch(const char* what, void (*kernel)(Params...), unsigned grid, unsigned block, Args&&... args) const {
  cuda_check(kernels::launch_kernel(kernel, grid, block, 0, stream(), pdl_, std::forward<Args>(args)...), what);
}

CudaBackend::CudaBackend(int device) : device_(device) {
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  pdl_ = env_switch("MINIMAL_DECODER_PDL", true);
  fuse_norms_ = env_switch("MINIMAL_DECODER_NORM_FUSION", true);
  shape_routing_ = env_switch("MINIMAL_DECODER_ROUTING", true);
  side_stream_on_ = env_switch("MINIMAL_DECODER_SIDE_STREAM", true);
  handoff_clusters_ = env_switch("MINIMAL_DECODER_HANDOFF_CLUSTERS", true);
  rope_in_store_ = env_switch("MINIMAL_DECODER_ROPE_STORE", true);
  swiglu_pairs_ = env_switch("MINIMAL_DECODER_SWIGLU_PAIRS", true);
  const char* schedule = std::getenv("MINIMAL_DECODER_GEMV_SCHEDULE");
  if (schedule && std::strcmp(schedule, "static") == 0) tile_schedule_ = TileSchedule::kNever;
  else if (schedule && std::strcmp(schedule, "dynamic") == 0) tile_schedule_ = TileSchedule::kAlways;
  else if (schedule && std::strncmp(schedule, "beside:", 7) == 0 && std::atoi(schedule + 7) > 0) beside_gemvs_ = std::atoi(schedule + 7);
  else if (schedule && *schedule && std::strcmp(schedule, "beside") != 0)
    throw DecoderError(std::string("MINIMAL_DECODER_GEMV_SCHEDULE=") + schedule + ": expected beside, beside:N, dynamic or static");
  const char* grid = std::getenv("MINIMAL_DECODER_GEMV_GRID");
  if (grid && std::strcmp(grid, "balanced") == 0) balanced_grid_ = true;
  else if (grid && *grid && std::strcmp(grid, "full") != 0)
    throw DecoderError(std::string("MINIMAL_DECODER_GEMV_GRID=") + grid + ": expected full or balanced");
  const char* gemv = std::getenv("MINIMAL_DECODER_GEMV");
  if (gemv && std::strcmp(gemv, "blocked") == 0) gemv_kernel_ = GemvKernel::kBlocked;
  else if (gemv && std::strcmp(gemv, "pipelined") == 0) gemv_kernel_ = GemvKernel::kPipelined;
  else if (gemv && std::strcmp(gemv, "mma") == 0) gemv_kernel_ = GemvKernel::kTensorCore;
  else if (gemv && std::strcmp(gemv, "shape") == 0) gemv_kernel_ = GemvKernel::kByShape;
  else if (gemv && *gemv)
    throw DecoderError(std::string("MINIMAL_DECODER_GEMV=") + gemv + ": expected shape, mma, pipelined or blocked");
  // The name carries the switches, so --profile's table says which side it measured.
  name_ = std::string("GPU ") + prop.name + " (cuBLAS bf16, kvsift CUDA; GEMV " + gemv_kernel_name(gemv_kernel_) + ", PDL " +
          (pdl_ ? "on" : "off") +
          ", norms " + (fuse_norms_ ? "fused" : "apart") + ", side stream " + (side_stream_on_ ? "on" : "off") +
          (handoff_clusters_ ? "" : ", handoff without clusters") + ", tiles " + tile_schedule_name(tile_schedule_) +
          (beside_gemvs_ > 0 ? ":" + std::to_string(beside_gemvs_) : std::string()) + (balanced_grid_ ? ", grid balanced" : "") +
          ", RoPE " +
          (rope_in_store_ ? "in store_kv" : "apart") + (swiglu_pairs_ ? "" : ", SwiGLU in down") + ")";
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_.reset(s);
  exec_ = Exec::for_current_device(s);
  // kvsift's share of the PDL chain; MINIMAL_DECODER_KVSIFT_PDL=0 leaves it out alone (to measure it).
  exec_.dependent_launch = pdl_ && env_switch("MINIMAL_DECODER_KVSIFT_PDL", true);
  if (exec_.device.num_sms == 0) throw DecoderError("kvsift: could not read the device facts of GPU " + std::to_string(device));
  cudaStream_t side = nullptr;
  // The side stream's work (a handoff of a few dozen CTAs) must not wait behind the GEMVs' blocks for
  // SM slots: the highest priority lets the block scheduler place it first whenever slots free up.
  // MINIMAL_DECODER_SIDE_PRIORITY=0 gives it the default priority.
  int least = 0, greatest = 0;
  cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  cuda_check(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking,
                                          env_switch("MINIMAL_DECODER_SIDE_PRIORITY", true) ? greatest : 0),
             "cudaStreamCreate (side)");
  side_stream_.reset(side);
  for (EventHandle* e : {&forked_, &joined_}) {
    cudaEvent_t ev = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    e->reset(ev);
  }
  cublasHandle_t h = nullptr;
  cublas_check(cublasCreate(&h), "cublasCreate");
  cublas_.reset(h);
  cublas_check(cublasSetStream(h, s), "cublasSetStream");
  // A fixed cuBLAS workspace: without it cuBLAS may allocate on first use of a kernel, which a
  // captured graph cannot do.
  cublas_ws_ = DeviceBuffer<unsigned char>(kCublasWorkspaceBytes);
  gemv_schedules_ = DeviceBuffer<int>(2 * kGemvSchedules);
  cublas_check(cublasSetWorkspace(h, cublas_ws_.data(), cublas_ws_.size()), "cublasSetWorkspace");
}

void CudaBackend::fork_side() const {
  if (!side_stream_on_) return;
  cuda_check(cudaEventRecord(forked_.get(), stream()), "cudaEventRecord (fork)");
  cuda_check(cudaStreamWaitEvent(side_stream_.get(), forked_.get(), 0), "cudaStreamWaitEvent (fork)");
  side_forked_ = true;
  gemvs_since_fork_ = 0;
}

void CudaBackend::join_side() const {
  if (!side_stream_on_) return;
  cuda_check(cudaEventRecord(joined_.get(), side_stream_.get()), "cudaEventRecord (join)");
  cuda_check(cudaStreamWaitEvent(stream(), joined_.get(), 0), "cudaStreamWaitEvent (join)");
  side_forked_ = false;
}

CudaBackend::Matrix CudaBackend::make_matrix(const std::vector<float>& w, int rows, int cols) const {
  std::vector<__nv_bfloat16> b(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) b[i] = __float2bfloat16_rn(w[i]);
  Matrix m{DeviceBuffer<__nv_bfloat16>(w.size()), rows, cols};
  cuda_check(cudaMemcpy(m.data.data(), b.data(), b.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice),
             "weight upload");
  return m;
}

CudaBackend::Matrix CudaBackend::random_matrix(const TensorBlock& block, float scale, std::uint64_t seed) const {
  Matrix m{DeviceBuffer<__nv_bfloat16>(std::size_t(block.elements())), int(block.rows), int(block.cols)};
  if (block.elements() > 0)
    launch("fill_normal_block", kernels::fill_normal_block<__nv_bfloat16>, kernels::blocks_for(block.elements()),
           kernels::kThreads, m.data.data(), block, seed, scale);
  return m;
}

template <class T>
void CudaBackend::fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const {
  launch("fill_normal", kernels::fill_normal<T>, kernels::blocks_for(n), kernels::kThreads, out, n, seed, scale);
}
template void CudaBackend::fill_normal<float>(float*, std::int64_t, std::uint64_t, float) const;
template void CudaBackend::fill_normal<kvsift::bfloat16_t>(kvsift::bfloat16_t*, std::int64_t, std::uint64_t, float) const;
template void CudaBackend::fill_normal<__nv_bfloat16>(__nv_bfloat16*, std::int64_t, std::uint64_t, float) const;
template void CudaBackend::fill_normal<kvsift::fp8_e4m3_t>(kvsift::fp8_e4m3_t*, std::int64_t, std::uint64_t, float) const;

void CudaBackend::fill_value(float* out, std::int64_t n, float value) const {
  if (n == 0) return;
  launch("fill_value", kernels::fill_value, kernels::blocks_for(n), kernels::kThreads, out, n, value);
}

void CudaBackend::embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const {
  if (n == 0) return;
  launch("embed", kernels::embed<float>, unsigned(n), kernels::kThreads, tokens, n, table.data.data(), table.cols, out);
}

void CudaBackend::rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const {
  if (rows == 0) return;
  // dim is 64..16K: 128 threads for a head's q/k norm, 256 for the hidden state
  const int threads = dim <= 128 ? 128 : kernels::kThreads;
  launch("rms_norm", kernels::rms_norm<float>, unsigned(rows), unsigned(threads), x, dim, w, eps, y);
}

// Row-major W [out, in] is column-major W^T with ld = in, so in cuBLAS' column-major terms
// C[out, n] = op_T(W)[out, in] * X[in, n], all leading dimensions contiguous.
// Whether a decode projection of n input rows runs on the GEMV (else cuBLAS GemmEx). With shape routing
// the choice follows bench_decoder_gemv (H200, 2026-12-01, cold L2, graph replay; llama3-8b matrices):
// - n = 1: the GEMV everywhere (q 15.0 vs cuBLAS 19.2 us, gate+up 63.7 vs 71.9, down 35.6 vs 42.7,
//   LM head 252 vs 258);
// - n >= 3: cuBLAS, flat in n, for the matrices of more than 8192 rows (gate and up, the LM head: at
//   n = 4 71.7 vs 83.0 us for the best GEMV, 260 vs 330; at n = 8 71.9 vs 135, 262 vs 573), and from
//   n = 8 on for the 14336-column down projection (43.0 plus a SwiGLU launch vs 58.6); the GEMV keeps
//   q/k/v and o (q/k/v 26.8 vs 36.6 at n = 4, 35.1 vs 36.4 at n = 8). n = 2 lies between the measured
//   points and stays on the GEMV. End to end (128K, batch 4): dense 22611 -> 22233 us per step,
//   LycheeDecode 11515 -> 11162.
// On the tensor-core GEMV (2026-12-03, bench_decoder_gemv; it is flat in n): the GEMV for every matrix
// but the LM head (at n = 4 gate+up 72.5 vs cuBLAS 72.8 us, which needs a conversion launch too, q/k/v
// 24.8 vs 36.7; the LM head 281 vs 261) and but inputs it cannot keep in shared memory. The down
// projection stays on the pipelined GEMV (by shape: 44.8 vs the mma's 47.6 us at n = 4) and goes to
// cuBLAS from 8 rows as above.
bool CudaBackend::uses_gemv(const float* x, int n, const Matrix& w) const {
  if (!gemv_applies(x, n, w)) return false;
  if (!shape_routing_) return true;
  if (gemv_kernel_for(gemv_kernel_, n, w.cols) == GemvKernel::kTensorCore)
    return !(n >= 3 && w.rows > 65536) && kernels::gemv_mma_caches_input(n, w.cols, exec_.device.max_smem_optin);
  if (n >= 3 && w.rows > 8192) return false;
  if (n >= 8 && w.cols > 8192) return false;
  return true;
}

void CudaBackend::linear(const float* x, int n, const Matrix& w, float* y) const {
  if (n == 0) return;
  if (uses_gemv(x, n, w)) {
    gemv(kernels::single_gemv_target(w.data.data(), w.rows, y), w.cols, x, n, nullptr, "gemv_bf16");
    return;
  }
  const std::int64_t elems = std::int64_t(n) * w.cols;
  reserve_linear_input(elems);  // a no-op once the Decoder has reserved its largest input
  launch("to_bf16", kernels::to_bf16<float>, kernels::blocks_for(elems), kernels::kThreads, x, elems, gemm_input_.data());
  const float alpha = 1.f, beta = 0.f;
  cublas_check(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &alpha, w.data.data(), CUDA_R_16BF,
                            w.cols, gemm_input_.data(), CUDA_R_16BF, w.cols, &beta, y, CUDA_R_32F, w.rows,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

void CudaBackend::reserve_linear_input(std::int64_t elements) const {
  if (std::size_t(elements) > gemm_input_.size()) {
    gemm_input_ = DeviceBuffer<__nv_bfloat16>(std::size_t(elements));
    ++linear_input_generation_;  // graphs recorded with the old buffer are recorded again (replay)
  }
}

void CudaBackend::linear_shared_input(const float* x, int n,
                                      std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
  if (n == 0) return;
  bool fused = outputs.size() <= std::size_t(kernels::kGemvMaxTargets);
  for (const auto& o : outputs) fused = fused && uses_gemv(x, n, *o.first) && o.first->cols == outputs.begin()->first->cols;
  if (!fused) {
    for (const auto& o : outputs) linear(x, n, *o.first, o.second);
    return;
  }
  gemv(gemv_targets(outputs), outputs.begin()->first->cols, x, n, nullptr, "gemv_bf16 (shared input)");
}

bool CudaBackend::norm_fuses(const float* x, const float* delta, const float* x_out, const float* w, int n, int dim) const {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const std::size_t optin = exec_.device.max_smem_optin;
  const GemvKernel kernel = gemv_kernel_for(gemv_kernel_, n, dim);
  const bool fits = kernel == GemvKernel::kPipelined    ? kernels::gemv_norm_fits(n, dim, optin)
                    : kernel == GemvKernel::kTensorCore ? kernels::gemv_mma_norm_fits(n, dim, optin)
                                                        : false;  // the blocked GEMV has no norm prologue
  return fuse_norms_ && fits && aligned(x) && aligned(delta) && aligned(x_out) && aligned(w);
}

void CudaBackend::norm_gemv(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                            const kernels::GemvTargets& targets) const {
  kernels::NormInput norm;
  norm.x = x;
  norm.delta = delta;
  norm.x_out = x_out;
  norm.w = w;
  norm.eps = eps;
  const cudaError_t err = gemv_kernel_for(gemv_kernel_, n, dim) == GemvKernel::kTensorCore
                              ? kernels::launch_gemv_bf16_mma(targets, dim, x, n, stream(), nullptr, pdl_, norm)
                              : kernels::launch_gemv_bf16_pipelined(scheduled(targets), dim, x, n, stream(), nullptr, pdl_, norm);
  cuda_check(err, "gemv_bf16 (RMSNorm fused)");
}

void CudaBackend::norm_linear_shared_input(const float* x, const float* delta, float* x_out, int n, int dim, const float* w,
                                           float eps, float* normed,
                                           std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
  if (n == 0) return;
  bool fused = outputs.size() <= std::size_t(kernels::kGemvMaxTargets) && norm_fuses(x, delta, x_out, w, n, dim);
  for (const auto& o : outputs) fused = fused && uses_gemv(x, n, *o.first) && o.first->cols == dim;
  if (fused) {
    norm_gemv(x, delta, x_out, n, dim, w, eps, gemv_targets(outputs));
    return;
  }
  // The same arithmetic in two launches: the add and norm (into x_out and normed), the projections.
  launch("add_rms_norm", kernels::add_rms_norm<float>, unsigned(n), kernels::kThreads, x, delta, x_out, dim, w, eps, normed);
  linear_shared_input(normed, n, outputs);
}

bool CudaBackend::uses_swiglu_pairs(const float* x, const float* normed, int n, const Matrix& w_gate, const Matrix& w_up,
                                    const Matrix& w_down, const float* gate) const {
  // gate/up as pairs: the pipelined GEMV's up to kGemvSwiGLUPairsMaxRows rows, the tensor-core GEMV's
  // wherever it caches its input; down from their bf16 output: the pipelined GEMV's kGemvBf16InputMaxRows.
  const GemvKernel pairs_kernel = gemv_kernel_for(gemv_kernel_, n, w_gate.cols);
  const bool pairs_apply = pairs_kernel == GemvKernel::kPipelined    ? n <= kernels::kGemvSwiGLUPairsMaxRows
                           : pairs_kernel == GemvKernel::kTensorCore ? kernels::gemv_mma_caches_input(n, w_gate.cols, exec_.device.max_smem_optin)
                                                                     : false;
  const bool bf16_down = gemv_kernel_for(gemv_kernel_, n, w_down.cols) == GemvKernel::kPipelined && n <= kernels::kGemvBf16InputMaxRows;
  return swiglu_pairs_ && pairs_apply && bf16_down && w_gate.rows == w_up.rows && w_gate.cols == w_up.cols &&
         w_down.cols == w_gate.rows && uses_gemv(x, n, w_gate) && uses_gemv(normed, n, w_gate) && uses_gemv(gate, n, w_down);
}

void CudaBackend::norm_swiglu_mlp(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                                  float* normed, const Matrix& w_gate, const Matrix& w_up, const Matrix& w_down, float* gate,
                                  float* up, float* y) const {
  if (n == 0) return;
  if (!uses_swiglu_pairs(x, normed, n, w_gate, w_up, w_down, gate) || w_gate.cols != dim) {
    norm_linear_shared_input(x, delta, x_out, n, dim, w, eps, normed, {{&w_gate, gate}, {&w_up, up}});
    silu_mul_linear(gate, up, n, w_down, y);
    return;
  }
  // The pairs' bf16 output [n, intermediate] in the first half of gate's room; up is not written.
  auto* const h = reinterpret_cast<__nv_bfloat16*>(gate);
  kernels::GemvTargets pairs = gemv_targets({{&w_gate, gate}, {&w_up, up}});
  pairs.swiglu = h;
  if (norm_fuses(x, delta, x_out, w, n, dim)) {
    norm_gemv(x, delta, x_out, n, dim, w, eps, pairs);
  } else {
    launch("add_rms_norm", kernels::add_rms_norm<float>, unsigned(n), kernels::kThreads, x, delta, x_out, dim, w, eps, normed);
    gemv(pairs, dim, normed, n, nullptr, "gemv_bf16 (SwiGLU pairs)");
  }
  cuda_check(kernels::launch_gemv_bf16_pipelined_bf16_input(scheduled(kernels::single_gemv_target(w_down.data.data(), w_down.rows, y)),
                                                            w_down.cols, h, n, stream(), pdl_),
             "gemv_bf16 (bf16 SwiGLU input)");
}

double CudaBackend::streaming_read_tbps() const {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
  const std::string name = prop.name;
  if (name.find("H200") != std::string::npos) return 4.45;
  if (name.find("H100 80GB HBM3") != std::string::npos) return 3.08;
  int khz = 0, bits = 0;
  cuda_check(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device_), "cudaDeviceGetAttribute (memory clock)");
  cuda_check(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device_), "cudaDeviceGetAttribute (bus width)");
  return 0.92 * 2.0 * double(khz) * 1e3 * double(bits) / 8.0 / 1e12;  // double data rate
}

kernels::GemvTargets CudaBackend::scheduled(kernels::GemvTargets targets) const {
  const bool beside = tile_schedule_ == TileSchedule::kBeside && side_forked_ && (beside_gemvs_ == 0 || gemvs_since_fork_ < beside_gemvs_);
  if (side_forked_) ++gemvs_since_fork_;
  const bool claimed = tile_schedule_ == TileSchedule::kAlways || beside;
  if (claimed) targets.schedule = gemv_schedules_.data() + 2 * (gemv_schedule_next_++ % unsigned(kGemvSchedules));
  targets.balanced = balanced_grid_;
  return targets;
}

void CudaBackend::gemv(const kernels::GemvTargets& targets, int cols, const float* x, int n, const float* up,
                       const char* what) const {
  switch (gemv_kernel_for(gemv_kernel_, n, cols)) {
    case GemvKernel::kByShape:  // never: gemv_kernel_for resolves it
    case GemvKernel::kTensorCore: cuda_check(kernels::launch_gemv_bf16_mma(targets, cols, x, n, stream(), up, pdl_), what); return;
    case GemvKernel::kPipelined:
      cuda_check(kernels::launch_gemv_bf16_pipelined(scheduled(targets), cols, x, n, stream(), up, pdl_), what);
      return;
    case GemvKernel::kBlocked: cuda_check(kernels::launch_gemv_bf16(targets, cols, x, n, stream(), up, 0, pdl_), what); return;
  }
}

void CudaBackend::silu_mul(float* gate, const float* up, std::int64_t n) const {
  if (n == 0) return;
  launch("silu_mul", kernels::silu_mul<float>, kernels::blocks_for(n), kernels::kThreads, gate, up, n);
}

void CudaBackend::add(float* x, const float* y, std::int64_t n) const {
  if (n == 0) return;
  launch("add", kernels::add<float>, kernels::blocks_for(n), kernels::kThreads, x, y, n);
}

void CudaBackend::add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps,
                               float* out) const {
  if (rows == 0) return;
  launch("add_rms_norm", kernels::add_rms_norm<float>, unsigned(rows), kernels::kThreads, x, y, x, dim, w, eps, out);
}

void CudaBackend::silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const {
  if (n == 0) return;
  if (uses_gemv(gate, n, w) && reinterpret_cast<std::uintptr_t>(up) % 16 == 0) {
    gemv(kernels::single_gemv_target(w.data.data(), w.rows, y), w.cols, gate, n, up, "gemv_bf16 (SwiGLU)");
    return;
  }
  silu_mul(gate, up, std::int64_t(n) * w.cols);
  linear(gate, n, w, y);
}

void CudaBackend::rope(float* q, int q_heads, float* k, int k_heads, const std::int32_t* positions, int n, int head_dim,
                       float theta) const {
  if (n == 0) return;
  launch("rope", kernels::rope<float>, kernels::blocks_for(std::int64_t(n) * (q_heads + k_heads) * (head_dim / 2)),
         kernels::kThreads, q, q_heads, k, k_heads, positions, n, head_dim, theta);
}

template <class View>
void CudaBackend::store_kv(const float* k, const float* v, int n, const std::int32_t* seq, const std::int32_t* slot,
                           const View& cache) const {
  if (n == 0) return;
  const std::int64_t elems = std::int64_t(n) * cache.num_kv_heads * cache.head_dim;
  launch("store_kv", kernels::store_kv<float, View>, kernels::blocks_for(elems), kernels::kThreads, k, v, n, seq, slot, cache);
}
template void CudaBackend::store_kv(const float*, const float*, int, const std::int32_t*, const std::int32_t*,
                                    const kvsift::ContiguousKV<CudaBackend::KvType>&) const;
template void CudaBackend::store_kv(const float*, const float*, int, const std::int32_t*, const std::int32_t*,
                                    const kvsift::PagedKV<CudaBackend::KvType>&) const;

void CudaBackend::narrow_to_bf16(const float* x, std::int64_t n, kvsift::bfloat16_t* y) const {
  if (n == 0) return;
  launch("to_bf16", kernels::to_bf16<float>, kernels::blocks_for(n), kernels::kThreads, x, n, reinterpret_cast<__nv_bfloat16*>(y));
}
void CudaBackend::widen_from_bf16(const kvsift::bfloat16_t* x, std::int64_t n, float* y) const {
  if (n == 0) return;
  launch("from_bf16", kernels::from_bf16<float>, kernels::blocks_for(n), kernels::kThreads,
         reinterpret_cast<const __nv_bfloat16*>(x), n, y);
}

void CudaBackend::scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row,
                               float* dst) const {
  if (n == 0) return;
  launch("scatter_rows", kernels::scatter_rows<float>, kernels::blocks_for(std::int64_t(n) * row_elems), kernels::kThreads, src,
         n, row_elems, dst_row, dst);
}

}  // namespace minimal_decoder
