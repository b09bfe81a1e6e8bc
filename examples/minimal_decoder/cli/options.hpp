#pragma once
// The minimal decoder's command line, parsed with CLI11 into one struct. Every mistake is a
// DecoderError whose message names the flag (CLI11's own wording for types, ranges and choices),
// raised before anything is loaded or allocated. `--help` prints the grouped option list.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/generate.hpp"
#include "tools/passkey_tool_options.hpp"

namespace minimal_decoder {

enum class DeviceChoice { kAuto, kCpu, kGpu };

struct Options {
  // weights
  std::string model_dir;
  std::string random_shape;
  std::uint64_t seed = 1;
  // prompts: exactly one source
  std::vector<std::vector<std::int32_t>> prompts;
  std::string prompt_file;
  int max_prompts = 0;
  std::vector<int> random_prompt_lengths;
  // generation: everything but the prompts, which come from the source above
  GenerationRequest generation;
  double roofline_tbps = 0;  // 0: the backend's (streaming_read_tbps; none on the CPU)
  // output
  bool compare = false;
  bool profile = false;  // --profile: time the parts of one decode step instead of generating
  // --soak-bad-request: a malformed prompt (a token id outside the vocabulary) joins the middle of the
  // batch; it must be rejected alone (GenerationRequest::reject_bad_prompts) while the others run.
  bool soak_bad_request = false;
  int profile_reps = 20;
  std::string json;      // --json: --eval-passkey's results or --profile's table as JSON
  std::string output_ids;
  DeviceChoice device = DeviceChoice::kAuto;
  // --tp N: tensor parallelism over N ranks (engine/tensor_parallel_decoder.hpp), one thread per
  // rank: GPUs 0 .. N-1 (NCCL), or CPU ranks with --device cpu. tensor_parallel: --tp was given (--tp
  // 1 included: one rank through the tensor-parallel path, the unsharded decoder's numbers, for
  // measuring the path itself); without it the unsharded decoder runs.
  int tp = 1;
  bool tensor_parallel = false;
  bool quiet = false;
  bool help = false;
  std::string help_text;  // what --help prints
  // The passkey tools; tool == kNone for generation. The policy, prefill chunk and model are copied
  // in from the options above (the flags are shared).
  PasskeyToolOptions passkey;
  bool passkey_tool() const { return passkey.tool != PasskeyTool::kNone; }
};

// args without the program name.
Options parse_options(const std::vector<std::string>& args);

}  // namespace minimal_decoder
