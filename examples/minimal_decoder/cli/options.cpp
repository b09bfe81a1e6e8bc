// The command line (options.hpp) with CLI11: one add_option per flag, grouped as --help shows them;
// the checks that involve several flags follow the parse.

#include "cli/options.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <CLI/CLI.hpp>

#include "engine/errors.hpp"
#include "tools/prompt_files.hpp"

namespace minimal_decoder {
namespace {

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// An integer >= lo (and <= INT32_MAX); the message names the value: "--cp: -3 is not an integer >= 1".
CLI::Validator at_least(long lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        char* end = nullptr;
        const long x = std::strtol(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || x < lo || x > INT32_MAX) return s + " is not an integer >= " + std::to_string(lo);
        return "";
      },
      "");
}

// A number in [lo, hi]: "--top-p: 2 is not a number in [1e-06, 1]".
CLI::Validator in_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !(x >= lo && x <= hi))
          return s + " is not a number in [" + number(lo) + ", " + number(hi) + "]";
        return "";
      },
      "");
}

// Everything CLI11 parses; what needs converting or cross-checking is finished in parse_options.
struct Parsed {
  std::vector<std::string> prompt_ids, eval_clusterattn;
  std::string kv_layout = "contiguous", kv_dtype = "native", device = "auto", pool = "max", policy = "dense";
  bool no_attention_timing = false, no_graph = false;
  std::string eval_passkey, calibrate, probe, train;
};

