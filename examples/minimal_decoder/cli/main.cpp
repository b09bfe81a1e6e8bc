// minimal_decoder: a Llama-style decoder whose attention runs through kvsift, dense or under a KV
// policy. This file is the program: it parses the command line (options.hpp), loads or draws the
// weights, picks the backend (the CPU reference always; the CUDA backend when the build has it and a
// GPU is present) and runs generation, --compare or one of the passkey tools. The engine it drives
// is engine/ (decoder.hpp is where kvsift is called); the tools are tools/.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/options.hpp"
#include "engine/checkpoint.hpp"
#include "engine/host_all_reduce.hpp"
#include "engine/host_engine.hpp"
#include "engine/median.hpp"
#include "engine/tensor_parallel_decoder.hpp"
#include "engine/tensor_parallel_weights.hpp"
#include "tools/output_file.hpp"
#include "tools/passkey_tools.hpp"
#include "tools/progress.hpp"
#include "tools/prompt_files.hpp"
#include "tools/step_profile_report.hpp"
#ifdef MINIMAL_DECODER_CUDA
#include "engine/cuda/cuda_engine.hpp"
#ifdef MINIMAL_DECODER_NCCL
#include "engine/cuda/cuda_tensor_parallel.hpp"
#endif
#endif

namespace md = minimal_decoder;

