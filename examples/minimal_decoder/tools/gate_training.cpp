// HardKuma gate training for head roles (gate_training.hpp), with kvsift's host gate ops.

#include "tools/gate_training.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <kvsift/kvsift.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

std::vector<std::vector<double>> loss_weights(const std::vector<PromptTargets>& pool, GateNorm norm) {
  std::vector<std::vector<double>> w(pool.size());
  for (std::size_t p = 0; p < pool.size(); ++p) {
    std::vector<double> sq;
    for (const LayerOutputs& l : pool[p]) {
      double x = 0;
      for (float v : l.dense) x += double(v) * v;
      sq.push_back(x);
    }
    double total = 0;
    for (double x : sq) total += x;
    for (double x : sq) {
      const double n = norm == GateNorm::kModel ? total : x;
      w[p].push_back(n > 0 ? 1.0 / n : 0.0);  // an all-zero output contributes nothing
    }
  }
  return w;
}

std::vector<double> sparse_error_table(const std::vector<PromptTargets>& pool, const GateTrainingShape& s,
                                              GateNorm norm) {
  const std::vector<std::vector<double>> w = loss_weights(pool, norm);
  std::vector<double> err(std::size_t(s.layers) * s.kv_heads, 0.0);
  const int G = s.q_heads / s.kv_heads, D = s.head_dim;
  for (std::size_t p = 0; p < pool.size(); ++p)
    for (int l = 1; l < s.layers; ++l) {
      const LayerOutputs& o = pool[p][std::size_t(l - 1)];
      for (std::size_t i = 0; i < o.dense.size(); ++i) {
        const double d = double(o.sparse[i]) - o.dense[i];
        const int j = int(i / std::size_t(D) % std::size_t(s.q_heads)) / G;
        err[std::size_t(l * s.kv_heads + j)] += d * d * w[p][std::size_t(l - 1)] / double(pool.size());
      }
    }
  for (int j = 0; j < s.kv_heads; ++j) err[std::size_t(j)] = std::numeric_limits<double>::quiet_NaN();
  return err;
}

void check_target_heads(const GateTrainingShape& s, int target_heads) {
  if (target_heads < 0 || target_heads > s.gates())
    throw DecoderError("--train-heads " + std::to_string(target_heads) + ": the model has " + std::to_string(s.gates()) +
                       " gated heads (layers 1.." + std::to_string(s.layers - 1) + " x " + std::to_string(s.kv_heads) +
                       " KV heads)");
}

