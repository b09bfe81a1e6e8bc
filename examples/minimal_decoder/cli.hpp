#pragma once
// Command-line options of the minimal decoder, parsed into one struct. Every mistake is a
// DecoderError naming the flag, raised before anything is loaded or allocated.

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "decode_policy.hpp"
#include "errors.hpp"
#include "kv_cache.hpp"
#include "sampling.hpp"

namespace minimal_decoder {

inline const char* kUsage = R"(usage: minimal_decoder (--model DIR | --random tiny|llama3-8b) PROMPTS [options]

weights
  --model DIR            Hugging Face Llama/Qwen3 checkpoint: config.json + *.safetensors (bf16/fp16/fp32, sharded ok)
  --random SHAPE         random weights of a named shape: tiny (CPU demo) or llama3-8b
  --seed N               seed of the random weights and random prompts (default 1)
prompts (token ids; one prompt per sequence of the batch, lengths may differ)
  --prompt-ids "1 2 3"   one prompt; repeat the flag for a batch
  --prompt-file FILE     one prompt per line: ids separated by spaces; text before a '|' is ignored
                         (the passkey prompt files' "ANSWER d1..d5 | ids" format)
  --max-prompts N        read at most N prompts from the file
  --random-prompts L,..  random prompts of these lengths (a ragged batch: 500,320,64)
generation
  --new-tokens N         tokens to generate per sequence (default 16)
  --temperature T        0 = greedy (default); > 0 samples
  --top-p P              nucleus sampling mass (default 1)
  --sample-seed N        seed of the sampler (default 0)
  --prefill-chunk N      query positions per prefill chunk (default 256)
  --synthetic-prefill    fill the KV caches with random K/V instead of running the prompts (speed
                         benchmarks with random weights; only the prompt lengths are used)
  --no-attention-timing  do not synchronise around each attention call to measure its share (speed runs;
                         on the GPU each decode step is then recorded into a CUDA graph once and replayed)
  --kv-layout L          contiguous (default: [batch, kv_heads, capacity, head_dim] per layer) or paged
                         (a page pool and block table per layer, vLLM-style NHD pages)
  --page-size N          tokens per page of the paged layout (default 16)
  --no-graph             with --no-attention-timing: launch every kernel of every step (no CUDA graph)
  --roofline-tbps F      memory bandwidth for the roofline line of the report, TB/s (default 4.45: the
                         H200's measured streaming-read ceiling, docs/performance.md)
policy
  --policy NAME          dense | clusterattn | snapkv | streaming | lychee (default dense)
  --cp N                 prompt-compression capacity Cp, window included (default 1024)
  --window N             observation window W (default 32)
  --theta F              ClusterAttn density threshold (default 0.002)
  --num-block N          ClusterAttn blocks (default 128)
  --pool max|avg         SnapKV pooling (default max), --pool-kernel N (odd, default 7)
  --sinks N              StreamingLLM sink tokens (default 4)
  --lychee-mode M        LycheeDecode selection: token (default) | ratio | block
  --lychee-budget N      tokens per index row (token mode) or blocks (block mode); default 4096
  --lychee-sink N, --lychee-recent N    forced first/last tokens inside the budget (default 128, 256)
  --lychee-rho F, --lychee-block-size N ratio mode's dropped fraction (0.7); block mode's block (64)
  --roles FILE           head roles (kvsift-head-roles file); default: layer 0 retrieval, all else sparse
  --correction-interval N  LycheeDecode cache correction every N steps (0 = off, the default)
output
  --check                run dense alongside the policy: per-step top-1 agreement and KL(dense || policy)
  --compare              run every policy with --check on the same prompts; print a table
  --output-ids FILE      write the generated ids, one line per sequence (written only on success)
  --device auto|cpu|gpu  backend (default auto: the GPU when this build has CUDA and a device is present)
  --quiet                no progress bar, no per-sequence output
passkey fidelity (issue 9; checkpoints like passkey-llama-13m, docs/fidelity.md). Each replaces PROMPTS.
  --eval-passkey FILE    the README protocol on "ANSWER d1..d5 | ids" prompts for every policy (options
                         above), LycheeDecode with layer-0-only roles and with --roles; accuracy per length
  --calibrate-clusterattn FILE   kvsift::calibrate_num_block (decode queries of dense decoding) for every
                         --thetas value over --num-blocks, mean cosine per length; also the accuracy of each
  --probe-roles FILE     CPU probe for retrieval KV heads: attention on the passkey digits from the decode
                         queries, per (layer, KV head); writes --roles-out (layer 0 + the top --probe-heads)
  --train-roles FILE     HardKuma head-role training for LycheeDecode's token mode (--lychee-budget/-sink/
                         -recent): layer-local distillation at the answer's decode steps; writes --roles-out
  --lengths L,..         prompt lengths to use (default 1024,2048)
  --limit N              prompts per length (default: all)
  --eval-batch N         prompts per batch, one shared dense prefill each (default 16)
  --json FILE            --eval-passkey: also write the results (every prompt's output) as JSON
  --eval-clusterattn T:N,..  evaluate ClusterAttn once per theta:num_block setting (default: --theta, --num-block)
  --thetas F,..          calibration sweep (default 0.02,0.05,0.1,0.2)
  --num-blocks N,..      calibration candidates (default 16,32,64,128,256)
  --roles-out FILE       the roles file --probe-roles and --train-roles write
  --probe-heads N        --probe-roles: retrieval heads beyond layer 0 (default 1)
  --train-steps N        --train-roles: optimisation steps (default 3000)
  --train-heads K        --train-roles: retrieval KV heads wanted beyond layer 0, density target K / gates (default 2)
  --train-seed N         --train-roles: seed of the gate draws and of the prompt order (default 1)
  --train-norm model|layer  --train-roles: the relative loss's denominator, all layers' dense output norm
                         (default) or the head's own layer's (role_training.hpp, gate_training.hpp)
)";

enum class DeviceChoice { kAuto, kCpu, kGpu };

struct Options {
  std::string model_dir;
  std::string random_shape;
  std::uint64_t seed = 1;
  std::vector<std::vector<std::int32_t>> prompts;
  std::string prompt_file;
  int max_prompts = 0;
  std::vector<int> random_prompt_lengths;
  int new_tokens = 16;
  int prefill_chunk = 256;
  bool synthetic_prefill = false;
  bool time_attention = true;
  bool graph_steps = true;
  KvLayout kv_layout = KvLayout::kContiguous;
  int page_size = 16;
  double roofline_tbps = 4.45;
  SamplingOptions sampling;
  PolicyOptions policy;
  bool check = false;
  bool compare = false;
  std::string output_ids;
  DeviceChoice device = DeviceChoice::kAuto;
  bool quiet = false;
  bool help = false;
  // passkey fidelity tools (passkey_eval.hpp, passkey_tools.hpp)
  std::string eval_passkey, calibrate_clusterattn, probe_roles, train_roles;
  std::vector<int> lengths = {1024, 2048};
  int limit = 0;
  int eval_batch = 16;
  std::string json;
  std::vector<float> thetas = {0.02f, 0.05f, 0.1f, 0.2f};
  std::vector<int> num_blocks = {16, 32, 64, 128, 256};
  std::string roles_out;
  int probe_heads = 1;
  int train_steps = 3000, train_heads = 2;
  std::uint64_t train_seed = 1;
  std::string train_norm = "model";
  std::vector<std::pair<float, int>> eval_clusterattn;  // (theta, num_block) settings of --eval-passkey
  bool passkey_tool() const {
    return !eval_passkey.empty() || !calibrate_clusterattn.empty() || !probe_roles.empty() || !train_roles.empty();
  }
};

// "12 5 7" -> {12, 5, 7}; anything that is not an integer is an error naming `what`.
inline std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<std::int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) throw DecoderError(what + ": \"" + word + "\" is not a token id");
    ids.push_back(std::int32_t(v));
  }
  if (ids.empty()) throw DecoderError(what + ": empty prompt");
  return ids;
}