void add_options(CLI::App& app, Options& o, Parsed& p) {
  GenerationRequest& gen = o.generation;
  auto& cfg = gen.policy.compression;
  auto& ly = gen.policy.lycheedecode;
  auto& pk = o.passkey;
  const char* g = "weights";
  app.add_option("--model", o.model_dir, "Hugging Face Llama/Qwen3 checkpoint: config.json + *.safetensors (bf16/fp16/fp32, sharded ok)")
      ->group(g);
  app.add_option("--random", o.random_shape, "random weights of a named shape: tiny (CPU demo) or llama3-8b")
      ->check(CLI::IsMember({"tiny", "llama3-8b"}))->group(g);
  app.add_option("--seed", o.seed, "seed of the random weights and random prompts")->capture_default_str()->group(g);

  g = "prompts (token ids; one prompt per sequence of the batch, lengths may differ)";
  app.add_option("--prompt-ids", p.prompt_ids, "one prompt, e.g. \"1 2 3\"; repeat the flag for a batch")
      ->expected(1)->allow_extra_args(false)->take_all()->group(g);
  app.add_option("--prompt-file", o.prompt_file, "one prompt per line: ids separated by spaces; text before a '|' is "
                 "ignored (the passkey prompt files' \"ANSWER d1..d5 | ids\" format)")->group(g);
  app.add_option("--max-prompts", o.max_prompts, "read at most N prompts from the file")->check(at_least(1))->group(g);
  app.add_option("--random-prompts", o.random_prompt_lengths, "random prompts of these lengths (a ragged batch: 500,320,64)")
      ->delimiter(',')->check(at_least(1))->group(g);

  g = "generation";
  app.add_option("--new-tokens", gen.new_tokens, "tokens to generate per sequence")
      ->check(at_least(0))->capture_default_str()->group(g);
  app.add_option("--temperature", gen.sampling.temperature, "0 = greedy; > 0 samples")
      ->check(in_range(0, 100))->capture_default_str()->group(g);
  app.add_option("--top-p", gen.sampling.top_p, "nucleus sampling mass")
      ->check(in_range(1e-6, 1))->capture_default_str()->group(g);
  app.add_option("--sample-seed", gen.sampling.seed, "seed of the sampler")->capture_default_str()->group(g);
  app.add_option("--prefill-chunk", gen.prefill_chunk, "query positions per prefill chunk")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_flag("--synthetic-prefill", gen.synthetic_prefill, "fill the KV caches with random K/V instead of running the "
               "prompts (speed benchmarks with random weights; only the prompt lengths are used)")->group(g);
  app.add_flag("--no-attention-timing", p.no_attention_timing, "do not synchronise around each attention call to "
               "measure its share (speed runs; on the GPU each decode step is then recorded into a CUDA graph once and replayed)")->group(g);
  app.add_option("--kv-layout", p.kv_layout, "contiguous: [batch, kv_heads, capacity, head_dim] per layer; paged: a "
                 "page pool and block table per layer, vLLM-style NHD pages")
      ->check(CLI::IsMember({"contiguous", "paged"}))->capture_default_str()->group(g);
  app.add_option("--kv-dtype", p.kv_dtype, "KV cache element type: native (the backend's: float on the CPU, bf16 on "
                 "the GPU; bf16 is accepted as its name) or fp8 (E4M3 with a float scale per token and KV head, "
                 "written by kvsift::store_kv; --synthetic-prefill fills it with N(0, 1) values)")
      ->check(CLI::IsMember({"native", "bf16", "fp8"}))->capture_default_str()->group(g);
  app.add_option("--page-size", gen.page_size, "tokens per page of the paged layout")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_flag("--no-graph", p.no_graph, "with --no-attention-timing: launch every kernel of every step (no CUDA graph)")
      ->group(g);
  app.add_option("--roofline-tbps", o.roofline_tbps, "memory bandwidth for the roofline line of the report, TB/s per GPU "
                 "(--tp N: N times it). Default: the GPU's streaming-read ceiling, measured for the H200 (4.45) and "
                 "the H100 80GB HBM3 (3.08), else 92% of its memory clock times bus width; on the CPU no roofline")
      ->check(in_range(1e-3, 1e3))->group(g);

  g = "policy";
  // "lychee" and the --lychee-* spellings of 0.1 are still accepted (scripts written against them run).
  app.add_option("--policy", p.policy, "the attention policy")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"lychee", "lycheedecode"}}))
      ->check(CLI::IsMember({"dense", "clusterattn", "snapkv", "streaming", "lycheedecode"}))->capture_default_str()->group(g);
  app.add_option("--cp", cfg.capacity, "prompt-compression capacity Cp, window included")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--window", cfg.window, "observation window W")->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--theta", cfg.theta, "ClusterAttn density threshold")
      ->check(in_range(0, 1e9))->capture_default_str()->group(g);
  app.add_option("--num-block", cfg.num_block, "ClusterAttn blocks")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--pool", p.pool, "SnapKV pooling")
      ->check(CLI::IsMember({"max", "avg"}))->capture_default_str()->group(g);
  app.add_option("--pool-kernel", cfg.pool.kernel, "SnapKV pooling kernel (odd)")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--sinks", cfg.sinks, "StreamingLLM sink tokens")->check(at_least(0))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-mode,--lychee-mode", ly.mode, "LycheeDecode selection")
      ->check(CLI::IsMember({"token", "ratio", "block"}))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-budget,--lychee-budget", ly.budget, "tokens per index row (token mode) or blocks (block mode)")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-sink,--lychee-sink", ly.sink, "forced first tokens inside the budget")
      ->check(at_least(0))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-recent,--lychee-recent", ly.recent, "forced last tokens inside the budget")
      ->check(at_least(0))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-rho,--lychee-rho", ly.rho, "ratio mode's dropped fraction")
      ->check(in_range(0, 0.999999))->capture_default_str()->group(g);
  app.add_option("--lycheedecode-block-size,--lychee-block-size", ly.block_size, "block mode's block")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--roles", ly.roles_file, "head roles (kvsift-head-roles file); default: layer 0 retrieval, all else sparse")
      ->group(g);
  app.add_option("--correction-interval", ly.correction_interval, "LycheeDecode cache correction every N steps (0 = off)")
      ->check(at_least(0))->capture_default_str()->group(g);

  g = "output";
  app.add_flag("--check", gen.check, "run dense alongside the policy: per-step top-1 agreement and KL(dense || policy)")
      ->group(g);
  app.add_flag("--compare", o.compare, "run every policy with --check on the same prompts; print a table")->group(g);
  app.add_option("--output-ids", o.output_ids, "write the generated ids, one line per sequence (written only on success)")
      ->group(g);
  app.add_option("--device", p.device, "backend (auto: the GPU when this build has CUDA and a device is present)")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}))->capture_default_str()->group(g);
  app.add_option("--tp", o.tp, "tensor parallelism over N ranks (Megatron-style: heads and MLP columns split, two "
                 "all-reduces per layer, vocabulary-parallel LM head), one thread per rank: GPUs 0 .. N-1 over NCCL, or "
                 "CPU ranks with --device cpu; --random llama3-8b: each GPU generates its own shard. --tp 1 runs the "
                 "tensor-parallel path with one rank (without --tp: the unsharded decoder)")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_flag("--quiet", o.quiet, "no progress bar, no per-sequence output")->group(g);
  app.add_flag("--profile", o.profile, "after the prefill, time the parts of the next decode step alone (weights, "
               "attention, LycheeDecode's selection, the rest, the whole step; each the median of --profile-reps "
               "repetitions) and print where the step's time goes, instead of generating (--new-tokens does not apply)")->group(g);
  app.add_option("--profile-reps", o.profile_reps, "--profile: repetitions per part")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_flag("--soak", gen.soak, "a long-run check of the generation: every logits vector scanned for NaN / inf, the "
               "device memory in use compared after --soak-warmup steps and at the end, tokens/s per tenth of the run; "
               "exit status 1 on a NaN / inf or a memory change")->group(g);
  app.add_flag("--soak-bad-request", o.soak_bad_request, "--soak: add a malformed prompt (a token id outside the "
               "vocabulary) in the middle of the batch; it must be rejected on its own while the other sequences run "
               "(exit status 1 otherwise)")->group(g);
  app.add_option("--soak-warmup", gen.soak_warmup, "--soak: decode steps before the first memory reading (every CUDA "
                 "graph recorded by then; at least the correction interval under LycheeDecode)")->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--json", o.json, "also write as JSON: --profile's table, or --eval-passkey's results (every "
                 "prompt's output)")->group(g);

  g = "passkey fidelity (issue 9; checkpoints like passkey-llama-13m, docs/fidelity.md); each replaces the prompts";
  app.add_option("--eval-passkey", p.eval_passkey, "the README protocol on \"ANSWER d1..d5 | ids\" prompts for every policy "
                 "(options above), LycheeDecode with layer-0-only roles and with --roles; accuracy per length")->group(g);
  app.add_option("--calibrate-clusterattn", p.calibrate, "kvsift::calibrate_num_block (decode queries of dense decoding) for "
                 "every --thetas value over --num-blocks, mean cosine per length; also the accuracy of each")->group(g);
  app.add_option("--probe-roles", p.probe, "CPU probe for retrieval KV heads: attention on the passkey digits from the "
                 "decode queries, per (layer, KV head); writes --roles-out (layer 0 + the top --probe-heads)")->group(g);
  app.add_option("--train-roles", p.train, "HardKuma head-role training for LycheeDecode's token mode (--lycheedecode-budget/"
                 "-sink/-recent): layer-local distillation at the answer's decode steps; writes --roles-out")->group(g);
  app.add_option("--lengths", pk.lengths, "prompt lengths to use")
      ->delimiter(',')->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--limit", pk.limit, "prompts per length (default: all)")->check(at_least(1))->group(g);
  app.add_option("--eval-batch", pk.batch, "prompts per batch, one shared dense prefill each")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--eval-clusterattn", p.eval_clusterattn, "THETA:NUM_BLOCK,..: evaluate ClusterAttn once per setting "
                 "(default: --theta, --num-block)")->delimiter(',')->group(g);
  app.add_option("--thetas", pk.thetas, "calibration sweep")
      ->delimiter(',')->check(in_range(0, 1e9))->capture_default_str()->group(g);
  app.add_option("--num-blocks", pk.num_blocks, "calibration candidates")
      ->delimiter(',')->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--roles-out", pk.roles_out, "the roles file --probe-roles and --train-roles write")->group(g);
  app.add_option("--probe-heads", pk.probe_heads, "--probe-roles: retrieval heads beyond layer 0")
      ->check(at_least(0))->capture_default_str()->group(g);
  app.add_option("--train-steps", pk.train_steps, "--train-roles: optimisation steps")
      ->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--train-heads", pk.train_heads, "--train-roles: retrieval KV heads wanted beyond layer 0, density target "
                 "K / gates")->check(at_least(1))->capture_default_str()->group(g);
  app.add_option("--train-seed", pk.train_seed, "--train-roles: seed of the gate draws and of the prompt order")
      ->capture_default_str()->group(g);
  app.add_option("--train-norm", pk.train_norm, "--train-roles: the relative loss's denominator, all layers' dense output "
                 "norm (model) or the head's own layer's (layer); tools/gate_training.hpp")
      ->check(CLI::IsMember({"model", "layer"}))->capture_default_str()->group(g);
}