GateTrainingResult train_head_gates(const std::vector<PromptTargets>& pool, const GateTrainingShape& s,
                                           const GateTrainingOptions& o,
                                           const std::function<void(const GateTrainingReport&)>& report) {
  const std::int64_t n = s.gates();
  if (s.layers < 2 || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0 || s.tokens < 1 || s.head_dim < 1)
    throw DecoderError("head-role training needs at least 2 layers and a valid GQA shape");
  if (pool.empty()) throw DecoderError("head-role training: no training prompts");
  for (const PromptTargets& p : pool) {
    if (p.size() != std::size_t(s.layers - 1))
      throw DecoderError("head-role training: a prompt without every layer's outputs");
    for (const LayerOutputs& l : p)
      if (l.dense.size() != s.layer_size() || l.sparse.size() != s.layer_size())
        throw DecoderError("head-role training: attention outputs of the wrong size");
  }
  check_target_heads(s, o.target_heads);
  if (o.steps < 1) throw DecoderError("head-role training needs at least one step");

  const kvsift::host::Exec exec;
  const int kv = s.kv_heads;
  GateTrainingResult r;
  r.a.assign(std::size_t(s.layers) * kv, 1.f);  // Kuma(1, 1) = uniform, LycheeDecode's init
  r.b = r.a;
  r.draws.assign(pool.size(), 0);
  float* a = r.a.data() + kv;  // the trained gates: layers 1 ..
  float* b = r.b.data() + kv;
  const std::size_t gates = static_cast<std::size_t>(n);
  std::vector<float> z(gates), grad_z(gates), grad_a(gates), grad_b(gates);
  std::vector<float> m_a(gates, 0.f), v_a(gates, 0.f), m_b(gates, 0.f), v_b(gates, 0.f);  // AdamW state
  std::vector<float> mixed(s.layer_size()), grad_o(s.layer_size());

  const std::vector<std::vector<double>> weight = loss_weights(pool, o.norm);

  const kvsift::GateMixShape mix{s.tokens, s.q_heads, kv, s.head_dim};
  const kvsift::LagrangianConfig lag = kvsift::LagrangianConfig::lycheedecode(double(o.target_heads) / double(n));
  kvsift::LagrangianState lag_state = kvsift::lagrangian_initial_state(lag);
  double loss_sum = 0;
  std::int64_t loss_steps = 0;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const kvsift::PhiloxStream draw{o.seed, std::uint64_t(step)};
    check(kvsift::host::hardkuma_sample(exec, o.gate, a, b, n, draw, z.data()), "hardkuma_sample");
    // The prompt: element n of the same stream (the gates use elements 0 .. n-1), uniform over the pool.
    const double u = kvsift::philox_uniform<double>(draw, std::uint64_t(n));
    const std::size_t p = std::min(pool.size() - 1, std::size_t(u * double(pool.size())));
    ++r.draws[p];

    double loss = 0;
    for (int l = 1; l < s.layers; ++l) {
      const LayerOutputs& t = pool[p][std::size_t(l - 1)];
      const float* zl = z.data() + std::int64_t(l - 1) * kv;
      check(kvsift::host::gate_mix_forward(exec, mix, zl, t.dense.data(), t.sparse.data(), mixed.data()),
            "gate_mix_forward");
      const double w = weight[p][std::size_t(l - 1)];
      double sq = 0;
      for (std::size_t i = 0; i < mixed.size(); ++i) {
        const double d = double(mixed[i]) - double(t.dense[i]);
        sq += d * d;
        grad_o[i] = float(2.0 * w * d);
      }
      loss += w * sq;
      check(kvsift::host::gate_mix_backward(exec, mix, zl, t.dense.data(), t.sparse.data(), grad_o.data(),
                                            static_cast<float*>(nullptr), static_cast<float*>(nullptr),
                                            grad_z.data() + std::int64_t(l - 1) * kv),
            "gate_mix_backward");
    }
    check(kvsift::host::hardkuma_sample_backward(exec, o.gate, a, b, n, draw, grad_z.data(), grad_a.data(), grad_b.data()),
          "hardkuma_sample_backward");

    // The sparsity constraint: density = mean P(h != 0); the Lagrangian's multiplier scales its gradient.
    float density = 0, grad_scale = 0;
    kvsift::ExpectedL0Outputs<float> l0;
    l0.density = &density;
    check(kvsift::host::hardkuma_expected_l0(exec, o.gate, a, b, n, l0), "hardkuma_expected_l0");
    kvsift::LagrangianStep lstep;
    check(kvsift::host::lagrangian_update(exec, lag, &lag_state, &density, &grad_scale, &lstep), "lagrangian_update");
    l0 = {};
    l0.grad_a = grad_a.data();
    l0.grad_b = grad_b.data();
    l0.grad_scale = &grad_scale;
    l0.write = kvsift::GradientWrite::kAccumulate;
    check(kvsift::host::hardkuma_expected_l0(exec, o.gate, a, b, n, l0), "hardkuma_expected_l0 (gradient)");

    const double lr = o.adamw.lr * kvsift::warmup_decay_lr_factor(step, o.steps);
    check(kvsift::host::adamw_step(exec, o.adamw, lr, step, a, grad_a.data(), m_a.data(), v_a.data(), n), "adamw_step (a)");
    check(kvsift::host::adamw_step(exec, o.adamw, lr, step, b, grad_b.data(), m_b.data(), v_b.data(), n), "adamw_step (b)");

    loss_sum += loss;
    ++loss_steps;
    if ((o.report_every > 0 && (step + 1) % o.report_every == 0) || step + 1 == o.steps) {
      r.last = GateTrainingReport{step + 1, loss_sum / double(loss_steps), double(density), lstep.lambda};
      if (report) report(r.last);
      loss_sum = 0;
      loss_steps = 0;
    }
  }

  // Roles as LycheeDecode decides them: E[Kuma(a, b)] > 0.5, layer 0 forced to retrieval.
  kvsift::RoleExtractionOptions roles;
  roles.gate = o.gate;
  r.roles.assign(r.a.size(), 0);
  r.kuma_mean.assign(r.a.size(), 0.f);
  check(kvsift::host::extract_head_roles(exec, roles, r.a.data(), r.b.data(), s.layers, kv, r.roles.data(),
                                        r.kuma_mean.data()),
        "extract_head_roles");
  for (int j = 0; j < kv; ++j) r.kuma_mean[std::size_t(j)] = std::numeric_limits<float>::quiet_NaN();
  return r;
}

}  // namespace minimal_decoder
