#pragma once
// The GPU backend of the decoder: the members of HostBackend (host_backend.hpp) on one CUDA stream,
// plus a side stream for work that may overlap it (fork_side / join_side: LycheeDecode's handoff).
// This header compiles with the host compiler (the CLI and the tools include it); the members that
// launch kernels are defined in cuda_backend.cu, the only part nvcc compiles besides the engine's
// instantiation (cuda_engine.cu).
//
//   weights      bf16 on the device (nn.Linear layout), norms float
//   activations  float, as on the host; rounded to bf16 only as GEMM inputs
//   projections  decode (n <= 8 rows): the pipelined GEMV of cuda_gemv_pipelined.cuh (or the older
//                cuda_gemv.cuh, GemvKernel); prefill: cuBLAS GemmEx, bf16 x bf16 -> float with
//                CUBLAS_COMPUTE_32F. All round the float input to bf16.
//   launches     the backend's own kernels go out with programmatic dependent launch (cuda_pdl.cuh)
//                unless programmatic_launch() is off; kvsift's and cuBLAS' launch as they do
//   KV cache     bf16 (KvType); kvsift's tensor-core attention reads it
//   attention    kvsift::cuda::* through exec() (stream + device facts): decoder.hpp's unqualified calls resolve by ADL
//
// Integration rules an engine keeps too: every launch, copy and GEMM is queued on the backend's
// stream (or on the side stream between a fork and a join, both events); nothing in a step
// allocates (cuBLAS gets a fixed workspace, the GEMM-input buffer grows during prefill only) or
// synchronizes, except `download` (the logits) and `synchronize` (timing).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kvsift/core/exec_cuda.cuh>
#include <kvsift/core/dtype.hpp>

#include "engine/errors.hpp"
#include "engine/tensor_block.hpp"

namespace minimal_decoder {

namespace kernels {
struct GemvTargets;  // cuda_gemv.cuh
}

// A failed CUDA or cuBLAS call as a DecoderError naming `what`.
void cuda_check(cudaError_t err, const char* what);
void cublas_check(cublasStatus_t st, const char* what);

// True when a usable CUDA device is present (--device auto picks the GPU then).
bool cuda_device_present();

// An owning, zeroed array in device memory (cudaMalloc aligns to 256 bytes, as kvsift's workspaces need).
template <class T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable<T>::value, "DeviceBuffer holds plain data");
  struct Free {
    void operator()(T* p) const { cudaFree(p); }
  };

 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    data_.reset(static_cast<T*>(p));
    // cudaMemset runs on the legacy default stream, which the backend's non-blocking stream does
    // not wait for: finish it here, or it could land after the first write through the stream.
    cuda_check(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
    cuda_check(cudaStreamSynchronize(cudaStreamLegacy), "cudaMemset (synchronize)");
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  std::unique_ptr<T, Free> data_;
  std::size_t size_ = 0;
};