// "0.1:16" -> (0.1, 16)
std::pair<float, int> theta_num_block(const std::string& word) {
  char* end = nullptr;
  const double theta = std::strtod(word.c_str(), &end);
  const long nb = *end == ':' ? std::strtol(end + 1, &end, 10) : 0;
  if (*end != '\0' || !(theta >= 0) || nb < 1 || nb > INT32_MAX)
    throw DecoderError("--eval-clusterattn: \"" + word + "\" is not THETA:NUM_BLOCK");
  return {float(theta), int(nb)};
}

// The passkey tool chosen, if any: at most one of the four flags.
void choose_passkey_tool(const Parsed& p, PasskeyToolOptions* pk) {
  const std::pair<PasskeyTool, const std::string*> tools[] = {
      {PasskeyTool::kEval, &p.eval_passkey}, {PasskeyTool::kCalibrate, &p.calibrate},
      {PasskeyTool::kProbe, &p.probe}, {PasskeyTool::kTrain, &p.train}};
  for (const auto& [tool, file] : tools) {
    if (file->empty()) continue;
    if (pk->tool != PasskeyTool::kNone)
      throw DecoderError("give one of --eval-passkey, --calibrate-clusterattn, --probe-roles and --train-roles");
    pk->tool = tool;
    pk->prompt_file = *file;
  }
}

