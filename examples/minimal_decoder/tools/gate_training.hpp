#pragma once
// HardKuma head-role training on precomputed attention outputs (--train-roles; docs/fidelity.md):
// LycheeDecode's gate loop (docs/ops/hardkuma.md "A training step") on
// kvsift's host gate ops, with a layer-local distillation objective. No model is needed here: the
// loop sees, per training prompt and per layer l >= 1, the layer's dense attention output at the
// decode steps and its sparse output (attention over LycheeDecode's selection), both computed once
// (layer_distillation.hpp), so tests can drive it with synthetic tensors.
//
// One gate per (layer >= 1, KV head): layer 0 is always a retrieval head and is never mixed, so it
// gets no gate (LycheeDecode's reference keeps layer-0 gates that only the density penalty moves;
// counting them would just shift the target). Each step:
//   z = hardkuma_sample(a, b; Philox(seed, step))      one gate vector, shared by the prompt's tokens
//   O_l = gate_mix_forward(z_l, O_dense_l, O_sparse_l)  for every layer l >= 1
//   loss = sum_l ||O_l - O_dense_l||^2 / N               (N: see below)
//   + lambda * c(density)                              one-sided Lagrangian, target K / gates
// and AdamW on (a, b) with lr 0.01 and the 20% warm-up / decay schedule.
//
// Since O_l - O_dense_l = (1 - z_j)(O_sparse - O_dense) per KV head j, a head's loss is (1 - z_j)^2
// times its sparse error ||O_sparse - O_dense||^2 / N: the gates learn which heads lose the most when
// they attend sparsely, against the price lambda / gates of keeping one more gate open. The loss must
// be relative (dimensionless) for lambda's range (2..20) to mean anything, and N decides what
// "relative" compares (GateNorm):
//   kModel (default)  N = sum over all layers >= 1 of ||O_dense_l||^2 for the prompt: the error of the
//                     stacked attention outputs relative to their size. Heads of every layer are
//                     measured in the same unit, so a head whose output is small counts little, as it
//                     does in the residual stream.
//   kLayer            N = ||O_dense_l||^2 of the head's own layer. It inflates layers whose attention
//                     output is small: on passkey-llama-13m the late layers' diffuse heads then look as
//                     costly as the retrieval head, and training keeps 7 heads (docs/fidelity.md).

#include <cstdint>
#include <functional>
#include <vector>

#include <kvsift/gates/gate_optimizer.hpp>
#include <kvsift/gates/hardkuma.hpp>

namespace minimal_decoder {

// One layer's attention outputs at a prompt's decode steps, [tokens, q_heads, head_dim] each.
struct LayerOutputs {
  std::vector<float> dense;   // attention over every key (the teacher)
  std::vector<float> sparse;  // attention over the tokens LycheeDecode's sparse head would see
};

// One training prompt: the outputs of layers 1 .. layers - 1, at index layer - 1.
using PromptTargets = std::vector<LayerOutputs>;

struct GateTrainingShape {
  int layers = 0, kv_heads = 0, q_heads = 0, head_dim = 0;
  int tokens = 0;  // decode steps per prompt
  int gates() const { return (layers - 1) * kv_heads; }
  std::size_t layer_size() const { return std::size_t(tokens) * q_heads * head_dim; }
};

// The denominator of the relative loss (see the top of this file).
enum class GateNorm { kModel, kLayer };

struct GateTrainingOptions {
  std::int64_t steps = 3000;
  int target_heads = 2;          // retrieval KV heads wanted beyond layer 0: density target K / gates
  std::uint64_t seed = 1;        // Philox key of the gate draws and of the prompt choice
  kvsift::AdamWConfig adamw;     // lr 0.01, betas 0.9 / 0.999, no weight decay (LycheeDecode)
  kvsift::HardKumaOptions gate;  // support (-0.1, 1.1), a and b clamped to [1e-6, 100]
  GateNorm norm = GateNorm::kModel;
  std::int64_t report_every = 500;
};

// What the loop reports every report_every steps and at the end.
struct GateTrainingReport {
  std::int64_t step = 0;  // steps done
  double loss = 0;        // task loss, mean over the steps since the last report
  double density = 0;     // expected fraction of open gates at this step
  double lambda = 0;      // the Lagrange multiplier after this step
};

struct GateTrainingResult {
  // [layers * kv_heads], gate i = layer * kv_heads + head; layer 0's entries are unused (1, 1).
  std::vector<float> a, b;
  std::vector<float> kuma_mean;     // E[Kuma(a, b)], the role score; NaN for layer 0 (forced)
  std::vector<std::uint8_t> roles;  // 1 = retrieval: E[K] > 0.5, layer 0 forced (extract_head_roles)
  GateTrainingReport last;
  std::vector<std::int64_t> draws;  // how often each prompt was drawn
};

// 1 / N per prompt and layer (index layer - 1): the weight of a layer's squared error in the loss.
std::vector<std::vector<double>> loss_weights(const std::vector<PromptTargets>& pool, GateNorm norm);

// Each head's loss with its gate closed, ||O_sparse - O_dense||^2 / N, mean over the prompts:
// [layers * kv_heads], NaN for layer 0.
std::vector<double> sparse_error_table(const std::vector<PromptTargets>& pool, const GateTrainingShape& s, GateNorm norm);

// K retrieval heads beyond layer 0 must fit the gated heads (checked before any data is collected).
void check_target_heads(const GateTrainingShape& s, int target_heads);

// The optimisation loop of the top of this file; `report` sees every report_every-th step and the last.
GateTrainingResult train_head_gates(const std::vector<PromptTargets>& pool, const GateTrainingShape& s,
                                    const GateTrainingOptions& o,
                                    const std::function<void(const GateTrainingReport&)>& report = {});

}  // namespace minimal_decoder