inline std::vector<std::vector<std::int32_t>> read_prompt_file(const std::string& path, int max_prompts) {
  std::ifstream in(path);
  if (!in) throw DecoderError("--prompt-file " + path + ": cannot open");
  std::vector<std::vector<std::int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line) && (max_prompts <= 0 || int(prompts.size()) < max_prompts)) {
    ++line_no;
    const std::size_t bar = line.find('|');
    const std::string ids = bar == std::string::npos ? line : line.substr(bar + 1);
    if (ids.find_first_not_of(" \t\r") == std::string::npos) continue;
    prompts.push_back(parse_ids(ids, path + ":" + std::to_string(line_no)));
  }
  if (prompts.empty()) throw DecoderError("--prompt-file " + path + ": no prompts");
  return prompts;
}

inline Options parse_options(const std::vector<std::string>& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw DecoderError(flag + " needs a value");
      return args[++i];
    };
    auto integer = [&](long lo) {
      const std::string v = value();
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < lo || x > INT32_MAX)
        throw DecoderError(flag + " " + v + ": expected an integer >= " + std::to_string(lo));
      return int(x);
    };
    auto real = [&](double lo, double hi) {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(x >= lo && x <= hi))
        throw DecoderError(flag + " " + v + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return float(x);
    };
    auto& cfg = o.policy.compression;
    if (flag == "-h" || flag == "--help") o.help = true;
    else if (flag == "--model") o.model_dir = value();
    else if (flag == "--random") o.random_shape = value();
    else if (flag == "--seed") o.seed = std::uint64_t(integer(0));
    else if (flag == "--prompt-ids") o.prompts.push_back(parse_ids(value(), "--prompt-ids"));
    else if (flag == "--prompt-file") o.prompt_file = value();
    else if (flag == "--max-prompts") o.max_prompts = integer(1);
    else if (flag == "--random-prompts") {
      std::string list = value();
      for (char& ch : list) ch = ch == ',' ? ' ' : ch;
      for (std::int32_t n : parse_ids(list, "--random-prompts")) {
        if (n < 1) throw DecoderError("--random-prompts: lengths must be >= 1");
        o.random_prompt_lengths.push_back(n);
      }
    }
    else if (flag == "--new-tokens") o.new_tokens = integer(0);
    else if (flag == "--temperature") o.sampling.temperature = real(0, 100);
    else if (flag == "--top-p") o.sampling.top_p = real(1e-6, 1);
    else if (flag == "--sample-seed") o.sampling.seed = std::uint64_t(integer(0));
    else if (flag == "--prefill-chunk") o.prefill_chunk = integer(1);
    else if (flag == "--synthetic-prefill") o.synthetic_prefill = true;
    else if (flag == "--no-attention-timing") o.time_attention = false;
    else if (flag == "--no-graph") o.graph_steps = false;
    else if (flag == "--kv-layout") {
      const std::string v = value();
      if (v != "contiguous" && v != "paged") throw DecoderError("--kv-layout " + v + ": expected contiguous or paged");
      o.kv_layout = v == "paged" ? KvLayout::kPaged : KvLayout::kContiguous;
    }
    else if (flag == "--page-size") o.page_size = integer(1);
    else if (flag == "--roofline-tbps") o.roofline_tbps = real(1e-3, 1e3);
    else if (flag == "--policy") o.policy.kind = parse_policy(value());
    else if (flag == "--cp") cfg.capacity = integer(1);
    else if (flag == "--window") cfg.window = integer(1);
    else if (flag == "--theta") cfg.theta = real(0, 1e9);
    else if (flag == "--num-block") cfg.num_block = integer(1);
    else if (flag == "--sinks") cfg.sinks = integer(0);
    else if (flag == "--pool") {
      const std::string v = value();
      if (v != "max" && v != "avg") throw DecoderError("--pool " + v + ": expected max or avg");
      cfg.pool.kind = v == "max" ? kvsift::PoolKind::kMax : kvsift::PoolKind::kAvg;
    }
    else if (flag == "--pool-kernel") cfg.pool.kernel = integer(1);
    else if (flag == "--lychee-budget") o.policy.lychee.budget = integer(1);
    else if (flag == "--lychee-sink") o.policy.lychee.sink = integer(0);
    else if (flag == "--lychee-recent") o.policy.lychee.recent = integer(0);
    else if (flag == "--lychee-rho") o.policy.lychee.rho = real(0, 0.999999);
    else if (flag == "--lychee-block-size") o.policy.lychee.block_size = integer(1);
    else if (flag == "--lychee-mode") {
      o.policy.lychee.mode = value();
      if (o.policy.lychee.mode != "token" && o.policy.lychee.mode != "ratio" && o.policy.lychee.mode != "block")
        throw DecoderError("--lychee-mode " + o.policy.lychee.mode + ": expected token, ratio or block");
    }
    else if (flag == "--roles") o.policy.lychee.roles_file = value();
    else if (flag == "--correction-interval") o.policy.lychee.correction_interval = integer(0);
    else if (flag == "--check") o.check = true;
    else if (flag == "--compare") o.compare = true;
    else if (flag == "--output-ids") o.output_ids = value();
    else if (flag == "--device") {
      const std::string v = value();
      if (v == "auto") o.device = DeviceChoice::kAuto;
      else if (v == "cpu") o.device = DeviceChoice::kCpu;
      else if (v == "gpu") o.device = DeviceChoice::kGpu;
      else throw DecoderError("--device " + v + ": expected auto, cpu or gpu");
    }
    else if (flag == "--quiet") o.quiet = true;
    else if (flag == "--eval-passkey") o.eval_passkey = value();
    else if (flag == "--calibrate-clusterattn") o.calibrate_clusterattn = value();
    else if (flag == "--probe-roles") o.probe_roles = value();
    else if (flag == "--train-roles") o.train_roles = value();
    else if (flag == "--lengths" || flag == "--num-blocks") {
      std::string list = value();
      for (char& ch : list) ch = ch == ',' ? ' ' : ch;
      std::vector<int>& dst = flag == "--lengths" ? o.lengths : o.num_blocks;
      dst.clear();
      for (std::int32_t n : parse_ids(list, flag))
        if (n < 1) throw DecoderError(flag + ": values must be >= 1");
        else dst.push_back(n);
    }
    else if (flag == "--thetas") {
      std::string list = value();
      for (char& ch : list) ch = ch == ',' ? ' ' : ch;
      std::istringstream in(list);
      std::string word;
      o.thetas.clear();
      while (in >> word) {
        char* end = nullptr;
        const double x = std::strtod(word.c_str(), &end);
        if (*end != '\0' || !(x >= 0)) throw DecoderError("--thetas: \"" + word + "\" is not a number >= 0");
        o.thetas.push_back(float(x));
      }
      if (o.thetas.empty()) throw DecoderError("--thetas: empty list");
    }
    else if (flag == "--eval-clusterattn") {
      std::string list = value();
      for (char& ch : list) ch = ch == ',' ? ' ' : ch;
      std::istringstream in(list);
      std::string word;
      while (in >> word) {
        char* end = nullptr;
        const double theta = std::strtod(word.c_str(), &end);
        const long nb = *end == ':' ? std::strtol(end + 1, &end, 10) : 0;
        if (*end != '\0' || !(theta >= 0) || nb < 1 || nb > INT32_MAX)
          throw DecoderError("--eval-clusterattn: \"" + word + "\" is not THETA:NUM_BLOCK");
        o.eval_clusterattn.emplace_back(float(theta), int(nb));
      }
    }
    else if (flag == "--limit") o.limit = integer(1);
    else if (flag == "--eval-batch") o.eval_batch = integer(1);
    else if (flag == "--json") o.json = value();
    else if (flag == "--roles-out") o.roles_out = value();
    else if (flag == "--probe-heads") o.probe_heads = integer(0);
    else if (flag == "--train-steps") o.train_steps = integer(1);
    else if (flag == "--train-heads") o.train_heads = integer(1);
    else if (flag == "--train-seed") o.train_seed = std::uint64_t(integer(0));
    else if (flag == "--train-norm") {
      o.train_norm = value();
      if (o.train_norm != "model" && o.train_norm != "layer") throw DecoderError("--train-norm " + o.train_norm + ": expected model or layer");
    }
    else throw DecoderError("unknown option " + flag + " (see --help)");
  }
  if (o.help) return o;
  if (o.model_dir.empty() == o.random_shape.empty()) throw DecoderError("give exactly one of --model DIR and --random SHAPE");
  const int sources = int(!o.prompts.empty()) + int(!o.prompt_file.empty()) + int(!o.random_prompt_lengths.empty());
  if (o.passkey_tool()) {
    if (int(!o.eval_passkey.empty()) + int(!o.calibrate_clusterattn.empty()) + int(!o.probe_roles.empty()) +
            int(!o.train_roles.empty()) != 1)
      throw DecoderError("give one of --eval-passkey, --calibrate-clusterattn, --probe-roles and --train-roles");
    if (sources != 0 || o.compare || o.check) throw DecoderError("the passkey tools read their own prompt file; drop the prompt source, --check and --compare");
    if (o.model_dir.empty()) throw DecoderError("the passkey tools need a trained checkpoint (--model DIR)");
    if (!o.probe_roles.empty() && o.roles_out.empty()) throw DecoderError("--probe-roles needs --roles-out FILE");
    if (!o.train_roles.empty()) {
      const LycheeOptions& ly = o.policy.lychee;
      if (o.roles_out.empty()) throw DecoderError("--train-roles needs --roles-out FILE");
      if (ly.mode != "token") throw DecoderError("--train-roles trains roles for LycheeDecode's token mode: drop --lychee-mode " + ly.mode);
      if (ly.budget < ly.sink + ly.recent)
        throw DecoderError("--lychee-budget " + std::to_string(ly.budget) + " is below --lychee-sink + --lychee-recent = " +
                           std::to_string(ly.sink + ly.recent) + " (the forced tokens count inside the budget)");
    }
    return o;
  }
  if (sources != 1) throw DecoderError("give exactly one prompt source: --prompt-ids, --prompt-file or --random-prompts");
  if (o.compare && o.policy.kind != PolicyKind::kDense) throw DecoderError("--compare runs every policy; drop --policy");
  if (o.synthetic_prefill && (o.check || o.compare))
    throw DecoderError("--synthetic-prefill fills the caches with noise: --check/--compare have nothing to compare");
  return o;
}

}  // namespace minimal_decoder
