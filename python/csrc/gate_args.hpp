#pragma once
// From torch tensors to kvsift's HardKuma gate arguments, shared by the CPU and CUDA implementations
// of the gate ops (gates_cpu.cpp, gates_cuda.cpp), so both reject bad input with the same message.
//
// A gate tensor is a, b (and u, grad_h for the sampling ops) of one shape, any number of dimensions
// (a model's gates are [layers, kv_heads]), float32 or float64 (kvsift's gate code is templated on
// the real type, so float64 is kvsift's own computation, not a cast: gradcheck runs on it). Strided
// inputs are copied to contiguous ones: kvsift reads gates as flat arrays and gate tensors are small.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include <kvsift/gates/hardkuma.hpp>
#include <kvsift/gates/roles_from_gates.hpp>

#include "op_args.hpp"

namespace kvsift_torch {

/// The validated options and the contiguous shape parameters of one gate op call.
struct GateCall {
  at::Tensor a, b;  ///< contiguous, one shape and dtype
  std::int64_t n = 0;
  kvsift::HardKumaOptions options;
};

/// kvsift's HardKumaOptions from the op's arguments, validated (ValueError naming options.l / .r).
inline kvsift::HardKumaOptions gate_options(double l, double r, bool clamp_shape, bool clamp_prob_zero, const char* op) {
  kvsift::HardKumaOptions o;
  o.l = l;
  o.r = r;
  o.clamp_shape = clamp_shape;
  o.clamp_prob_zero = clamp_prob_zero;
  throw_if_error(kvsift::validate(o), op);
  return o;
}

/// `t` must have `like`'s shape, dtype and device; returned contiguous.
inline at::Tensor gate_operand(const at::Tensor& t, const at::Tensor& like, const char* op, const char* name,
                               const char* like_name) {
  TORCH_CHECK_VALUE(t.device() == like.device(), "kvsift.", op, ": ", name, " is on ", t.device(), " but ", like_name,
                    " is on ", like.device(), " (every tensor of a call on one device)");
  TORCH_CHECK_VALUE(t.scalar_type() == like.scalar_type(), "kvsift.", op, ": ", name, ".dtype = ", t.scalar_type(),
                    " must equal ", like_name, ".dtype = ", like.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == like.sizes(), "kvsift.", op, ": ", name, " shape ", t.sizes(), " must equal ",
                    like_name, " shape ", like.sizes());
  return t.contiguous();
}

inline GateCall prepare_gates(const at::Tensor& a, const at::Tensor& b, double l, double r, bool clamp_shape,
                              bool clamp_prob_zero, const char* op) {
  TORCH_CHECK_VALUE(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble, "kvsift.", op, ": a.dtype = ",
                    a.scalar_type(), " must be Float or Double (kvsift's gates are float32 or float64)");
  GateCall c;
  c.options = gate_options(l, r, clamp_shape, clamp_prob_zero, op);
  c.a = a.contiguous();
  c.b = gate_operand(b, a, op, "b", "a");
  c.n = a.numel();
  return c;
}

/// The 0-dim output of a reduction over the gates, in a's dtype and device.
inline at::Tensor gate_scalar(const GateCall& c) { return at::empty({}, c.a.options()); }

/// kvsift's real type for a gate dtype (prepare_gates has checked it is one of the two).
template <class F>
auto dispatch_real(at::ScalarType s, const char* op, F&& f) {
  switch (s) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    default: TORCH_CHECK_VALUE(false, "kvsift.", op, ": dtype ", s, " is not float32 or float64");
  }
}

/// The 8 outputs of hardkuma_stats, allocated like a, and the kvsift output struct over them.
struct GateStatsCall {
  at::Tensor outs[8];  ///< prob_zero, prob_one, prob_interior, expected_l0, kuma_mean, mean, d_prob_zero_da, d_prob_zero_db

  explicit GateStatsCall(const GateCall& c) {
    for (at::Tensor& t : outs) t = at::empty_like(c.a);
  }
  template <class T>
  kvsift::GateStatsOutputs<T> outputs() {
    kvsift::GateStatsOutputs<T> o;
    T** fields[8] = {&o.prob_zero, &o.prob_one,  &o.prob_interior,  &o.expected_l0,
                     &o.kuma_mean, &o.mean,      &o.d_prob_zero_da, &o.d_prob_zero_db};
    for (int i = 0; i < 8; ++i) *fields[i] = outs[i].numel() ? static_cast<T*>(outs[i].data_ptr()) : nullptr;
    return o;
  }
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> result() const {
    return {outs[0], outs[1], outs[2], outs[3], outs[4], outs[5], outs[6], outs[7]};
  }
};

/// extract_head_roles' options, validated against the [layers, kv_heads] shape of a.
struct RolesCall {
  GateCall gates;
  kvsift::RoleExtractionOptions options;
  int layers = 0, kv_heads = 0;
  at::Tensor retrieval;  ///< bool [layers, kv_heads]: true = retrieval head (byte-compatible with kvsift's uint8 roles)
  at::Tensor scores;     ///< E[K] per gate, a's dtype
};

inline RolesCall prepare_roles(const at::Tensor& a, const at::Tensor& b, const std::string& selection, double threshold,
                               std::int64_t total_retrieval_heads, bool force_layer0, bool clamp_shape) {
  const char* op = "extract_head_roles";
  TORCH_CHECK_VALUE(a.dim() == 2, "kvsift.", op, ": a must have 2 dimensions [layers, kv_heads] (got shape ",
                    a.sizes(), ")");
  RolesCall c;
  c.gates = prepare_gates(a, b, -0.1, 1.1, clamp_shape, true, op);
  kvsift::RoleExtractionOptions& o = c.options;
  if (selection == "threshold") o.selection = kvsift::RoleSelection::kThreshold;
  else if (selection == "top_n") o.selection = kvsift::RoleSelection::kTopN;
  else TORCH_CHECK_VALUE(false, "kvsift.", op, ": selection = '", selection, "' must be 'threshold' or 'top_n'");
  o.threshold = threshold;
  o.total_retrieval_heads = to_int(total_retrieval_heads, op, "total_retrieval_heads");
  o.force_layer0 = force_layer0;
  o.gate = c.gates.options;
  c.layers = to_int(a.size(0), op, "layers");
  c.kv_heads = to_int(a.size(1), op, "kv_heads");
  throw_if_error(kvsift::detail::validate_role_extraction(o, c.layers, c.kv_heads), op);
  c.retrieval = at::empty(a.sizes(), a.options().dtype(at::kBool));
  c.scores = at::empty_like(c.gates.a);
  return c;
}

}  // namespace kvsift_torch
