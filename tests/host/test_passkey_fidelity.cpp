// Passkey fidelity on a trained checkpoint (issue 9), CPU backend: the README protocol of
// passkey-llama-13m (dense prefill including QUERY, d1 from the prefill, four greedy decode steps
// under the policy; correct when all five digits match) through examples/minimal_decoder, on a few
// prompts of prompts_shared.txt:
//   dense                                        every prompt correct
//   ClusterAttn W = 8, Cp = 128, calibrated θ/num_block   every prompt correct
//   LycheeDecode budget 128 (sink 8, recent 16), trained roles   every prompt correct
//   LycheeDecode, layer-0-only roles             reported (the reference gives 0.000)
//
// The checkpoint comes from KVSIFT_TEST_MODEL_DIR: the CMake cache variable (passed as argv[1]) or
// else the environment variable. Without one the test exits 77, which ctest reports as skipped.
// .ci/run points it at ../shared/models/passkey-llama-13m when that directory exists; the roles file
// (examples/minimal_decoder/roles/passkey-llama-13m.roles, from HardKuma training: --train-roles on
// prompts_train.txt, docs/fidelity.md) belongs to that checkpoint.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/host_engine.hpp"
#include "tools/passkey_eval.hpp"

namespace md = minimal_decoder;
namespace fs = std::filesystem;

namespace {

std::string g_model_dir;

// The settings docs/fidelity.md reports (chosen on prompts_train.txt, never on the shared prompts).
constexpr int kCp = 128, kWindow = 8;
constexpr float kTheta = 0.5f;
constexpr int kNumBlock = 128;
constexpr int kLycheeBudget = 128, kLycheeSink = 8, kLycheeRecent = 16;
const char* const kRolesFile = KVSIFT_SOURCE_DIR "/examples/minimal_decoder/roles/passkey-llama-13m.roles";

// Prompts per length: a few, so the test stays within a couple of minutes on 2 CPU cores.
struct LengthPlan {
  int length, prompts;
};
constexpr LengthPlan kPlan[] = {{1024, 3}, {2048, 2}};

struct Fixture {
  md::Checkpoint ck;
  md::HostBackend be;
  std::unique_ptr<md::BackendWeights<md::HostBackend>> weights;
  std::vector<md::PasskeyCase> cases;
  Fixture() {
    ck = md::load_checkpoint(g_model_dir);
    weights = std::make_unique<md::BackendWeights<md::HostBackend>>(be, ck.config, ck.weights);
    cases = md::read_passkey_file(g_model_dir + "/prompts_shared.txt");
  }
};

md::PolicyOptions base_policy() {
  md::PolicyOptions p;
  p.compression.capacity = kCp;
  p.compression.window = kWindow;
  p.compression.theta = kTheta;
  p.compression.num_block = kNumBlock;
  p.lycheedecode.budget = kLycheeBudget;
  p.lycheedecode.sink = kLycheeSink;
  p.lycheedecode.recent = kLycheeRecent;
  return p;
}

md::EvalPolicy make(md::PolicyKind kind, const std::string& roles = "") {
  md::PolicyOptions p = base_policy();
  p.kind = kind;
  p.lycheedecode.roles_file = roles;
  return {p.describe(), p};
}

}  // namespace

TEST_CASE("passkey fidelity on the CPU: dense, ClusterAttn (calibrated), LycheeDecode (trained roles) answer every prompt") {
  Fixture f;
  const bool roles_fit = f.ck.config.num_layers == 8 && f.ck.config.num_kv_heads == 2 && fs::exists(kRolesFile);
  std::vector<md::EvalPolicy> policies = {make(md::PolicyKind::kDense), make(md::PolicyKind::kClusterAttn),
                                          make(md::PolicyKind::kLycheeDecode)};
  if (roles_fit) {
    policies.push_back(make(md::PolicyKind::kLycheeDecode, kRolesFile));
    // Issue 9 wants roles learned by HardKuma training (--train-roles writes this header), not the probe's.
    std::ifstream roles(kRolesFile);
    std::string header;
    std::getline(roles, header);
    CHECK_MESSAGE(header.rfind("# From HardKuma head-role training", 0) == 0, kRolesFile, " does not come from --train-roles");
  } else {
    MESSAGE("no roles for this checkpoint's shape: LycheeDecode with learned roles is not checked");
  }

  for (const LengthPlan& plan : kPlan) {
    const std::vector<md::PasskeyCase> cases = md::passkey_cases_of_length(f.cases, plan.length, plan.prompts);
    REQUIRE_MESSAGE(!cases.empty(), "no prompts of ", plan.length, " tokens in prompts_shared.txt");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<md::PasskeyOutcome> r =
        md::evaluate_passkey_batch(f.be, f.ck.config, *f.weights, cases, policies, 256);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t p = 0; p < policies.size(); ++p)
      MESSAGE("L=", plan.length, " ", policies[p].label, ": ", r[p].correct, "/", r[p].total, " (", s, " s for the batch)");
    CAPTURE(plan.length);
    CHECK(r[0].correct == r[0].total);  // dense
    CHECK(r[1].correct == r[1].total);  // ClusterAttn
    // Layer 0 alone cannot find the passkey for the sparse heads (the reference gives 0.000): reported.
    if (r[2].correct > 0) WARN_MESSAGE(false, "LycheeDecode with layer-0-only roles answered ", r[2].correct, " prompt(s)");
    if (roles_fit) CHECK(r[3].correct == r[3].total);  // LycheeDecode with the trained roles
  }
}

int main(int argc, char** argv) {
  // argv[1]: the CMake cache variable KVSIFT_TEST_MODEL_DIR (may be empty); else the environment.
  std::vector<char*> rest = {argv[0]};
  if (argc > 1 && std::string(argv[1]).rfind("-", 0) != 0) {
    g_model_dir = argv[1];
    for (int i = 2; i < argc; ++i) rest.push_back(argv[i]);
  } else {
    for (int i = 1; i < argc; ++i) rest.push_back(argv[i]);
  }
  if (g_model_dir.empty())
    if (const char* env = std::getenv("KVSIFT_TEST_MODEL_DIR")) g_model_dir = env;
  if (g_model_dir.empty()) {
    std::printf("SKIPPED: KVSIFT_TEST_MODEL_DIR is not set (CMake cache variable or environment variable): point it "
                "at a passkey checkpoint such as passkey-llama-13m to run the fidelity tests\n");
    return 77;
  }
  if (!fs::exists(g_model_dir + "/config.json") || !fs::exists(g_model_dir + "/prompts_shared.txt")) {
    std::printf("KVSIFT_TEST_MODEL_DIR = %s holds no config.json and prompts_shared.txt\n", g_model_dir.c_str());
    return 1;  // a wrong setting is an error, not a skip
  }
  std::printf("passkey checkpoint: %s\n", g_model_dir.c_str());
  doctest::Context context(int(rest.size()), rest.data());
  return context.run();
}