namespace {

double mib(std::int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

std::vector<std::vector<std::int32_t>> load_prompts(const md::Options& o, int vocab) {
  if (!o.prompts.empty()) return o.prompts;
  if (!o.prompt_file.empty()) return md::read_prompt_file(o.prompt_file, o.max_prompts);
  std::mt19937_64 rng(o.seed + 1000);
  std::uniform_int_distribution<std::int32_t> id(0, vocab - 1);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int len : o.random_prompt_lengths) {
    std::vector<std::int32_t> p(static_cast<std::size_t>(len));
    for (auto& t : p) t = id(rng);
    prompts.push_back(p);
  }
  return prompts;
}

// --soak's lines: NaN / inf logits, device memory after the warm-up and at the end, tokens/s per tenth
// of the run (its spread says whether throughput stayed flat), and the verdict.
void print_soak(const md::GenerationReport& r) {
  for (std::size_t b = 0; b < r.rejected.size(); ++b)
    if (!r.rejected[b].empty()) std::printf("soak: prompt %zu rejected (%s); the others ran\n", b, r.rejected[b].c_str());
  std::printf("soak: %zu decode steps x %d sequence(s); NaN/inf logits: %lld", r.step_ms.size(), r.sequences_run(),
              r.nonfinite_logits);
  if (r.first_nonfinite_step >= 0) std::printf(" (first at step %d)", r.first_nonfinite_step);
  std::printf("\n");
  if (r.memory_after_warmup >= 0)
    std::printf("soak: device memory in use %.2f MiB after %d steps, %.2f MiB at the end (%+lld bytes)\n",
                mib(r.memory_after_warmup), r.memory_warmup_steps, mib(r.memory_at_end),
                (long long)(r.memory_at_end - r.memory_after_warmup));
  else
    std::printf("soak: device memory not measured (CPU backend, or no step after the warm-up)\n");
  const int window = std::max(1, int(r.step_ms.size() / 10));
  const std::vector<double> w = md::windowed_tokens_per_s(r.step_ms, window, r.sequences_run());
  if (!w.empty()) {
    const auto [lo, hi] = std::minmax_element(w.begin(), w.end());
    std::printf("soak: tokens/s per %d steps:", window);
    for (double x : w) std::printf(" %.0f", x);
    std::printf(" (min %.0f, max %.0f, spread %.1f%%)\n", *lo, *hi, *lo > 0 ? 100.0 * (*hi / *lo - 1.0) : 0.0);
  }
  std::printf("soak: %s\n", md::soak_failed(r) ? "FAILED" : "passed");
}

// roofline_tbps: the bandwidth of the roofline line (none when 0: the CPU without --roofline-tbps).
void print_report(const md::GenerationRequest& req, const md::GenerationReport& r, bool quiet, double roofline_tbps) {
  const int sequences = r.sequences_run();
  std::printf("prefill: %d sequence(s), %lld tokens in %.1f ms (%.0f tokens/s)\n", sequences, r.prompt_tokens,
              r.prefill_ms, r.prompt_tokens / (r.prefill_ms / 1e3));
  const std::size_t steps = r.step_ms.size();
  if (steps > 0) {
    const double ms = r.decode_ms(), tokens = double(steps) * sequences;
    std::printf("decode: %zu steps x %d sequence(s): %.1f tokens/s, %.2f ms/step", steps, sequences,
                tokens / (ms / 1e3), ms / double(steps));
    if (req.time_attention) std::printf(" (attention %.0f%%)", 100.0 * r.attention_ms() / ms);
    // Rank 0's all-reduces, timed like the attention (waits for the slowest rank included).
    if (req.time_attention && r.ranks > 1) std::printf(" (all-reduce %.0f%%)", 100.0 * r.all_reduce_ms() / ms);
    std::printf("\n");
    // Roofline: the bytes a step must read over the bandwidth, against the median step (the first
    // step also records the CUDA graph, so the mean would charge that to every step). N ranks read
    // their shares at once, each at the bandwidth (bytes are the ranks' sum).
    if (roofline_tbps > 0) {
      const double step_ms = md::median(r.step_ms), gb = r.bytes() / double(steps) / 1e9;
      const double floor_ms = gb / (roofline_tbps * r.ranks);  // GB / (TB/s) = ms
      const std::string ranks = r.ranks > 1 ? std::to_string(r.ranks) + " x " : "";
      std::printf("roofline: %.3f GB read per step (weights + K/V attended) at %s%.2f TB/s = %.3f ms; median step %.3f ms"
                  " = %.1f%% of the roofline\n",
                  gb, ranks.c_str(), roofline_tbps, floor_ms, step_ms, step_ms > 0 ? 100.0 * floor_ms / step_ms : 0.0);
    }
  }
  std::printf("KV cache (%s, %s", md::kv_layout_name(req.kv_layout), md::kv_dtype_name(req.kv_dtype));
  if (req.kv_layout == md::KvLayout::kPaged) std::printf(", %d-token pages", req.page_size);
  std::printf("): %.2f MiB in use, %.2f MiB allocated\n", mib(r.kv_bytes_used), mib(r.kv_bytes_allocated));
  if (r.compared > 0)
    std::printf("check vs dense: top-1 agreement %lld/%lld (%.1f%%), KL(dense || policy) mean %.3g, max %.3g nats\n",
                r.top1_agree, r.compared, 100.0 * double(r.top1_agree) / double(r.compared), r.kl_sum / double(r.compared),
                r.kl_max);
  if (req.soak) print_soak(r);
  if (quiet) return;
  for (std::size_t b = 0; b < r.generated.size(); ++b) {
    if (b < r.rejected.size() && !r.rejected[b].empty()) {
      std::printf("sequence %zu: rejected: %s\n", b, r.rejected[b].c_str());
      continue;
    }
    std::printf("sequence %zu (prompt %zu tokens):", b, req.prompts[b].size());
    for (std::int32_t t : r.generated[b]) std::printf(" %d", t);
    std::printf("\n");
  }
}

void write_output_ids(const std::string& path, const md::GenerationReport& r) {
  std::ostringstream out;
  for (const auto& seq : r.generated) {
    for (std::size_t i = 0; i < seq.size(); ++i) out << (i ? " " : "") << seq[i];
    out << "\n";
  }
  md::write_file_replacing(path, out.str(), "--output-ids");
}

// --compare: every policy on the same prompts, each checked against dense, one row each. A row's
// policy name is printed before it runs (a run takes a second or more on the CPU) and its numbers after.
template <class Backend>
void run_compare(Backend& be, const md::Options& o, const md::ModelConfig& config,
                 const md::BackendWeights<Backend>& weights, md::GenerationRequest req) {
  req.check = true;
  req.progress = nullptr;
  long long tokens = 0;
  for (const auto& p : req.prompts) tokens += (long long)p.size();
  std::printf("\nevery policy against dense: %zu prompts (%lld tokens), %d new tokens each, %s\n", req.prompts.size(), tokens,
              req.new_tokens, be.name());
  if (o.model_dir.empty())
    std::printf("RANDOM WEIGHTS: their next-token distribution is nearly flat, so top-1 agreement and KL below only show\n"
                "that each policy runs and how far it strays from dense on noise; they say nothing about fidelity.\n"
                "Fidelity is measured on the trained passkey checkpoint: docs/fidelity.md (or run scripts/demo.sh\n"
                "with KVSIFT_MODEL_DIR=/path/to/passkey-llama-13m for its passkey table).\n");
  std::printf("top-1: decode steps whose argmax equals dense's; KL(dense || policy) per step; decode speed over the\n"
              "decode steps; attention: its share of a step; KV in use: the decode caches after the last step\n\n");
  std::printf("%-12s %8s %10s %10s %10s %10s %10s  %s\n", "policy", "top-1", "KL mean", "KL max", "decode", "attention",
              "KV in use", "settings");
  std::printf("%-12s %8s %10s %10s %10s %10s %10s\n", "", "(%)", "(nats)", "(nats)", "(tok/s)", "(% step)", "(MiB)");
  for (md::PolicyKind kind : md::kAllPolicies) {
    req.policy.kind = kind;
    std::printf("%-12s", md::policy_name(kind));
    std::fflush(stdout);
    const md::GenerationReport r = md::generate(be, config, weights, req);
    const double ms = r.decode_ms();
    const std::string settings = kind == md::PolicyKind::kDense ? "every cached token" : req.policy.settings();
    std::printf(" %7.1f%% %10.3g %10.3g %10.1f %9.0f%% %10.2f  %s\n",
                r.compared ? 100.0 * double(r.top1_agree) / double(r.compared) : 100.0,
                r.compared ? r.kl_sum / double(r.compared) : 0.0, r.kl_max,
                ms > 0 ? double(r.step_ms.size() * req.prompts.size()) / (ms / 1e3) : 0.0,
                ms > 0 ? 100.0 * r.attention_ms() / ms : 0.0, mib(r.kv_bytes_used), settings.c_str());
    std::fflush(stdout);
  }
}

// The roofline's bandwidth: --roofline-tbps, else the backend's ceiling (0 on the CPU: no roofline).
template <class Backend>
double roofline_tbps(const md::Options& o, const Backend& be) {
  return o.roofline_tbps > 0 ? o.roofline_tbps : be.streaming_read_tbps();
}

// --profile: where one decode step's time goes, as a table (and with --json as JSON). The bandwidth
// columns are the GPU's: on the CPU an HBM ceiling says nothing.
template <class Backend>
void run_profile(Backend& be, const md::Options& o, const md::ModelConfig& config,
                 const md::BackendWeights<Backend>& weights, const md::GenerationRequest& req) {
  std::printf("policy: %s\n", req.policy.describe().c_str());
  md::ProgressBar bar(!o.quiet);
  md::GenerationRequest r = req;
  r.progress = [&](const char* phase, long long done, long long total) { bar.update(phase, done, total); };
  const md::StepProfile p = md::profile_step(be, config, weights, r, o.profile_reps);
  bar.finish();
  const double tbps = std::is_same_v<Backend, md::HostBackend> ? 0.0 : roofline_tbps(o, be);
  std::fputs(md::step_profile_table(p, tbps).c_str(), stdout);
  if (!o.json.empty()) md::write_file_replacing(o.json, md::step_profile_json(p, tbps), "--json");
}

// The request the options describe: the prompts loaded, --soak-bad-request's prompt inserted at bad_at.
md::GenerationRequest make_request(const md::Options& o, const md::ModelConfig& config, std::size_t* bad_at) {
  md::GenerationRequest req = o.generation;
  req.prompts = load_prompts(o, config.vocab_size);
  *bad_at = req.prompts.size() / 2;  // --soak-bad-request's prompt
  if (o.soak_bad_request) {
    req.prompts.insert(req.prompts.begin() + std::ptrdiff_t(*bad_at), std::vector<std::int32_t>{1, config.vocab_size, 2});
    req.reject_bad_prompts = true;
  }
  return req;
}

// Prints a generation's report (its roofline at tbps); the exit status (1: a --soak failure).
int finish_generation(const md::Options& o, const md::GenerationRequest& req, const md::GenerationReport& r, std::size_t bad_at,
                      double tbps) {
  print_report(req, r, o.quiet, tbps);
  if (!o.output_ids.empty()) write_output_ids(o.output_ids, r);
  bool rejected_alone = true;  // --soak-bad-request: exactly the injected prompt was rejected
  if (o.soak_bad_request) {
    for (std::size_t b = 0; b < r.rejected.size(); ++b) rejected_alone &= r.rejected[b].empty() == (b != bad_at);
    if (!rejected_alone) std::printf("soak: FAILED: the malformed prompt %zu was not rejected alone\n", bad_at);
  }
  return req.soak && (md::soak_failed(r) || !rejected_alone) ? 1 : 0;
}

template <class Backend>
int run(Backend& be, const md::Options& o, const md::ModelConfig& config, const md::BackendWeights<Backend>& weights) {
  if (o.passkey_tool()) return md::run_passkey_tool(be, o.passkey, config, weights);  // --eval-passkey and friends
  std::size_t bad_at = 0;
  md::GenerationRequest req = make_request(o, config, &bad_at);
  if (o.compare) {
    run_compare(be, o, config, weights, req);
    return 0;
  }
  if (o.profile) {
    run_profile(be, o, config, weights, req);
    return 0;
  }
  std::printf("policy: %s\n", req.policy.describe().c_str());
  md::ProgressBar bar(!o.quiet);
  req.progress = [&](const char* phase, long long done, long long total) { bar.update(phase, done, total); };
  const md::GenerationReport r = md::generate(be, config, weights, req);
  bar.finish();
  return finish_generation(o, req, r, bad_at, roofline_tbps(o, be));
}

// --tp N: the same generation over N ranks, one thread each (engine/tensor_parallel_decoder.hpp):
// `weights` are the ranks' shards on their backends (CPU backends, or one CudaBackend per GPU),
// `comm` their all-reduce.
template <class Backend, class Comm>
int run_tensor_parallel(const md::Options& o, const md::TensorParallelWeights<Backend>& weights, Comm& comm) {
  std::size_t bad_at = 0;
  md::GenerationRequest req = make_request(o, weights.full_config(), &bad_at);
  const md::TensorParallelShard& s0 = weights.shard(0);
  std::printf("tensor parallel: %d rank(s) (%s), %d q / %d KV heads and %d MLP columns each%s\n", o.tp,
              weights.backend(0).name(), s0.q_heads, s0.kv_heads, s0.intermediate,
              s0.kv_replicas > 1 ? (", each KV head on " + std::to_string(s0.kv_replicas) + " ranks").c_str() : "");
  std::printf("policy: %s\n", req.policy.describe().c_str());
  md::ProgressBar bar(!o.quiet);
  req.progress = [&](const char* phase, long long done, long long total) { bar.update(phase, done, total); };
  const md::GenerationReport r = md::generate_tensor_parallel(comm, weights, req);
  bar.finish();
  return finish_generation(o, req, r, bad_at, roofline_tbps(o, weights.backend(0)));
}

int run_tensor_parallel_cpu(const md::Options& o, const md::ModelConfig& config, const md::HostWeights& host_weights) {
  std::vector<md::HostBackend> backends(static_cast<std::size_t>(o.tp));
  std::vector<md::HostBackend*> ranks;
  for (auto& be : backends) ranks.push_back(&be);
  md::HostAllReduce comm(o.tp);
  const md::TensorParallelWeights<md::HostBackend> weights(ranks, config, host_weights);
  return run_tensor_parallel(o, weights, comm);
}

#ifdef MINIMAL_DECODER_NCCL
// GPUs 0 .. N-1, one rank each. Without host weights (device_random: --random llama3-8b) each rank
// generates its own shard of the random model on its GPU (random_device_weights with the shard), the
// values the unsharded model has there; with them, each rank's slice is uploaded.
int run_tensor_parallel_gpu(const md::Options& o, const md::ModelConfig& config, const md::HostWeights& host_weights,
                            bool device_random) {
  int count = 0;
  md::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < o.tp)
    throw md::DecoderError("--tp " + std::to_string(o.tp) + ": this machine has " + std::to_string(count) +
                           " GPU(s); one per rank is needed (or --device cpu for CPU ranks)");
  std::vector<std::unique_ptr<md::CudaBackend>> backends;
  std::vector<md::CudaBackend*> ranks;
  for (int r = 0; r < o.tp; ++r) {
    backends.push_back(std::make_unique<md::CudaBackend>(r));
    ranks.push_back(backends.back().get());
  }
  md::NcclAllReduce comm(ranks);
  using Weights = md::TensorParallelWeights<md::CudaBackend>;
  const Weights weights =
      device_random ? Weights(ranks, config,
                              [&](const md::CudaBackend& be, const md::TensorParallelShard& s) {
                                return md::random_device_weights(be, config, o.seed, s);
                              })
                    : Weights(ranks, config, host_weights);
  return run_tensor_parallel(o, weights, comm);
}
#endif

