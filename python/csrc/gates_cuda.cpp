// CUDA implementations of the HardKuma gate ops: the argument checks of the CPU ones (gate_args.hpp),
// then kvsift's CUDA gate ops (launch_gates.hpp) on torch's current stream. The data is never read on
// the host (no sync, graph-capturable): a NaN a or b, or a u outside (0, 1), gives NaN outputs instead
// of the CPU path's ValueError. Reductions write their 0-dim results on the device, and the expected-L0
// backward reads its scale from there.
#include <torch/library.h>

#include "cuda_context.hpp"
#include "gate_args.hpp"
#include "launch_gates.hpp"

namespace kvsift_torch {
namespace {

template <class T>
const T* ptr(const at::Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mut(at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

at::Tensor hardkuma_sample_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& u, double l, double r,
                                bool clamp_shape) {
  const char* op = "hardkuma_sample";
  CudaContext ctx(a, op, false);
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, true, op);
  const at::Tensor uc = gate_operand(u, a, op, "u", "a");
  at::Tensor h = at::empty_like(c.a);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(cuda_launch::hardkuma_sample<T>(ctx.stream, c.options, ptr<T>(c.a), ptr<T>(c.b), ptr<T>(uc), c.n, mut<T>(h)), op);
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor> hardkuma_sample_backward_cuda(const at::Tensor& grad_h, const at::Tensor& a,
                                                                 const at::Tensor& b, const at::Tensor& u, double l,
                                                                 double r, bool clamp_shape) {
  const char* op = "hardkuma_sample_backward";
  CudaContext ctx(a, op, false);
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, true, op);
  const at::Tensor uc = gate_operand(u, a, op, "u", "a");
  const at::Tensor gh = gate_operand(grad_h, a, op, "grad_h", "a");
  at::Tensor ga = at::empty_like(c.a), gb = at::empty_like(c.a);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(cuda_launch::hardkuma_sample_backward<T>(ctx.stream, c.options, ptr<T>(c.a), ptr<T>(c.b), ptr<T>(uc),
                                                            ptr<T>(gh), c.n, mut<T>(ga), mut<T>(gb)),
                   op);
  });
  return {ga, gb};
}

std::tuple<at::Tensor, at::Tensor> hardkuma_expected_l0_cuda(const at::Tensor& a, const at::Tensor& b, double l,
                                                             double r, bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_expected_l0";
  CudaContext ctx(a, op, false);
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  at::Tensor sum = gate_scalar(c), density = gate_scalar(c);
  if (c.n == 0) density.fill_(std::numeric_limits<double>::quiet_NaN());  // as the CPU op: the mean of no gates
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    kvsift::ExpectedL0Outputs<T> out;
    out.sum = mut<T>(sum);
    out.density = c.n > 0 ? mut<T>(density) : nullptr;
    throw_if_error(cuda_launch::hardkuma_expected_l0<T>(ctx.stream, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, out), op);
  });
  return {sum, density};
}

std::tuple<at::Tensor, at::Tensor> hardkuma_expected_l0_backward_cuda(const at::Tensor& grad_scale, const at::Tensor& a,
                                                                      const at::Tensor& b, double l, double r,
                                                                      bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_expected_l0_backward";
  CudaContext ctx(a, op, false);
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  const at::Tensor scale = gate_operand(grad_scale, gate_scalar(c), op, "grad_scale", "a 0-dim tensor of a's dtype");
  at::Tensor ga = at::empty_like(c.a), gb = at::empty_like(c.a);
  if (c.n == 0) return {ga, gb};
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    kvsift::ExpectedL0Outputs<T> out;
    out.grad_a = mut<T>(ga);
    out.grad_b = mut<T>(gb);
    out.grad_scale = ptr<T>(scale);  // read by the kernel: no host sync
    throw_if_error(cuda_launch::hardkuma_expected_l0<T>(ctx.stream, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, out), op);
  });
  return {ga, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
hardkuma_stats_cuda(const at::Tensor& a, const at::Tensor& b, double l, double r, bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_stats";
  CudaContext ctx(a, op, false);
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  GateStatsCall s(c);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(cuda_launch::hardkuma_stats<T>(ctx.stream, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n,
                                                  s.template outputs<T>()),
                   op);
  });
  return s.result();
}

std::tuple<at::Tensor, at::Tensor> extract_head_roles_cuda(const at::Tensor& a, const at::Tensor& b,
                                                           c10::string_view selection, double threshold,
                                                           std::int64_t total_retrieval_heads, bool force_layer0,
                                                           bool clamp_shape) {
  const char* op = "extract_head_roles";
  CudaContext ctx(a, op, false);
  RolesCall c = prepare_roles(a, b, std::string(selection), threshold, total_retrieval_heads, force_layer0, clamp_shape);
  dispatch_real(c.gates.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(cuda_launch::extract_head_roles<T>(ctx.stream, c.options, ptr<T>(c.gates.a), ptr<T>(c.gates.b),
                                                      c.layers, c.kv_heads,
                                                      reinterpret_cast<std::uint8_t*>(c.retrieval.data_ptr<bool>()),
                                                      mut<T>(c.scores)),
                   op);
  });
  return {c.retrieval, c.scores};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CUDA, m) {
  m.impl("hardkuma_sample", &kvsift_torch::hardkuma_sample_cuda);
  m.impl("hardkuma_sample_backward", &kvsift_torch::hardkuma_sample_backward_cuda);
  m.impl("hardkuma_expected_l0", &kvsift_torch::hardkuma_expected_l0_cuda);
  m.impl("hardkuma_expected_l0_backward", &kvsift_torch::hardkuma_expected_l0_backward_cuda);
  m.impl("hardkuma_stats", &kvsift_torch::hardkuma_stats_cuda);
  m.impl("extract_head_roles", &kvsift_torch::extract_head_roles_cuda);
}