// What no single flag can check.
void check_combinations(const Options& o) {
  if (o.model_dir.empty() == o.random_shape.empty()) throw DecoderError("give exactly one of --model DIR and --random SHAPE");
  const int sources = int(!o.prompts.empty()) + int(!o.prompt_file.empty()) + int(!o.random_prompt_lengths.empty());
  if (o.passkey_tool()) {
    const PasskeyToolOptions& pk = o.passkey;
    if (o.tensor_parallel) throw DecoderError("--tp " + std::to_string(o.tp) + ": the passkey tools run one rank; drop --tp");
    if (o.profile) throw DecoderError("--profile times a decode step of the prompts given; drop the passkey tool");
    if (sources != 0 || o.compare || o.generation.check)
      throw DecoderError("the passkey tools read their own prompt file; drop the prompt source, --check and --compare");
    if (o.model_dir.empty()) throw DecoderError("the passkey tools need a trained checkpoint (--model DIR)");
    if (pk.tool == PasskeyTool::kProbe && pk.roles_out.empty()) throw DecoderError("--probe-roles needs --roles-out FILE");
    if (pk.tool == PasskeyTool::kTrain) {
      const LycheeDecodeOptions& ly = o.generation.policy.lycheedecode;
      if (pk.roles_out.empty()) throw DecoderError("--train-roles needs --roles-out FILE");
      if (ly.mode != "token") throw DecoderError("--train-roles trains roles for LycheeDecode's token mode: drop --lycheedecode-mode " + ly.mode);
      if (ly.budget < ly.sink + ly.recent)
        throw DecoderError("--lycheedecode-budget " + std::to_string(ly.budget) + " is below --lycheedecode-sink + --lycheedecode-recent = " +
                           std::to_string(ly.sink + ly.recent) + " (the forced tokens count inside the budget)");
    }
    return;
  }
  if (sources != 1) throw DecoderError("give exactly one prompt source: --prompt-ids, --prompt-file or --random-prompts");
  if (o.compare && o.generation.policy.kind != PolicyKind::kDense) throw DecoderError("--compare runs every policy; drop --policy");
  if (o.profile && (o.compare || o.generation.check))
    throw DecoderError("--profile times one policy's decode step: drop --compare and --check");
  if (o.generation.soak && (o.profile || o.compare))
    throw DecoderError("--soak checks a generation run: drop --profile and --compare");
  if (o.soak_bad_request && !o.generation.soak) throw DecoderError("--soak-bad-request is part of --soak: add --soak");
  if (o.generation.synthetic_prefill && (o.generation.check || o.compare))
    throw DecoderError("--synthetic-prefill fills the caches with noise: --check/--compare have nothing to compare");
  if (o.tensor_parallel && (o.profile || o.compare))
    throw DecoderError("--tp " + std::to_string(o.tp) + " generates; --profile and --compare run one rank: drop them or --tp");
#ifndef MINIMAL_DECODER_NCCL
  if (o.tensor_parallel && o.device != DeviceChoice::kCpu)
    throw DecoderError("--tp " + std::to_string(o.tp) + " on GPUs needs NCCL, which this build did not find: add --device cpu "
                       "for CPU ranks, or install NCCL and configure again");
#endif
}

}  // namespace

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  Parsed p;
  CLI::App app("minimal_decoder: a Llama-style decoder whose attention runs through kvsift, dense or under a KV policy.\n"
               "Give the weights (--model DIR or --random SHAPE) and one prompt source, or one passkey tool.",
               "minimal_decoder");
  add_options(app, o, p);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes the vector from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    o.help = true;
    o.help_text = app.help();
    return o;
  } catch (const CLI::ExtrasError& e) {
    throw DecoderError(std::string(e.what()) + " (see --help)");
  } catch (const CLI::ParseError& e) {
    throw DecoderError(e.what());
  }
  for (const std::string& ids : p.prompt_ids) o.prompts.push_back(parse_ids(ids, "--prompt-ids"));
  o.generation.time_attention = !p.no_attention_timing;
  o.generation.graph_steps = !p.no_graph;
  o.generation.kv_layout = p.kv_layout == "paged" ? KvLayout::kPaged : KvLayout::kContiguous;
  o.generation.kv_dtype = p.kv_dtype == "fp8" ? KvDtype::kFp8 : KvDtype::kNative;
  o.device = p.device == "cpu" ? DeviceChoice::kCpu : p.device == "gpu" ? DeviceChoice::kGpu : DeviceChoice::kAuto;
  o.tensor_parallel = app.count("--tp") > 0;
  o.generation.policy.kind = parse_policy(p.policy);
  o.generation.policy.compression.pool.kind = p.pool == "avg" ? kvsift::PoolKind::kAvg : kvsift::PoolKind::kMax;
  for (const std::string& word : p.eval_clusterattn) o.passkey.eval_clusterattn.push_back(theta_num_block(word));
  choose_passkey_tool(p, &o.passkey);
  check_combinations(o);
  // The tools run with the generation options' policy, chunking, verbosity and model.
  o.passkey.policy = o.generation.policy;
  o.passkey.prefill_chunk = o.generation.prefill_chunk;
  o.passkey.kv_dtype = o.generation.kv_dtype;
  o.passkey.verbose = !o.quiet;
  o.passkey.model_dir = o.model_dir;
  o.passkey.json = o.json;
  return o;
}

}  // namespace minimal_decoder