// An owning CUDA event (timing enabled): the two ends of CudaBackend::elapsed_ms.
class CudaEvent {
 public:
  CudaEvent() { cuda_check(cudaEventCreate(&event_), "cudaEventCreate"); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { cudaEventDestroy(event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CudaBackend {
 public:
  using Exec = kvsift::cuda::Exec;
  using KvType = kvsift::bfloat16_t;
  template <class T>
  using Buffer = DeviceBuffer<T>;
  // A weight matrix [rows, cols] in bf16 (nn.Linear layout: rows = out_features).
  struct Matrix {
    DeviceBuffer<__nv_bfloat16> data;
    int rows = 0, cols = 0;
  };

  // The constructor reads switches from the environment, so that one binary measures both sides:
  // MINIMAL_DECODER_PDL=0 launches every kernel plainly (MINIMAL_DECODER_KVSIFT_PDL=0 kvsift's only),
  // MINIMAL_DECODER_GEMV=pipelined / mma / blocked forces one GEMV, MINIMAL_DECODER_ROUTING=0 keeps
  // cuBLAS out of decode, MINIMAL_DECODER_NORM_FUSION=0 keeps the norms in launches of their own. The
  // setters below override them (tests).
  explicit CudaBackend(int device = 0);

  // The decode GEMV: kTensorCore (cuda_gemv_mma.cuh, kPipelined's weight stream with mma.sync
  // products, flat in the input rows), kPipelined (cuda_gemv_pipelined.cuh, persistent blocks,
  // cp.async ring, the fastest at few rows) or kBlocked (cuda_gemv.cuh, one block per 4 rows); kByShape
  // (the default) takes kTensorCore from kTensorCoreFromRows input rows on for inputs of at most
  // kTensorCoreMaxCols columns, kPipelined otherwise (bench_decoder_gemv, docs/performance.md: the
  // 14336-column down projection runs faster on kPipelined up to the rows it caches, and goes to
  // cuBLAS beyond). kPipelined and kBlocked give the same bits; kTensorCore
  // sums in another order (deterministic, within the fp32 rounding of the others).
  enum class GemvKernel { kByShape, kTensorCore, kPipelined, kBlocked };
  static constexpr int kTensorCoreFromRows = 4;
  static constexpr int kTensorCoreMaxCols = 8192;
  static const char* gemv_kernel_name(GemvKernel k) {
    return k == GemvKernel::kByShape      ? "by shape"
           : k == GemvKernel::kTensorCore ? "mma"
           : k == GemvKernel::kPipelined  ? "pipelined"
                                          : "blocked";
  }
  // The kernel `k` runs a projection of n input rows of `cols` on (kByShape resolved; the others as
  // they are).
  static GemvKernel gemv_kernel_for(GemvKernel k, int n, int cols) {
    if (k != GemvKernel::kByShape) return k;
    return n >= kTensorCoreFromRows && cols <= kTensorCoreMaxCols ? GemvKernel::kTensorCore : GemvKernel::kPipelined;
  }
  void set_gemv_kernel(GemvKernel k) { gemv_kernel_ = k; }
  GemvKernel gemv_kernel() const { return gemv_kernel_; }
  // Programmatic dependent launch of the backend's kernels (cuda_pdl.cuh) and of kvsift's first kernel
  // of store_kv and decode_attention (Exec::dependent_launch): each may start while the previous one
  // drains. Off: plain stream order. Changes timing only, never a result. A recorded StepGraph keeps
  // the setting it was captured with.
  void set_programmatic_launch(bool on) {
    pdl_ = on;
    exec_.dependent_launch = on;
  }
  bool programmatic_launch() const { return pdl_; }
  // Decode projections by measured shape (cuda_backend.cu, uses_gemv): the GEMV, or cuBLAS for the
  // large matrices from a few input rows on. Off: the GEMV for every decode projection it can take
  // (the GEMV tests, and MINIMAL_DECODER_ROUTING=0).
  void set_shape_routing(bool on) { shape_routing_ = on; }
  bool shape_routing() const { return shape_routing_; }
  // norm_linear_shared_input's one-launch form (the norm in the GEMV's prologue). Off: the norm
  // kernel, then the GEMV. Changes timing only, never a result.
  void set_norm_fusion(bool on) { fuse_norms_ = on; }
  bool norm_fusion() const { return fuse_norms_; }
  // norm_swiglu_mlp's SwiGLU pairs (cuda_gemv_pipelined.cuh, GemvTargets::swiglu): where gate/up runs
  // on a GEMV with pairs (the pipelined one at 1-2 rows, the tensor-core one) and down on the pipelined
  // GEMV, gate/up writes silu(gate) * up in bf16 and down reads it. Off
  // (MINIMAL_DECODER_SWIGLU_PAIRS=0): gate and up in float, the SwiGLU in down's input loads. Changes
  // timing only, never a result.
  void set_swiglu_pairs(bool on) { swiglu_pairs_ = on; }
  bool swiglu_pairs() const { return swiglu_pairs_; }
  // Whether norm_swiglu_mlp takes the SwiGLU pairs for these arguments (x: the norm's input, normed: its
  // output when the norm runs apart, gate: the pairs' output).
  bool uses_swiglu_pairs(const float* x, const float* normed, int n, const Matrix& w_gate, const Matrix& w_up,
                         const Matrix& w_down, const float* gate) const;
  // How the pipelined GEMV's blocks share its tiles (cuda_gemv_pipelined.cuh): claimed as they go, so
  // a block that a side-stream kernel delays takes fewer, or a fixed share per block, which costs no
  // claims. kBeside (the default) claims while the side stream is forked (fork_side .. join_side: the
  // GEMVs beside LycheeDecode's handoff) and takes fixed shares otherwise; kAlways and kNever are the
  // two alone (MINIMAL_DECODER_GEMV_SCHEDULE=beside|dynamic|static). `beside:N` claims only in the first N
  // pipelined GEMVs after a fork (the handoff is over long before the join: a measurement knob,
  // set_beside_gemvs). Changes timing only, never a result.
  enum class TileSchedule { kBeside, kAlways, kNever };
  static const char* tile_schedule_name(TileSchedule t) {
    return t == TileSchedule::kBeside ? "beside" : t == TileSchedule::kAlways ? "dynamic" : "static";
  }
  void set_tile_schedule(TileSchedule t) { tile_schedule_ = t; }
  TileSchedule tile_schedule() const { return tile_schedule_; }
  void set_beside_gemvs(int n) { beside_gemvs_ = n; }  // 0: every GEMV until the join
  // The pipelined GEMV's grid (GemvTargets::balanced): every block that fits at once (the default), or
  // the fewest blocks that take the same rounds of tiles, so no GEMV ends on a nearly empty last round
  // (MINIMAL_DECODER_GEMV_GRID=full|balanced; a measurement knob: 0 to -1.5% a step, measured before
  // the fixed-share fix). Changes timing only, never a result.
  void set_balanced_grid(bool on) { balanced_grid_ = on; }
  bool balanced_grid() const { return balanced_grid_; }
  // Whether the decoder hands RoPE to kvsift::store_kv (the rotation and the append in one launch) or
  // launches rope() before it (MINIMAL_DECODER_ROPE_STORE=0; decoder.hpp, layer_forward). The two differ
  // in the last bit: rope() lets the compiler fuse its multiply-adds and takes its own frequencies.
  void set_rope_in_store(bool on) { rope_in_store_ = on; }
  bool rope_in_store() const { return rope_in_store_; }

  const char* name() const { return name_.c_str(); }
  // The bandwidth the decoder's roofline divides by (TB/s): the streaming-read ceiling measured on the
  // H200 (4.45) and the H100 80GB HBM3 (3.08; docs/performance.md), else 92% of this GPU's peak (memory
  // clock x bus width), the fraction those two reach.
  double streaming_read_tbps() const;
  // The GPU this backend's memory, stream and kernels live on; make_current() makes it the calling
  // thread's current device (a tensor-parallel rank's thread calls it before any of its work).
  int device() const { return device_; }
  void make_current() const { cuda_check(cudaSetDevice(device_), "cudaSetDevice"); }
  // The stream and the device facts kvsift plans its launches with, read once at construction.
  const Exec& exec() const { return exec_; }
  cudaStream_t stream() const { return stream_.get(); }
  // A second stream for work that may run beside the step's own (LycheeDecode's top-k handoff,
  // decoder.hpp): fork_side() makes it wait for everything queued on stream() so far, side_exec()
  // launches on it, join_side() makes stream() wait for what was queued on it. Both are events, so a
  // captured step records them as graph edges. MINIMAL_DECODER_SIDE_STREAM=0 (or set_side_stream(false))
  // keeps everything on stream(): side_exec() is exec() and the fork and join are nothing.
  // With handoff clusters off (MINIMAL_DECODER_HANDOFF_CLUSTERS=0, set_handoff_clusters(false)) the
  // side Exec's facts say "no thread-block clusters", so the handoff's top-k plans one CTA per row
  // (the stream select) instead of a cluster of up to 16 CTAs: a cluster is placed only when that
  // many SMs of one GPC have room at once, which the GEMVs' persistent blocks rarely leave, while one
  // CTA takes the first slot that frees. Same bits (top-k is exact whatever its plan).
  Exec side_exec() const {
    Exec e = side_stream_on_ ? exec_.on(side_stream_.get()) : exec_;
    if (!handoff_clusters_) e.device.clusters = false;
    return e;
  }
  void fork_side() const;
  void join_side() const;
  void set_side_stream(bool on) { side_stream_on_ = on; }
  void set_handoff_clusters(bool on) { handoff_clusters_ = on; }

  template <class T>
  Buffer<T> alloc(std::size_t n) const {
    return Buffer<T>(n);
  }
  // Host -> device, queued on the stream. From pageable memory the call returns once the source has
  // been staged, so the caller may reuse it at once.
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "upload");
  }
  // Device -> host after the stream's pending work: the step's one synchronization (logits, lengths).
  template <class T>
  void download(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream()), "download");
    cuda_check(cudaStreamSynchronize(stream()), "download (stream synchronize)");
  }
  Matrix make_matrix(const std::vector<float>& w, int rows, int cols) const;
  // Bytes of device memory in use on this GPU (total - free, cudaMemGetInfo), after the stream's work:
  // --soak compares it across a run. Counts every allocation on the device, this process's and others'.
  std::int64_t device_memory_in_use() const {
    synchronize();
    std::size_t free = 0, total = 0;
    cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return std::int64_t(total) - std::int64_t(free);
  }
  // A [block.rows, block.cols] matrix of N(0, scale^2) bf16 values generated on the device from
  // `seed`, element i drawn at the full matrix's index block.global_index(i) (a whole matrix, or a
  // tensor-parallel rank's slice of it: the same values as the slice of the whole): random weights
  // of shapes (llama3-8b) whose host generation would take minutes and 32 GB.
  Matrix random_matrix(const TensorBlock& block, float scale, std::uint64_t seed) const;
  // out[i] = N(0, scale^2) (T: float, kvsift::bfloat16_t, __nv_bfloat16 or kvsift::fp8_e4m3_t;
  // cuda_backend.cu).
  template <class T>
  void fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const;
  // out[i] = value.
  void fill_value(float* out, std::int64_t n, float value) const;
  void synchronize() const { cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

  // A decode step recorded once into a CUDA graph and replayed from then on: one launch per step
  // instead of ~20 per layer, so the GPU never waits for the host between kernels.
  static constexpr bool kRecordsGraphs = true;
  class StepGraph {
   public:
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() { reset(); }
    // Forget the recording (the batch or the buffers it captured changed).
    void reset() {
      if (exec_) cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }

   private:
    friend class CudaBackend;
    cudaGraphExec_t exec_ = nullptr;
    std::uint64_t linear_input_generation_ = 0;  // gemm_input_'s allocation the recording points at
  };
  // The first call captures `record` (everything it queues on the stream) into `graph` and launches
  // it; later calls only launch. A graph recorded before the backend's shared GEMM input buffer was
  // reallocated (a Decoder made later with more rows: reserve_linear_input) is recorded again, not
  // launched with the freed address. Returns true when `record` ran, i.e. when its host-side effects
  // happened. Capture is thread-local and strict: an allocation or synchronisation inside `record`
  // fails loudly instead of being recorded wrongly.
  template <class F>
  bool replay(StepGraph& graph, F&& record) const {
    if (graph.exec_ && graph.linear_input_generation_ != linear_input_generation_) graph.reset();
    const bool recording = graph.exec_ == nullptr;
    if (recording) {
      cuda_check(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      cudaGraph_t g = nullptr;
      try {
        record();
      } catch (...) {
        if (cudaStreamEndCapture(stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
        (void)cudaGetLastError();  // the capture's error is the exception's, not the next call's
        throw;
      }
      cuda_check(cudaStreamEndCapture(stream(), &g), "cudaStreamEndCapture");
      const cudaError_t err = cudaGraphInstantiate(&graph.exec_, g, 0);
      cudaGraphDestroy(g);
      cuda_check(err, "cudaGraphInstantiate");
      graph.linear_input_generation_ = linear_input_generation_;
    }
    cuda_check(cudaGraphLaunch(graph.exec_, stream()), "cudaGraphLaunch");
    return recording;
  }
  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  // GPU time in ms of what `work` queues on the stream, between two events recorded around it, and
  // waits for it: --profile's clock on this backend (engine/step_profile.hpp). Host time spent
  // queueing counts only where the GPU waited for it (launch gaps), as it does in a decode step.
  template <class F>
  double elapsed_ms(F&& work) const {
    const CudaEvent start, stop;
    cuda_check(cudaEventRecord(start.get(), stream()), "cudaEventRecord");
    work();
    cuda_check(cudaEventRecord(stop.get(), stream()), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float ms = 0.f;
    cuda_check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime");
    return double(ms);
  }
  static constexpr const char* kClock = "CUDA events";

  // The members of HostBackend, as kernels on the stream (cuda_backend.cu).
  void embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const;
  void rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const;
  // y[n, rows] = x[n, cols] W^T: the GEMV for a few rows, cuBLAS otherwise.
  void linear(const float* x, int n, const Matrix& w, float* y) const;
  // Room for linear's bf16 copy of an input of up to `elements` floats (cuBLAS' operand), made before
  // a step is captured: a graph cannot allocate, and with a synthetic prefill the first GEMM of a
  // run is inside the first captured decode step.
  void reserve_linear_input(std::int64_t elements) const;
  // Several projections of the same input (q/k/v, gate/up): one GEMV launch when it applies.
  void linear_shared_input(const float* x, int n, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const;
  // x_out = x + delta, then the projections of rms_norm(x_out) (HostBackend's contract): one pipelined
  // GEMV that derives the normalized rows in its prologue where it applies, else the norm kernel
  // (add_rms_norm's, writing x_out) and linear_shared_input, with the same bits.
  void norm_linear_shared_input(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                                float* normed, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const;
  void silu_mul(float* gate, const float* up, std::int64_t n) const;
  void add(float* x, const float* y, std::int64_t n) const;
  void add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps, float* out) const;
  void silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const;
  // HostBackend's contract (norm_linear_shared_input for gate/up, then silu_mul_linear), with the
  // SwiGLU pairs where they apply (uses_swiglu_pairs): same bits either way.
  void norm_swiglu_mlp(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps, float* normed,
                       const Matrix& w_gate, const Matrix& w_up, const Matrix& w_down, float* gate, float* up, float* y) const;
  void rope(float* q, int q_heads, float* k, int k_heads, const std::int32_t* positions, int n, int head_dim, float theta) const;
  // Every KV type the decoder offers can be attended on this backend (fp8 through decode attention's
  // fp16 tensor-core path; a compressing policy's window scores over fp8 take cuda::window_scores'
  // CUDA-core kernels). Decoder's constructor and with_query_rows ask.
  template <class KT>
  static constexpr bool attends_kv() {
    return true;
  }
  static constexpr const char* kFp8AttentionMissing = "fp8 KV on the GPU needs the fp8 decode kernel";
  // y = bf16(x) and back: the query and output rows of attention over an fp8 cache.
  void narrow_to_bf16(const float* x, std::int64_t n, kvsift::bfloat16_t* y) const;
  void widen_from_bf16(const kvsift::bfloat16_t* x, std::int64_t n, float* y) const;
  // View: kvsift::ContiguousKV or PagedKV of KvType (instantiated for both in cuda_backend.cu).
  template <class View>
  void store_kv(const float* k, const float* v, int n, const std::int32_t* seq, const std::int32_t* slot,
                const View& cache) const;
  void scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row, float* dst) const;

 private:
  static constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;  // cuBLAS' own recommendation for Hopper

  struct DestroyStream {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  struct DestroyCublas {
    void operator()(cublasHandle_t h) const { cublasDestroy(h); }
  };

  // `targets` with the next of the kGemvSchedules counter pairs when its tiles are claimed. Consecutive
  // GEMVs overlap under PDL (the next one's blocks start while this one drains), but a GEMV starts
  // only after the one two launches back has finished, so four pairs in turn are never shared.
  kernels::GemvTargets scheduled(kernels::GemvTargets targets) const;
  static constexpr int kGemvSchedules = 4;
  // Whether norm_linear_shared_input's norm can run in the GEMV's prologue (the projections aside).
  bool norm_fuses(const float* x, const float* delta, const float* x_out, const float* w, int n, int dim) const;
  // The GEMV of `targets` with the norm in its prologue (norm_fuses true).
  void norm_gemv(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                 const kernels::GemvTargets& targets) const;
  // The decode GEMV chosen by gemv_kernel_ for `targets` (block ranges filled by the launcher).
  void gemv(const kernels::GemvTargets& targets, int cols, const float* x, int n, const float* up, const char* what) const;
  // kernel<<<grid, block, 0, stream()>>>(args...), with PDL when pdl_; throws on a launch error.
  template <class... Params, class... Args>
  void launch(const char* what, void (*kernel)(Params...), unsigned grid, unsigned block, Args&&... args) const;

  int device_ = 0;
  std::string name_;
  Exec exec_;
  GemvKernel gemv_kernel_ = GemvKernel::kByShape;
  bool shape_routing_ = true;
  bool uses_gemv(const float* x, int n, const Matrix& w) const;
  bool pdl_ = true;
  bool fuse_norms_ = true;
  bool swiglu_pairs_ = true;
  TileSchedule tile_schedule_ = TileSchedule::kBeside;
  int beside_gemvs_ = 0;
  bool balanced_grid_ = false;
  bool rope_in_store_ = true;
  mutable bool side_forked_ = false;  // between fork_side and join_side
  mutable int gemvs_since_fork_ = 0;  // pipelined GEMVs launched since the last fork_side
  mutable DeviceBuffer<int> gemv_schedules_;  // 2 x kGemvSchedules, zeroed; each launch leaves its pair at 0
  mutable unsigned gemv_schedule_next_ = 0;
  struct DestroyEvent {
    void operator()(cudaEvent_t e) const { cudaEventDestroy(e); }
  };
  using EventHandle = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, DestroyEvent>;
  // Destruction runs bottom-up: the cuBLAS handle goes before the stream it was bound to.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, DestroyStream> stream_;
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, DestroyStream> side_stream_;
  bool side_stream_on_ = true;
  bool handoff_clusters_ = true;  // side_exec's facts keep the device's clusters
  EventHandle forked_, joined_;  // fork_side's and join_side's (no timing: ordering only)
  DeviceBuffer<unsigned char> cublas_ws_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, DestroyCublas> cublas_;
  mutable DeviceBuffer<__nv_bfloat16> gemm_input_;  // the bf16 copy of a GEMM's float input
  mutable std::uint64_t linear_input_generation_ = 0;  // counts gemm_input_'s reallocations (StepGraph)
};

}  // namespace minimal_decoder
