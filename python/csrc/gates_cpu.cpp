// CPU implementations of the HardKuma gate ops: kvsift's host references (kvsift::host::hardkuma_*,
// extract_head_roles) and, for sampling with a caller-given u, the per-gate body of gate_sample.hpp.
// The host paths also check the data (NaN a or b, u outside (0, 1)), which the CUDA paths cannot.
#include <torch/library.h>

#include <kvsift/gates/hardkuma_reference.hpp>
#include <kvsift/gates/roles_from_gates_reference.hpp>

#include "gate_args.hpp"
#include "gate_sample.hpp"

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

at::Tensor hardkuma_sample_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& u, double l, double r,
                               bool clamp_shape) {
  const char* op = "hardkuma_sample";
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, true, op);
  const at::Tensor uc = gate_operand(u, a, op, "u", "a");
  at::Tensor h = at::empty_like(c.a);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(kvsift::detail::validate_hardkuma_sample(c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, mut<T>(h)), op);
    throw_if_error(kvsift::detail::validate_gate_values(c.options, ptr<T>(c.a), ptr<T>(c.b), c.n), op);
    throw_if_error(gates::validate_uniforms(ptr<T>(uc), c.n), op);
    for (std::int64_t i = 0; i < c.n; ++i) gates::sample_gate(c.options, ptr<T>(c.a), ptr<T>(c.b), ptr<T>(uc), mut<T>(h), i);
  });
  return h;
}

std::tuple<at::Tensor, at::Tensor> hardkuma_sample_backward_cpu(const at::Tensor& grad_h, const at::Tensor& a,
                                                                const at::Tensor& b, const at::Tensor& u, double l,
                                                                double r, bool clamp_shape) {
  const char* op = "hardkuma_sample_backward";
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, true, op);
  const at::Tensor uc = gate_operand(u, a, op, "u", "a");
  const at::Tensor gh = gate_operand(grad_h, a, op, "grad_h", "a");
  at::Tensor ga = at::empty_like(c.a), gb = at::empty_like(c.a);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(kvsift::detail::validate_hardkuma_sample_backward(c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, ptr<T>(gh)), op);
    throw_if_error(kvsift::detail::validate_gate_values(c.options, ptr<T>(c.a), ptr<T>(c.b), c.n), op);
    throw_if_error(gates::validate_uniforms(ptr<T>(uc), c.n), op);
    for (std::int64_t i = 0; i < c.n; ++i)
      gates::sample_backward_gate(c.options, ptr<T>(c.a), ptr<T>(c.b), ptr<T>(uc), ptr<T>(gh), mut<T>(ga), mut<T>(gb), i);
  });
  return {ga, gb};
}

std::tuple<at::Tensor, at::Tensor> hardkuma_expected_l0_cpu(const at::Tensor& a, const at::Tensor& b, double l,
                                                            double r, bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_expected_l0";
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  at::Tensor sum = gate_scalar(c), density = gate_scalar(c);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    kvsift::ExpectedL0Outputs<T> out;
    out.sum = mut<T>(sum);
    // The density of no gates is undefined (kvsift rejects asking for it): NaN, as torch's mean of nothing.
    out.density = c.n > 0 ? mut<T>(density) : nullptr;
    if (c.n == 0) density.fill_(std::numeric_limits<double>::quiet_NaN());
    throw_if_error(kvsift::host::hardkuma_expected_l0(kvsift::host::Exec{}, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, out), op);
  });
  return {sum, density};
}

std::tuple<at::Tensor, at::Tensor> hardkuma_expected_l0_backward_cpu(const at::Tensor& grad_scale, const at::Tensor& a,
                                                                     const at::Tensor& b, double l, double r,
                                                                     bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_expected_l0_backward";
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  const at::Tensor scale = gate_operand(grad_scale, gate_scalar(c), op, "grad_scale", "a 0-dim tensor of a's dtype");
  at::Tensor ga = at::empty_like(c.a), gb = at::empty_like(c.a);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    kvsift::ExpectedL0Outputs<T> out;
    out.grad_a = c.n ? mut<T>(ga) : nullptr;
    out.grad_b = c.n ? mut<T>(gb) : nullptr;
    out.grad_scale = ptr<T>(scale);
    throw_if_error(kvsift::host::hardkuma_expected_l0(kvsift::host::Exec{}, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n, out), op);
  });
  return {ga, gb};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
hardkuma_stats_cpu(const at::Tensor& a, const at::Tensor& b, double l, double r, bool clamp_shape, bool clamp_prob_zero) {
  const char* op = "hardkuma_stats";
  GateCall c = prepare_gates(a, b, l, r, clamp_shape, clamp_prob_zero, op);
  GateStatsCall s(c);
  dispatch_real(c.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(kvsift::host::hardkuma_stats(kvsift::host::Exec{}, c.options, ptr<T>(c.a), ptr<T>(c.b), c.n,
                                                s.template outputs<T>()),
                   op);
  });
  return s.result();
}

std::tuple<at::Tensor, at::Tensor> extract_head_roles_cpu(const at::Tensor& a, const at::Tensor& b,
                                                          c10::string_view selection, double threshold,
                                                          std::int64_t total_retrieval_heads, bool force_layer0,
                                                          bool clamp_shape) {
  const char* op = "extract_head_roles";
  RolesCall c = prepare_roles(a, b, std::string(selection), threshold, total_retrieval_heads, force_layer0, clamp_shape);
  dispatch_real(c.gates.a.scalar_type(), op, [&](auto t) {
    using T = decltype(t);
    throw_if_error(kvsift::host::extract_head_roles(kvsift::host::Exec{}, c.options, ptr<T>(c.gates.a), ptr<T>(c.gates.b),
                                                    c.layers, c.kv_heads,
                                                    reinterpret_cast<std::uint8_t*>(c.retrieval.data_ptr<bool>()),
                                                    mut<T>(c.scores)),
                   op);
  });
  return {c.retrieval, c.scores};
}

}  // namespace
}  // namespace kvsift_torch

TORCH_LIBRARY_IMPL(kvsift, CPU, m) {
  m.impl("hardkuma_sample", &kvsift_torch::hardkuma_sample_cpu);
  m.impl("hardkuma_sample_backward", &kvsift_torch::hardkuma_sample_backward_cpu);
  m.impl("hardkuma_expected_l0", &kvsift_torch::hardkuma_expected_l0_cpu);
  m.impl("hardkuma_expected_l0_backward", &kvsift_torch::hardkuma_expected_l0_backward_cpu);
  m.impl("hardkuma_stats", &kvsift_torch::hardkuma_stats_cpu);
  m.impl("extract_head_roles", &kvsift_torch::extract_head_roles_cpu);
}