template <class Backend>
int run(Backend& be, const md::Options& o, const md::ModelConfig& config, const md::HostWeights& host_weights) {
  const md::BackendWeights<Backend> weights(be, config, host_weights);
  return run(be, o, config, weights);
}

// --device: auto takes the GPU when this build has the CUDA backend and a device is present.
bool use_gpu(md::DeviceChoice device) {
#ifdef MINIMAL_DECODER_CUDA
  if (device == md::DeviceChoice::kCpu) return false;
  const bool present = md::cuda_device_present();
  if (device == md::DeviceChoice::kGpu && !present) throw md::DecoderError("--device gpu: no CUDA device is present");
  return present;
#else
  if (device == md::DeviceChoice::kGpu)
    throw md::DecoderError("--device gpu: this build has no CUDA backend (configure with -DKVSIFT_ENABLE_CUDA=ON)");
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const md::Options o = md::parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (o.help) {
      std::fputs(o.help_text.c_str(), stdout);
      return 0;
    }
    md::Checkpoint ck;
    if (!o.model_dir.empty()) {
      ck = md::load_checkpoint(o.model_dir);
    } else {
      ck.config = md::named_model_config(o.random_shape);
    }
    const bool gpu = use_gpu(o.device);
    // Random weights too large to generate on the host (llama3-8b) are generated on the GPU.
    const bool device_random = gpu && o.model_dir.empty() && ck.config.parameter_count() > 2'000'000'000LL;
    if (!gpu && ck.config.parameter_count() > 2'000'000'000LL)
      throw md::DecoderError("model " + ck.config.name + " (" + std::to_string(ck.config.parameter_count() / 1'000'000) +
                             "M parameters) is too large for the CPU reference path; run it on a GPU");
    if (o.model_dir.empty() && !device_random) ck.weights = md::random_weights(ck.config, o.seed);
    const md::ModelConfig& c = ck.config;
    std::printf("model: %s, %d layers, hidden %d, heads %d/%d (q/kv), head_dim %d, vocab %d, %.1fM parameters%s\n",
                o.model_dir.empty() ? ("random " + o.random_shape + " (seed " + std::to_string(o.seed) + ")").c_str()
                                    : o.model_dir.c_str(),
                c.num_layers, c.hidden_size, c.num_q_heads, c.num_kv_heads, c.head_dim, c.vocab_size,
                double(c.parameter_count()) / 1e6, c.qk_norm ? ", q/k norm" : "");
#ifdef MINIMAL_DECODER_CUDA
#ifdef MINIMAL_DECODER_NCCL
    // Without NCCL, parse_options refused --tp on a GPU.
    if (gpu && o.tensor_parallel) return run_tensor_parallel_gpu(o, c, ck.weights, device_random);
#endif
    if (gpu) {
      md::CudaBackend be;
      std::printf("backend: %s\n", be.name());
      std::fflush(stdout);  // before the tools' progress lines on stderr
      if (device_random) return run(be, o, c, md::random_device_weights(be, c, o.seed));
      return run(be, o, c, ck.weights);
    }
#endif
    (void)device_random;
    if (o.tensor_parallel) return run_tensor_parallel_cpu(o, c, ck.weights);
    md::HostBackend be;
    std::printf("backend: %s\n", be.name());
    std::fflush(stdout);
    return run(be, o, c, ck.weights);
  } catch (const md::DecoderError& e) {
    std::fprintf(stderr, "minimal_decoder: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "minimal_decoder: error: out of memory\n");
    return 1;
  }
}
