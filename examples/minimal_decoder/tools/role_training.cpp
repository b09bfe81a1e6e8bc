// The host parts of head-role training (role_training.hpp): the checks and reports around phase 1,
// the gate optimisation (phase 2) and the roles file (phase 3).

#include "tools/role_training.hpp"

#include <chrono>
#include <cstdio>

#include "tools/roles_output.hpp"

namespace minimal_decoder {
namespace {

// How the loss is normalised, in words (reports and the roles file's header).
const char* gate_norm_text(GateNorm norm) {
  return norm == GateNorm::kModel ? "N = sum over layers >= 1 of ||O_dense||^2" : "N = the layer's ||O_dense||^2";
}

GateTrainingOptions gate_options(const PasskeyToolOptions& o) {
  GateTrainingOptions opt;
  opt.steps = o.train_steps;
  opt.target_heads = o.train_heads;
  opt.seed = o.train_seed;
  opt.norm = o.train_norm == "layer" ? GateNorm::kLayer : GateNorm::kModel;
  return opt;
}

void print_gate_table(const GateTrainingResult& r, const std::vector<double>& sparse_error, GateNorm norm, int layers,
                      int kv_heads) {
  std::printf("E[Kuma(a, b)] per (layer, KV head) (retrieval iff > 0.5; layer 0 always retrieval), and in brackets the\n"
              "head's loss with its gate closed, ||O_sparse - O_dense||^2 / N (%s), mean over the prompts\n",
              gate_norm_text(norm));
  print_head_table(layers, kv_heads, 22, [&](int l, int j) {
    const std::size_t i = std::size_t(l * kv_heads + j);
    char cell[48];
    if (l == 0) std::snprintf(cell, sizeof cell, "R (forced)");
    else std::snprintf(cell, sizeof cell, "%s%.3f [%.4f]", r.roles[i] ? "R " : "", double(r.kuma_mean[i]), sparse_error[i]);
    return std::string(cell);
  });
}

// The command line that reproduces a run (the roles file names it), without --model and --roles-out.
std::string train_roles_command(const PasskeyToolOptions& o) {
  const LycheeDecodeOptions& ly = o.policy.lycheedecode;
  std::string c = "minimal_decoder --train-roles " + o.prompt_file + " --lengths ";
  for (std::size_t i = 0; i < o.lengths.size(); ++i) c += (i ? "," : "") + std::to_string(o.lengths[i]);
  if (o.limit > 0) c += " --limit " + std::to_string(o.limit);
  return c + " --train-steps " + std::to_string(o.train_steps) + " --train-heads " + std::to_string(o.train_heads) +
         " --train-seed " + std::to_string(o.train_seed) + " --train-norm " + o.train_norm + " --lycheedecode-budget " +
         std::to_string(ly.budget) + " --lycheedecode-sink " + std::to_string(ly.sink) + " --lycheedecode-recent " +
         std::to_string(ly.recent);
}

}  // namespace

GateTrainingShape start_role_training(const PasskeyToolOptions& o, const ModelConfig& config, const char* backend) {
  const LycheeDecodeOptions& ly = o.policy.lycheedecode;
  const GateTrainingShape shape{config.num_layers, config.num_kv_heads, config.num_q_heads, config.head_dim,
                                kPasskeyDigits - 1};
  if (shape.layers < 2) throw DecoderError("--train-roles: a one-layer model has no heads to train (layer 0 is always retrieval)");
  check_target_heads(shape, o.train_heads);
  const double target = double(o.train_heads) / shape.gates();
  std::printf("HardKuma head-role training (%s, %s): %d gates (layers 1..%d x %d KV heads), target %d heads =\n"
              "density %.4f, %d steps, seed %llu; LycheeDecode token mode, budget %d, sink %d, recent %d\n",
              o.prompt_file.c_str(), backend, shape.gates(), shape.layers - 1, shape.kv_heads, o.train_heads, target,
              o.train_steps, static_cast<unsigned long long>(o.train_seed), ly.budget, ly.sink, ly.recent);
  std::fflush(stdout);
  return shape;
}

int finish_role_training(const PasskeyToolOptions& o, const GateTrainingShape& shape, const char* backend,
                         const std::vector<PromptTargets>& pool, const std::string& lengths_used, double data_s) {
  using Clock = std::chrono::steady_clock;
  const LycheeDecodeOptions& ly = o.policy.lycheedecode;
  const GateTrainingOptions opt = gate_options(o);
  const double target = double(o.train_heads) / shape.gates();
  std::printf("data: %zu prompts (%s tokens) in %.1f s: dense prefill, teacher-forced d1..d4, per layer the dense and\n"
              "sparse attention outputs at the 4 decode steps; computed once per prompt, reused whenever a step draws it\n",
              pool.size(), lengths_used.c_str(), data_s);
  std::fflush(stdout);

  // Phase 2: the gates.
  const auto t_opt = Clock::now();
  const GateTrainingResult r = train_head_gates(pool, shape, opt, [&](const GateTrainingReport& p) {
    std::printf("step %6lld: loss %.6f  density %.4f  lambda %.3f\n", static_cast<long long>(p.step), p.loss, p.density,
                p.lambda);
    std::fflush(stdout);
  });
  const double opt_s = std::chrono::duration<double>(Clock::now() - t_opt).count();
  std::printf("optimisation: %d steps in %.2f s\n", o.train_steps, opt_s);
  print_gate_table(r, sparse_error_table(pool, shape, opt.norm), opt.norm, shape.layers, shape.kv_heads);

  // Phase 3: the roles file, its header saying how it was made.
  const std::string chosen = retrieval_heads_beyond_layer0(r.roles, shape.kv_heads);
  char result[200];
  std::snprintf(result, sizeof result,
                "%d steps, target %d heads beyond layer 0 (density %.4f of %d gates), final density %.4f, lambda %.3f.",
                o.train_steps, o.train_heads, target, shape.gates(), r.last.density, r.last.lambda);
  write_roles_file(o.roles_out,
                   {"From HardKuma head-role training (" + train_roles_command(o) + "), " + std::to_string(pool.size()) +
                        " prompts (" + lengths_used + " tokens), " + backend + ".",
                    result,
                    std::string("Objective: layer-local distillation, sum over layers >= 1 of ||O_mix - O_dense||^2 / N ") +
                        "at the decode steps, " + gate_norm_text(opt.norm) +
                        "; sparse = token selection from the previous layer's dense scores.",
                    "Retrieval iff E[Kuma(a, b)] > 0.5, layer 0 forced. Learned: layer 0 + " + chosen + "."},
                   r.roles, shape.layers, shape.kv_heads);
  std::printf("roles written to %s: layer 0 + %s\n", o.roles_out.c_str(), chosen.c_str());
  std::printf("wall time: data %.1f s, optimisation %.2f s\n", data_s, opt_s);
  std::printf("check them: minimal_decoder --model %s --eval-passkey PROMPTS --lengths L,.. --lycheedecode-budget %d \\\n"
              "  --lycheedecode-sink %d --lycheedecode-recent %d --roles %s\n",
              o.model_dir.c_str(), ly.budget, ly.sink, ly.recent, o.roles_out.c_str());
  return 0;
}

}  // namespace minimal_decoder
