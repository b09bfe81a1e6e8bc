#pragma once
// What the passkey tools (passkey_tools.hpp) are asked to do. The command line fills this in
// (cli/options.cpp); a test or another program can as well: the tools know nothing of the CLI.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_cache.hpp"
#include "engine/policy.hpp"

namespace minimal_decoder {

enum class PasskeyTool {
  kNone,
  kEval,       // --eval-passkey: per-length accuracy of every policy (passkey_eval.hpp)
  kCalibrate,  // --calibrate-clusterattn: theta x num_block with kvsift::calibrate_num_block (calibration.hpp)
  kProbe,      // --probe-roles: a CPU probe for LycheeDecode retrieval heads (role_probe.hpp)
  kTrain,      // --train-roles: head roles from HardKuma gate training (role_training.hpp)
};

struct PasskeyToolOptions {
  PasskeyTool tool = PasskeyTool::kNone;
  std::string prompt_file;  // the tool's "ANSWER d1..d5 | ids" prompts
  std::vector<int> lengths = {1024, 2048};
  int limit = 0;   // prompts per length (0: all)
  int batch = 16;  // prompts per batch, one shared dense prefill each
  std::string json;  // --eval-passkey: also write the results as JSON
  std::vector<std::pair<float, int>> eval_clusterattn;  // (theta, num_block) settings of --eval-passkey
  std::vector<float> thetas = {0.02f, 0.05f, 0.1f, 0.2f};  // calibration sweep
  std::vector<int> num_blocks = {16, 32, 64, 128, 256};    // calibration candidates
  std::string roles_out;  // the roles file --probe-roles and --train-roles write
  int probe_heads = 1;
  int train_steps = 3000, train_heads = 2;
  std::uint64_t train_seed = 1;
  std::string train_norm = "model";  // model | layer (gate_training.hpp)
  // Shared with generation: the policy settings, the prefill chunk, progress lines, the model's name.
  PolicyOptions policy;
  int prefill_chunk = 256;
  KvDtype kv_dtype = KvDtype::kNative;  // --eval-passkey's caches (the other tools read native caches)
  bool verbose = true;
  std::string model_dir;
};

}  // namespace minimal_decoder
