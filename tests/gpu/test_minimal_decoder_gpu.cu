// examples/minimal_decoder on the CUDA backend against the CPU backend, on the same weights and the
// same tokens (teacher-forced: both decoders are fed the CPU's greedy tokens, so a near-tie can never
// send them down different continuations).
//
// What differs between the two paths is bf16 rounding: the GPU rounds every GEMM input, the KV cache,
// and (in kvsift's tensor-core attention) Q and the softmax weights, where the CPU keeps float and
// the host reference accumulates attention in double. The weights are bf16 on both sides (rounded
// by the test, or stored as bf16 in the checkpoint), so the weights add no difference of their own.
// Emulating the GEMM-input and KV rounding on the host gives a logit error of about 0.5% of the
// largest logit on these models; the bound below is 2%. The last case runs --profile (every part of a
// decode step timed alone) with and without graph replay.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

// Before the engine: this test calls the decoder's members itself, so their kvsift calls must find
// the CUDA launchers here too (engine/cuda/cuda_engine.hpp).
#include <kvsift/kvsift.cuh>

#include "engine/checkpoint.hpp"
#include "engine/cuda/cuda_engine.hpp"
#include "engine/cuda/cuda_gemv.cuh"
#include "engine/cuda/cuda_gemv_pipelined.cuh"
#include "engine/host_engine.hpp"
#include "support/decoder_test_helpers.hpp"
#include "support/synthetic_prefill_check.hpp"
#include "support/tool_scale.hpp"

namespace md = minimal_decoder;
namespace fs = std::filesystem;

namespace {

constexpr double kRelTolerance = 2e-2;  // max |gpu - cpu| over max |cpu|, per logit vector

float round_bf16(float x) { return kvsift::detail::bf16_bits_to_float(kvsift::detail::float_to_bf16_bits(x)); }

void round_bf16(std::vector<float>& v) {
  for (float& x : v) x = round_bf16(x);
}

// What the GPU backend stores: every matrix rounded to bf16 (norms stay float on both backends).
void round_matrices_bf16(md::HostWeights& w) {
  round_bf16(w.embed);
  round_bf16(w.lm_head);
  for (auto& l : w.layers)
    for (auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) round_bf16(*m);
}

md::ModelConfig small_config() {
  md::ModelConfig c;
  c.name = "gpu-test";
  c.vocab_size = 96;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 10000.f;
  c.max_positions = 1024;
  return c;
}

using decoder_test::random_prompts;

// Logits of the prefill and of every decode step ([step][batch * vocab]). With `tokens` empty the
// decoder feeds itself its greedy tokens and records them there; otherwise it is fed `tokens`.
template <class Backend>
std::vector<std::vector<float>> run_logits(Backend& be, const md::ModelConfig& c, const md::HostWeights& host_weights,
                                           const md::PolicyOptions& policy,
                                           const std::vector<std::vector<std::int32_t>>& prompts, int steps,
                                           int prefill_chunk, std::vector<std::vector<std::int32_t>>& tokens,
                                           bool graph_steps = false, md::KvLayout layout = md::KvLayout::kContiguous,
                                           bool time_attention = true, md::KvDtype kv_dtype = md::KvDtype::kNative) {
  const md::BackendWeights<Backend> weights(be, c, host_weights);
  md::DecoderLimits lim;
  lim.max_batch = int(prompts.size());
  for (const auto& p : prompts) lim.max_prompt_len = std::max(lim.max_prompt_len, int(p.size()));
  lim.max_new_tokens = steps + 1;
  lim.prefill_chunk = prefill_chunk;
  lim.kv_layout = layout;
  lim.page_size = 16;
  lim.kv_dtype = kv_dtype;
  md::Decoder<Backend> decoder(be, c, weights, policy, lim);
  decoder.set_attention_timing(time_attention && !graph_steps);
  decoder.set_graph_steps(graph_steps);
  std::vector<std::vector<float>> out{decoder.prefill(prompts)};
  const bool record = tokens.empty();
  for (int s = 0; s < steps; ++s) {
    if (record) {
      std::vector<std::int32_t> next;
      for (std::size_t b = 0; b < prompts.size(); ++b)
        next.push_back(md::argmax(out.back().data() + b * std::size_t(c.vocab_size), c.vocab_size));
      tokens.push_back(next);
    }
    out.push_back(decoder.decode(tokens[std::size_t(s)]));
  }
  return out;
}

// Every logit vector of the GPU within kRelTolerance of the CPU's; the GPU's top-1 equals the CPU's
// wherever the CPU's top-1 leads its runner-up by more than the tolerance (closer calls may flip
// under bf16 rounding and say nothing about correctness).
void check_close(const std::vector<std::vector<float>>& cpu, const std::vector<std::vector<float>>& gpu, int vocab_size) {
  const std::size_t vocab = std::size_t(vocab_size);
  REQUIRE(cpu.size() == gpu.size());
  double worst = 0;
  int decided = 0, agree = 0;
  for (std::size_t s = 0; s < cpu.size(); ++s) {
    REQUIRE(cpu[s].size() == gpu[s].size());
    for (std::size_t b = 0; b * vocab < cpu[s].size(); ++b) {
      const float* c = cpu[s].data() + b * vocab;
      const float* g = gpu[s].data() + b * vocab;
      double max_abs = 0, max_diff = 0;
      for (std::size_t i = 0; i < vocab; ++i) {
        REQUIRE(std::isfinite(g[i]));
        max_abs = std::max(max_abs, double(std::fabs(c[i])));
        max_diff = std::max(max_diff, double(std::fabs(c[i] - g[i])));
      }
      const double rel = max_diff / std::max(max_abs, 1e-6);
      worst = std::max(worst, rel);
      INFO("step ", s, " sequence ", b, ": max |gpu - cpu| = ", max_diff, ", max |cpu| = ", max_abs);
      CHECK(rel <= kRelTolerance);
      const int top = md::argmax(c, vocab_size);
      float runner_up = -INFINITY;
      for (int i = 0; i < vocab_size; ++i)
        if (i != top) runner_up = std::max(runner_up, c[i]);
      if (c[top] - runner_up > kRelTolerance * max_abs) {
        ++decided;
        agree += md::argmax(g, vocab_size) == top;
        CHECK(md::argmax(g, vocab_size) == top);
      }
    }
  }
  MESSAGE("worst relative logit difference ", worst, "; top-1 agreement ", agree, "/", decided, " clear calls");
  CHECK(decided > 0);
}

// ---- a tiny checkpoint, written here: config.json + one safetensors file ----

void put_tensor(nlohmann::json& header, std::string& data, const std::string& name, const std::string& dtype,
                std::vector<std::int64_t> shape, std::vector<float>& values) {
  const std::size_t begin = data.size();
  for (float& x : values) {
    if (dtype == "BF16") {
      const std::uint16_t b = kvsift::detail::float_to_bf16_bits(x);
      data.append(reinterpret_cast<const char*>(&b), 2);
      x = kvsift::detail::bf16_bits_to_float(b);  // the test's copy holds what the file holds
    } else {
      data.append(reinterpret_cast<const char*>(&x), 4);
    }
  }
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
}

// A Qwen3-style checkpoint (q/k norm, head_dim 128): matrices bf16, norms f32 and not all ones.
fs::path write_checkpoint(const md::ModelConfig& c, std::uint64_t seed) {
  const fs::path dir = fs::temp_directory_path() /
                       ("kvsift_md_gpu_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  md::HostWeights w = md::random_weights(c, seed);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::normal_distribution<float> near_one(1.f, 0.1f);
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  put_tensor(header, data, "model.embed_tokens.weight", "BF16", {V, H}, w.embed);
  for (float& x : w.final_norm) x = near_one(rng);
  put_tensor(header, data, "model.norm.weight", "F32", {H}, w.final_norm);
  put_tensor(header, data, "lm_head.weight", "BF16", {V, H}, w.lm_head);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& lw = w.layers[std::size_t(l)];
    for (auto* norm : {&lw.attn_norm, &lw.mlp_norm, &lw.q_norm, &lw.k_norm})
      for (float& x : *norm) x = near_one(rng);
    put_tensor(header, data, p + "input_layernorm.weight", "F32", {H}, lw.attn_norm);
    put_tensor(header, data, p + "self_attn.q_proj.weight", "BF16", {c.q_dim(), H}, lw.wq);
    put_tensor(header, data, p + "self_attn.k_proj.weight", "BF16", {c.kv_dim(), H}, lw.wk);
    put_tensor(header, data, p + "self_attn.v_proj.weight", "BF16", {c.kv_dim(), H}, lw.wv);
    put_tensor(header, data, p + "self_attn.o_proj.weight", "BF16", {H, c.q_dim()}, lw.wo);
    put_tensor(header, data, p + "self_attn.q_norm.weight", "F32", {D}, lw.q_norm);
    put_tensor(header, data, p + "self_attn.k_norm.weight", "F32", {D}, lw.k_norm);
    put_tensor(header, data, p + "post_attention_layernorm.weight", "F32", {H}, lw.mlp_norm);
    put_tensor(header, data, p + "mlp.gate_proj.weight", "BF16", {I, H}, lw.w_gate);
    put_tensor(header, data, p + "mlp.up_proj.weight", "BF16", {I, H}, lw.w_up);
    put_tensor(header, data, p + "mlp.down_proj.weight", "BF16", {H, I}, lw.w_down);
  }
  const std::string text = header.dump();
  const std::uint64_t n = text.size();
  std::ofstream st(dir / "model.safetensors", std::ios::binary);
  st.write(reinterpret_cast<const char*>(&n), 8);
  st << text << data;
  const nlohmann::json config = {{"model_type", "qwen3"},
                                 {"vocab_size", c.vocab_size},
                                 {"hidden_size", c.hidden_size},
                                 {"intermediate_size", c.intermediate_size},
                                 {"num_hidden_layers", c.num_layers},
                                 {"num_attention_heads", c.num_q_heads},
                                 {"num_key_value_heads", c.num_kv_heads},
                                 {"head_dim", c.head_dim},
                                 {"rms_norm_eps", c.rms_norm_eps},
                                 {"rope_theta", c.rope_theta},
                                 {"max_position_embeddings", c.max_positions},
                                 {"tie_word_embeddings", false},
                                 {"hidden_act", "silu"}};
  std::ofstream(dir / "config.json") << config.dump(1);
  return dir;
}

}  // namespace

TEST_CASE("minimal decoder: GPU logits follow the CPU's on a random model (ragged batch, chunked prefill, decode)") {
  const md::ModelConfig c = small_config();
  md::HostWeights w = md::random_weights(c, 11);
  round_matrices_bf16(w);
  const auto prompts = random_prompts({70, 41, 5}, c.vocab_size, 3);  // 5 chunks of 16; one prompt in the first only
  md::HostBackend cpu;
  md::CudaBackend gpu;
  std::vector<std::vector<std::int32_t>> tokens;
  const auto ref = run_logits(cpu, c, w, md::PolicyOptions(), prompts, 8, 16, tokens);
  const auto got = run_logits(gpu, c, w, md::PolicyOptions(), prompts, 8, 16, tokens);
  check_close(ref, got, c.vocab_size);
}

TEST_CASE("minimal decoder: a checkpoint written by the test (Qwen3 q/k norm, head_dim 128) agrees on CPU and GPU") {
  md::ModelConfig shape = small_config();
  shape.head_dim = 128;
  shape.num_q_heads = 2;
  shape.num_kv_heads = 1;
  shape.qk_norm = true;
  shape.rope_theta = 1e6f;
  const fs::path dir = write_checkpoint(shape, 5);
  const md::Checkpoint ck = md::load_checkpoint(dir.string());
  CHECK(ck.config.qk_norm);
  const auto prompts = random_prompts({33, 60}, ck.config.vocab_size, 9);
  md::HostBackend cpu;
  md::CudaBackend gpu;
  std::vector<std::vector<std::int32_t>> tokens;
  const auto ref = run_logits(cpu, ck.config, ck.weights, md::PolicyOptions(), prompts, 6, 32, tokens);
  const auto got = run_logits(gpu, ck.config, ck.weights, md::PolicyOptions(), prompts, 6, 32, tokens);
  check_close(ref, got, ck.config.vocab_size);
  fs::remove_all(dir);
}

TEST_CASE("minimal decoder: every policy on the GPU follows the same policy on the CPU (budgets above the context; native and fp8 caches)") {
  const md::ModelConfig c = small_config();
  md::HostWeights w = md::random_weights(c, 23);
  round_matrices_bf16(w);
  const auto prompts = random_prompts({45, 30}, c.vocab_size, 4);
  md::HostBackend cpu;
  md::CudaBackend gpu;
  // An fp8 cache holds the same codes on both (kvsift::store_kv writes the host's bytes), so only the
  // arithmetic after the store differs; dense on a native cache is the first test case's.
  const std::pair<md::KvDtype, md::KvLayout> caches[] = {{md::KvDtype::kNative, md::KvLayout::kContiguous},
                                                         {md::KvDtype::kFp8, md::KvLayout::kContiguous},
                                                         {md::KvDtype::kFp8, md::KvLayout::kPaged}};
  for (const auto& cache : caches)
    for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn, md::PolicyKind::kSnapKV,
                                md::PolicyKind::kStreamingLLM, md::PolicyKind::kLycheeDecode}) {
      if (kind == md::PolicyKind::kDense && cache.first == md::KvDtype::kNative) continue;
      // Budgets > 45 + 7: compression keeps every token; LycheeDecode's steps 2 and 5 re-run densely.
      const md::PolicyOptions p = decoder_test::test_policy(kind, 100, 100, 4, 8, 3);
      INFO("policy ", p.describe(), ", ", std::string(md::kv_dtype_name(cache.first)), ", ",
           std::string(md::kv_layout_name(cache.second)));
      std::vector<std::vector<std::int32_t>> tokens;
      const auto ref = run_logits(cpu, c, w, p, prompts, 6, 16, tokens, false, cache.second, true, cache.first);
      const auto got = run_logits(gpu, c, w, p, prompts, 6, 16, tokens, false, cache.second, true, cache.first);
      check_close(ref, got, c.vocab_size);
    }
}

TEST_CASE("minimal decoder: device-random weights of a named shape decode without NaN") {
  md::ModelConfig c = small_config();
  md::CudaBackend gpu;
  const md::BackendWeights<md::CudaBackend> w = md::random_device_weights(gpu, c, 1);
  md::DecoderLimits lim;
  lim.max_batch = 2;
  lim.max_prompt_len = 40;
  lim.max_new_tokens = 3;
  md::Decoder<md::CudaBackend> decoder(gpu, c, w, md::PolicyOptions(), lim);
  std::vector<float> logits = decoder.prefill(random_prompts({40, 17}, c.vocab_size, 1));
  logits = decoder.decode({1, 2});
  for (float x : logits) REQUIRE(std::isfinite(x));
}

TEST_CASE("minimal decoder: synthetic prefill on the GPU, then decode under each policy (native and fp8 caches)") {
  const md::ModelConfig c = small_config();
  md::CudaBackend gpu;
  const md::BackendWeights<md::CudaBackend> w = md::random_device_weights(gpu, c, 2);
  for (md::KvDtype dtype : {md::KvDtype::kNative, md::KvDtype::kFp8}) decoder_test::check_synthetic_prefill(gpu, c, w, dtype);
}

// MINIMAL_DECODER_HANDOFF_CLUSTERS=0 (CudaBackend::set_handoff_clusters): the handoff's top-k over rows
// of 20K positions takes the register select in a thread-block cluster by default and a one-CTA plan
// without; top-k is exact, so the tables, and with them the logits, are the same bits.
TEST_CASE("minimal decoder: LycheeDecode's handoff planned without thread-block clusters gives the same logits") {
  md::ModelConfig c = small_config();
  c.max_positions = 32768;
  md::CudaBackend gpu;
  const md::BackendWeights<md::CudaBackend> w = md::random_device_weights(gpu, c, 3);
  // Layer 0 retrieval, layer 1 sparse (the default roles): layer 1 reads layer 0's handoff.
  const md::PolicyOptions p = decoder_test::test_policy(md::PolicyKind::kLycheeDecode, 0, 1024, 16, 64);
  md::DecoderLimits lim;
  lim.max_batch = 2;
  lim.max_prompt_len = 20000;
  lim.max_new_tokens = 4;
  std::vector<std::vector<float>> logits[2];
  for (int clusters = 0; clusters < 2; ++clusters) {
    gpu.set_handoff_clusters(clusters == 1);
    md::Decoder<md::CudaBackend> decoder(gpu, c, w, p, lim);
    decoder.set_attention_timing(false);  // the handoff runs on the side stream, through side_exec()
    decoder.set_graph_steps(true);
    decoder.synthetic_prefill({20000, 17000}, 5);
    for (int s = 0; s < 3; ++s) logits[clusters].push_back(decoder.decode({std::int32_t(s), std::int32_t(s + 1)}));
  }
  gpu.set_handoff_clusters(true);
  for (std::size_t s = 0; s < logits[0].size(); ++s) {
    INFO("step ", s);
    for (float x : logits[0][s]) REQUIRE(std::isfinite(x));
    CHECK(logits[0][s] == logits[1][s]);
  }
}

namespace {

// y[i, r] = sum_c W[r, c] bf16(x[i, c]) in double, and the sum of the terms' magnitudes (the error scale).
void host_gemv(const std::vector<float>& w, const std::vector<float>& x, int n, int rows, int cols, std::vector<double>& ref,
               std::vector<double>& mag) {
  ref.assign(std::size_t(n) * rows, 0.0);
  mag.assign(ref.size(), 0.0);
  for (int i = 0; i < n; ++i)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const double term = double(w[std::size_t(r) * cols + c]) * round_bf16(x[std::size_t(i) * cols + c]);
        ref[std::size_t(i) * rows + r] += term;
        mag[std::size_t(i) * rows + r] += std::fabs(term);
      }
}


// The backend's GEMV and launch settings the tests go through: the default first, then the norms
// in launches of their own and plain launches, for each GEMV kernel, and the pipelined GEMV's tiles
// claimed everywhere and in fixed shares everywhere (the default claims them beside the side stream), and
// its balanced grid (fewer blocks, the same rounds of tiles each) with either.
// The scalar GEMVs (pipelined, blocked) sum in one order, the tensor-core GEMV in another: results are
// equal bit for bit within a summation family (whichever block takes a tile), and close to the host's
// product in both.
struct LaunchConfig {
  md::CudaBackend::GemvKernel gemv;
  bool pdl;
  bool fuse_norms;
  const char* name;
  md::CudaBackend::TileSchedule tiles = md::CudaBackend::TileSchedule::kBeside;
  bool balanced_grid = false;
};
const LaunchConfig kLaunchConfigs[] = {
    {md::CudaBackend::GemvKernel::kByShape, true, true, "GEMV by shape, PDL, norms fused"},
    {md::CudaBackend::GemvKernel::kByShape, true, false, "GEMV by shape, PDL, norms apart"},
    {md::CudaBackend::GemvKernel::kByShape, false, true, "GEMV by shape, plain launches"},
    {md::CudaBackend::GemvKernel::kPipelined, true, true, "pipelined GEMV, PDL, norms fused"},
    {md::CudaBackend::GemvKernel::kPipelined, true, false, "pipelined GEMV, PDL, norms apart"},
    {md::CudaBackend::GemvKernel::kPipelined, false, true, "pipelined GEMV, plain launches"},
    {md::CudaBackend::GemvKernel::kBlocked, true, true, "blocked GEMV, PDL"},
    {md::CudaBackend::GemvKernel::kBlocked, false, true, "blocked GEMV, plain launches"},
    {md::CudaBackend::GemvKernel::kTensorCore, true, true, "mma GEMV, PDL, norms fused"},
    {md::CudaBackend::GemvKernel::kTensorCore, true, false, "mma GEMV, PDL, norms apart"},
    {md::CudaBackend::GemvKernel::kTensorCore, false, true, "mma GEMV, plain launches"},
    {md::CudaBackend::GemvKernel::kPipelined, true, true, "pipelined GEMV, PDL, norms fused, tiles claimed",
     md::CudaBackend::TileSchedule::kAlways},
    {md::CudaBackend::GemvKernel::kPipelined, false, true, "pipelined GEMV, plain launches, tiles claimed",
     md::CudaBackend::TileSchedule::kAlways},
    {md::CudaBackend::GemvKernel::kByShape, true, true, "GEMV by shape, PDL, norms fused, fixed tile shares",
     md::CudaBackend::TileSchedule::kNever},
    {md::CudaBackend::GemvKernel::kPipelined, true, true, "pipelined GEMV, PDL, norms fused, balanced grid",
     md::CudaBackend::TileSchedule::kNever, true},
    {md::CudaBackend::GemvKernel::kPipelined, true, true, "pipelined GEMV, PDL, norms fused, balanced grid, tiles claimed",
     md::CudaBackend::TileSchedule::kAlways, true}};
// Under a sanitizer (tests/support/tool_scale.hpp) each configuration with PDL, replayed from the graph
// only: the plain references run the kernels without PDL, and a graph replays the same kernels a
// direct launch runs (a tool checks each kernel's accesses, not the bits' agreement). And every such
// configuration under LycheeDecode only, the default one under the other policies: the GEMV kernels do
// not depend on the policy, and LycheeDecode runs all of them (its side stream is where the "beside"
// schedule claims tiles) besides its own. Nor the configurations that run the same kernels as another
// at `rows` decode rows: norms apart where no norm is fused (above kGemvNormMaxRows rows), a balanced
// grid (the same kernel on fewer blocks). Run whole, the three sequence counts' cases did not finish in
// 150 s each under racecheck alone on an H100 (thirty-second session), nor reduced to the PDL
// configurations (thirty-third: ~7-11 s a decode run, 24 runs a case).
bool checked_under_tool(const LaunchConfig& lc, bool graph, md::PolicyKind kind, int rows) {
  if (!lc.fuse_norms && rows > md::kernels::kGemvNormMaxRows) return false;
  if (lc.balanced_grid) return false;
  return lc.pdl && graph && (kind == md::PolicyKind::kLycheeDecode || &lc == &kLaunchConfigs[0]);
}
// The reference configuration of each summation family: plain launches, no graph. A decoder run by
// shape mixes the families (prefill chunks and decode steps of different row counts), so it is its own.
constexpr int kPlainByShape = 2;
constexpr int kPlainBlocked = 7;  // the scalar GEMVs' (the behaviour before PDL and the fused norm)
constexpr int kPlainMma = 10;
// Whether a configuration's projections of n input rows of `cols` sum in the tensor-core order.
bool tensor_core(const LaunchConfig& lc, int n, int cols) {
  return md::CudaBackend::gemv_kernel_for(lc.gemv, n, cols) == md::CudaBackend::GemvKernel::kTensorCore;
}
// The launch settings under test; shape routing off, so every decode projection runs on the GEMV
// under test (with it on, the large matrices from 3 input rows go to cuBLAS: the decoder-level cases
// run that default against the CPU).
void apply(md::CudaBackend& gpu, const LaunchConfig& lc) {
  gpu.set_gemv_kernel(lc.gemv);
  gpu.set_programmatic_launch(lc.pdl);
  gpu.set_shape_routing(false);
  gpu.set_norm_fusion(lc.fuse_norms);
  gpu.set_tile_schedule(lc.tiles);
  gpu.set_balanced_grid(lc.balanced_grid);
}

}  // namespace

// Both GEMVs, with and without PDL, against the host and against each other (the pipelined kernel
// keeps the blocked one's summation order: equal bits). {5000, 4096}: several tiles per persistent
// block (the pipeline crossing tiles, the cached inputs reused); {600, 14336}: inputs too large to
// cache from 6 rows on (the L2 path).
namespace {

// The decode GEMV (plain and SwiGLU-fused) on weight matrices of the given (rows, cols) against a host
// bf16 x bf16 product, for 1..kGemvMaxRows input rows and every launch configuration.
void check_gemv_shapes(const std::vector<std::pair<int, int>>& shapes, unsigned seed) {
  md::CudaBackend gpu;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const auto& shape : shapes) {
    const int rows = shape.first, cols = shape.second;
    std::vector<float> w(std::size_t(rows) * cols);
    for (float& x : w) x = round_bf16(normal(rng));
    const md::CudaBackend::Matrix m = gpu.make_matrix(w, rows, cols);
    for (int n = 1; n <= md::kernels::kGemvMaxRows; ++n) {
      INFO("rows ", rows, ", cols ", cols, ", n ", n);
      std::vector<float> x(std::size_t(n) * cols), up(x.size());
      for (float& v : x) v = normal(rng);
      for (float& v : up) v = normal(rng);
      auto dx = gpu.alloc<float>(x.size());
      auto dup = gpu.alloc<float>(up.size());
      auto dy = gpu.alloc<float>(std::size_t(n) * rows);
      gpu.upload(dup.data(), up.data(), up.size());
      const std::vector<float> poison(dy.size(), NAN);
      std::vector<double> ref, mag;
      host_gemv(w, x, n, rows, cols, ref, mag);
      std::vector<float> first_plain[2], first_fused[2];  // per summation family (scalar, tensor core)
      for (const LaunchConfig& lc : kLaunchConfigs) {
        // Under a sanitizer each GEMV kernel (and grid) once, launched with PDL: the norm setting does not
        // reach these launches, "by shape" runs one of the others, and a plain launch runs the same kernel
        // code (its dependency wait a no-op). Run whole, the projection-sized case did not finish in 150 s
        // under racecheck alone on an H100 (thirty-second session).
        if (kvsift_test::under_tool() &&
            (!lc.fuse_norms || !lc.pdl || lc.gemv == md::CudaBackend::GemvKernel::kByShape))
          continue;
        INFO(std::string(lc.name));
        const int family = tensor_core(lc, n, cols) ? 1 : 0;
        apply(gpu, lc);
        gpu.upload(dx.data(), x.data(), x.size());
        gpu.upload(dy.data(), poison.data(), poison.size());
        gpu.linear(dx.data(), n, m, dy.data());
        std::vector<float> y(dy.size());
        gpu.download(y.data(), dy.data(), y.size());
        for (std::size_t j = 0; j < y.size(); ++j) {
          REQUIRE(std::isfinite(y[j]));
          CHECK(std::fabs(y[j] - ref[j]) <= 1e-5 * mag[j] + 1e-6);
        }
        // The SwiGLU-fused GEMV computes silu(x) * up with kernels::silu_mul's expression: it must equal
        // silu_mul followed by the plain GEMV checked above, bit for bit.
        gpu.upload(dy.data(), poison.data(), poison.size());
        gpu.silu_mul_linear(dx.data(), dup.data(), n, m, dy.data());
        std::vector<float> fused(dy.size());
        gpu.download(fused.data(), dy.data(), fused.size());
        const std::vector<float> plain = y;
        // silu_mul works in place: start again from x, so SwiGLU is applied once whichever path the
        // fused call took.
        gpu.upload(dx.data(), x.data(), x.size());
        gpu.silu_mul(dx.data(), dup.data(), std::int64_t(x.size()));
        gpu.linear(dx.data(), n, m, dy.data());
        gpu.download(y.data(), dy.data(), y.size());
        CHECK(fused == y);
        if (first_plain[family].empty()) {
          first_plain[family] = plain;
          first_fused[family] = fused;
        }
        CHECK(plain == first_plain[family]);  // every kernel of a family and launch mode: the same bits
        CHECK(fused == first_fused[family]);
      }
    }
  }
  apply(gpu, kLaunchConfigs[0]);
}

}  // namespace

// Split by size so that each case fits one compute-sanitizer racecheck run (docs/testing.md).
TEST_CASE("minimal decoder: the decode GEMV (plain and SwiGLU-fused) equals a host bf16 x bf16 product, for 1..8 rows (small and odd shapes)") {
  check_gemv_shapes({{13, 40}, {64, 4096}, {7, 8}, {1030, 392}}, 17);
}

TEST_CASE("minimal decoder: the decode GEMV (plain and SwiGLU-fused) equals a host bf16 x bf16 product, for 1..8 rows (projection-sized shapes)") {
  check_gemv_shapes({{5000, 4096}, {600, 14336}}, 18);
}

// The norm fused into the GEMV's prologue against the norm kernel followed by the GEMV: the residual
// sum and the projections bit for bit, with and without the residual input, a fused q/k/v-like launch
// of three targets (several tiles per persistent block) and a lone target. The norm is fused up to
// kGemvNormMaxRows rows (cuda_gemv_pipelined.cuh); the other row counts check the unfused path's
// residual and finiteness.
TEST_CASE("minimal decoder: the RMSNorm fused into the GEMV equals the norm kernel then the GEMV, bit for bit") {
  md::CudaBackend gpu;
  gpu.set_shape_routing(false);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.f, 1.f);
  // 1024 and 4096 columns: the staged norm (rows kept in a ring slot, kNormStageFloats); 4104: the
  // norm's pass over two segments, the first tile reading its inputs from L2.
  for (const int dim : {1024, 4096, 4104}) {
    INFO("dim ", dim);
    std::vector<md::CudaBackend::Matrix> mats;
    for (int rows : {1024, 256, 264, 40}) {
      std::vector<float> w(std::size_t(rows) * dim);
      for (float& v : w) v = normal(rng);
      mats.push_back(gpu.make_matrix(w, rows, dim));
    }
    std::vector<float> nw(dim);
    for (float& v : nw) v = 1.f + 0.1f * normal(rng);
    auto d_nw = gpu.alloc<float>(nw.size());
    gpu.upload(d_nw.data(), nw.data(), nw.size());
    for (const auto kernel : {md::CudaBackend::GemvKernel::kPipelined, md::CudaBackend::GemvKernel::kTensorCore,
                              md::CudaBackend::GemvKernel::kByShape})
      for (int n = 1; n <= md::kernels::kGemvMaxRows; ++n)
        for (bool with_delta : {true, false}) {
          INFO(md::CudaBackend::gemv_kernel_name(kernel), " GEMV, n ", n, (with_delta ? ", x + delta" : ", x alone"));
          gpu.set_gemv_kernel(kernel);
          std::vector<float> x(std::size_t(n) * dim), delta(x.size());
          for (float& v : x) v = 3.f * normal(rng);
          for (float& v : delta) v = normal(rng);
          auto dx = gpu.alloc<float>(x.size()), ddelta = gpu.alloc<float>(x.size()), dxo = gpu.alloc<float>(x.size());
          gpu.upload(dx.data(), x.data(), x.size());
          std::vector<md::CudaBackend::Buffer<float>> ys;
          for (std::size_t m = 0; m < mats.size(); ++m) ys.push_back(gpu.alloc<float>(std::size_t(n) * mats[m].rows));
          std::vector<std::vector<float>> first(mats.size() + 1);
          for (bool fused : {true, false}) {
            INFO("norm ", (fused ? "fused" : "apart"));
            gpu.set_norm_fusion(fused);
            gpu.upload(ddelta.data(), delta.data(), delta.size());  // the unfused path writes its normed rows there
            const std::vector<float> poison(x.size(), NAN);
            gpu.upload(dxo.data(), poison.data(), poison.size());
            for (std::size_t m = 0; m < mats.size(); ++m) {
              const std::vector<float> py(ys[m].size(), NAN);
              gpu.upload(ys[m].data(), py.data(), py.size());
            }
            const float* dd = with_delta ? ddelta.data() : nullptr;
            gpu.norm_linear_shared_input(dx.data(), dd, dxo.data(), n, dim, d_nw.data(), 1e-5f, ddelta.data(),
                                         {{&mats[0], ys[0].data()}, {&mats[1], ys[1].data()}, {&mats[2], ys[2].data()}});
            std::vector<float> xo(x.size());
            gpu.download(xo.data(), dxo.data(), xo.size());
            for (std::size_t e = 0; e < x.size(); ++e) REQUIRE(xo[e] == (with_delta ? x[e] + delta[e] : x[e]));
            for (std::size_t m = 0; m < 3; ++m) {
              std::vector<float> y(ys[m].size());
              gpu.download(y.data(), ys[m].data(), y.size());
              for (float v : y) REQUIRE(std::isfinite(v));
              if (first[m].empty()) first[m] = y;
              else CHECK(y == first[m]);
            }
          }
          // A lone target (one launch of one matrix), fused against apart.
          std::vector<float> lone[2];
          for (int fused = 0; fused < 2; ++fused) {
            gpu.set_norm_fusion(fused == 1);
            gpu.upload(ddelta.data(), delta.data(), delta.size());
            gpu.norm_linear_shared_input(dx.data(), with_delta ? ddelta.data() : nullptr, dxo.data(), n, dim, d_nw.data(), 1e-5f,
                                         ddelta.data(), {{&mats[3], ys[3].data()}});
            lone[fused].resize(ys[3].size());
            gpu.download(lone[fused].data(), ys[3].data(), lone[fused].size());
          }
          CHECK(lone[0] == lone[1]);
        }
  }
  gpu.set_norm_fusion(true);
}

// The SwiGLU pairs (cuda_gemv_pipelined.cuh: gate/up computing silu(gate) * up in its epilogue and writing
// it in bf16, down reading it) against the same MLP in float (gate and up written, the SwiGLU in down's
// input loads): the residual sum and the MLP's output bit for bit, 1-8 rows under every launch setting
// whose gate/up has pairs (the pipelined GEMV up to kGemvSwiGLUPairsMaxRows rows, the tensor-core one;
// the norm fused at one row and apart beyond, PDL, claimed tiles, a balanced grid), and with the
// decoder's aliasing (the norm's delta, its normed rows and the output one buffer); elsewhere the float
// path serves, checked the same way. Shapes: llama-like (several pair tiles per persistent block, down's
// input at two chunks a thread), and small ones (fewer tiles than blocks).
TEST_CASE("minimal decoder: the SwiGLU pairs (gate/up writing silu(gate) * up in bf16, down reading it) equal the float MLP, bit for bit") {
  md::CudaBackend gpu;
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.f, 1.f);
  const auto matrix = [&](int rows, int cols) {
    std::vector<float> w(std::size_t(rows) * cols);
    for (float& v : w) v = round_bf16(normal(rng));
    return gpu.make_matrix(w, rows, cols);
  };
  for (const auto& shape : {std::pair<int, int>{1024, 2816}, {40, 24}, {64, 8}}) {
    const int dim = shape.first, inter = shape.second;
    const md::CudaBackend::Matrix wg = matrix(inter, dim), wu = matrix(inter, dim), wd = matrix(dim, inter);
    std::vector<float> nw(static_cast<std::size_t>(dim));
    for (float& v : nw) v = 1.f + 0.1f * normal(rng);
    auto d_nw = gpu.alloc<float>(nw.size());
    gpu.upload(d_nw.data(), nw.data(), nw.size());
    for (int n = 1; n <= md::kernels::kGemvMaxRows; ++n) {
      std::vector<float> x(std::size_t(n) * dim), delta(x.size());
      for (float& v : x) v = 3.f * normal(rng);
      for (float& v : delta) v = normal(rng);
      auto dx = gpu.alloc<float>(x.size()), dh = gpu.alloc<float>(x.size()), dxo = gpu.alloc<float>(x.size());
      auto dgate = gpu.alloc<float>(std::size_t(n) * inter), dup = gpu.alloc<float>(std::size_t(n) * inter);
      gpu.upload(dx.data(), x.data(), x.size());
      for (const LaunchConfig& lc : kLaunchConfigs) {
        using Kernel = md::CudaBackend::GemvKernel;
        const Kernel pairs_kernel = md::CudaBackend::gemv_kernel_for(lc.gemv, n, dim);
        const bool expected = (pairs_kernel == Kernel::kTensorCore || (pairs_kernel == Kernel::kPipelined && n <= md::kernels::kGemvSwiGLUPairsMaxRows)) &&
                              md::CudaBackend::gemv_kernel_for(lc.gemv, n, inter) == Kernel::kPipelined && n <= md::kernels::kGemvBf16InputMaxRows;
        if (kvsift_test::under_tool() && (!lc.pdl || !expected)) continue;  // a plain launch runs the same kernels
        INFO("dim ", dim, ", intermediate ", inter, ", n ", n, ", ", std::string(lc.name));
        apply(gpu, lc);
        std::vector<float> y[2], xo[2];
        for (int pairs = 0; pairs < 2; ++pairs) {
          gpu.set_swiglu_pairs(pairs == 1);
          CHECK(gpu.uses_swiglu_pairs(dx.data(), dh.data(), n, wg, wu, wd, dgate.data()) == (pairs == 1 && expected));
          gpu.upload(dh.data(), delta.data(), delta.size());
          const std::vector<float> poison_x(x.size(), NAN), poison_i(std::size_t(n) * inter, NAN);
          gpu.upload(dxo.data(), poison_x.data(), poison_x.size());
          gpu.upload(dgate.data(), poison_i.data(), poison_i.size());
          gpu.upload(dup.data(), poison_i.data(), poison_i.size());
          gpu.norm_swiglu_mlp(dx.data(), dh.data(), dxo.data(), n, dim, d_nw.data(), 1e-5f, dh.data(), wg, wu, wd, dgate.data(),
                              dup.data(), dh.data());
          y[pairs].resize(x.size());
          xo[pairs].resize(x.size());
          gpu.download(y[pairs].data(), dh.data(), x.size());
          gpu.download(xo[pairs].data(), dxo.data(), x.size());
          for (std::size_t e = 0; e < x.size(); ++e) {
            REQUIRE(std::isfinite(y[pairs][e]));
            REQUIRE(xo[pairs][e] == x[e] + delta[e]);
          }
        }
        CHECK(y[1] == y[0]);
      }
    }
  }
  gpu.set_swiglu_pairs(true);
  apply(gpu, kLaunchConfigs[0]);
}

namespace {

// Decode steps of `batch` sequences under each policy given, replayed from a CUDA graph and on a paged
// cache, against launched steps, bit for bit. 3 sequences take the scalar GEMV by shape, 5 the
// tensor-core one, 10 cuBLAS; LycheeDecode's corrections (every 3 steps) replay a graph of their own.
// The references time the attention (decode_layer on one stream); the replays do not, so their
// LycheeDecode handoffs run on the backend's side stream (forked and joined inside the graph).
void check_graph_and_paged_steps(int batch, std::initializer_list<md::PolicyKind> kinds) {
  const md::ModelConfig c = small_config();
  md::HostWeights w = md::random_weights(c, 31);
  md::CudaBackend gpu;
  for (md::PolicyKind kind : kinds) {
    const md::PolicyOptions p = decoder_test::test_policy(kind, 24, 16, 2, 4, 3);
    INFO("batch ", batch, ", policy ", p.describe());
    std::vector<int> lengths;
    for (int b = 0; b < batch; ++b) lengths.push_back(30 + 7 * b);
    const auto prompts = random_prompts(lengths, c.vocab_size, unsigned(batch));
    std::vector<std::vector<std::int32_t>> tokens;
    // The references: each summation family's plain launches, no graph (for the scalar GEMVs the
    // behaviour before PDL). Every launch configuration, launched and replayed, must give its
    // family's logits bit for bit. Under a tool the other policies check the default configuration
    // only (by shape), so they need its reference only.
    const bool every_family = !kvsift_test::under_tool() || kind == md::PolicyKind::kLycheeDecode;
    std::vector<std::vector<float>> launched, launched_mma;
    if (every_family) {
      apply(gpu, kLaunchConfigs[kPlainBlocked]);
      launched = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, false);
      apply(gpu, kLaunchConfigs[kPlainMma]);
      launched_mma = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, false);
    }
    apply(gpu, kLaunchConfigs[kPlainByShape]);
    const std::vector<std::vector<float>> launched_by_shape = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, false);
    const auto reference_of = [&](const LaunchConfig& lc) -> const std::vector<std::vector<float>>* {
      if (lc.gemv == md::CudaBackend::GemvKernel::kByShape) return &launched_by_shape;
      return lc.gemv == md::CudaBackend::GemvKernel::kTensorCore ? &launched_mma : &launched;
    };
    for (const LaunchConfig& lc : kLaunchConfigs)
      for (bool graph : {false, true}) {
        if (kvsift_test::under_tool() && !checked_under_tool(lc, graph, kind, batch)) continue;
        INFO(std::string(lc.name), std::string(graph ? ", graph replay" : ", direct launches"));
        apply(gpu, lc);
        const auto& reference = *reference_of(lc);
        const auto replayed = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, graph);
        REQUIRE(reference.size() == replayed.size());
        for (std::size_t s = 0; s < reference.size(); ++s) {
          INFO("step ", s);
          CHECK(reference[s] == replayed[s]);
        }
      }
    apply(gpu, kLaunchConfigs[0]);
    const auto& reference = *reference_of(kLaunchConfigs[0]);
    // Launched steps without the attention timing: LycheeDecode's handoffs on the side stream, no graph.
    // (The other policies have no handoff: under a tool their run would repeat the reference's kernels.)
    if (!kvsift_test::under_tool() || kind == md::PolicyKind::kLycheeDecode) {
      const auto side = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, false, md::KvLayout::kContiguous, false);
      REQUIRE(side.size() == reference.size());
      for (std::size_t s = 0; s < reference.size(); ++s) {
        INFO("step ", s, " (launched, side stream)");
        CHECK(side[s] == reference[s]);
      }
    }
    // The paged layout (16-token pages through a block table) reads the same K/V in the same order.
    const auto paged = run_logits(gpu, c, w, p, prompts, 7, 16, tokens, true, md::KvLayout::kPaged);
    REQUIRE(paged.size() == reference.size());
    for (std::size_t s = 0; s < reference.size(); ++s) {
      INFO("step ", s, " (paged)");
      CHECK(paged[s] == reference[s]);
    }
  }
}

}  // namespace

// One case per batch and policy group, so that each fits one compute-sanitizer racecheck run
// (docs/testing.md): LycheeDecode runs every launch configuration under a tool, the others one.
TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (3 sequences, dense and ClusterAttn)") {
  check_graph_and_paged_steps(3, {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn});
}

TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (3 sequences, LycheeDecode)") {
  check_graph_and_paged_steps(3, {md::PolicyKind::kLycheeDecode});
}

TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (5 sequences, dense and ClusterAttn)") {
  check_graph_and_paged_steps(5, {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn});
}

TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (5 sequences, LycheeDecode)") {
  check_graph_and_paged_steps(5, {md::PolicyKind::kLycheeDecode});
}

TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (10 sequences, dense and ClusterAttn)") {
  check_graph_and_paged_steps(10, {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn});
}

TEST_CASE("minimal decoder: decode steps replayed from a CUDA graph, and on a paged cache, equal launched steps bit for bit (10 sequences, LycheeDecode)") {
  check_graph_and_paged_steps(10, {md::PolicyKind::kLycheeDecode});
}

// One decoder used twice, graphs on: its second prefill (fewer sequences than its limit, prompts
// shorter than the correction interval) drops the step and correction graphs recorded for the first
// batch and restarts the correction schedule, so every step after it equals a fresh decoder's on the
// same prompts, bit for bit, corrections (every 3 steps) included.
TEST_CASE("minimal decoder: a decoder that prefills again replays the steps of a fresh one (LycheeDecode, graphs)") {
  const md::ModelConfig c = small_config();
  const md::HostWeights hw = md::random_weights(c, 37);
  md::CudaBackend gpu;
  const md::BackendWeights<md::CudaBackend> weights(gpu, c, hw);
  const md::PolicyOptions p = decoder_test::test_policy(md::PolicyKind::kLycheeDecode, 24, 16, 2, 4, 3);
  md::DecoderLimits lim;
  lim.max_batch = 3;
  lim.max_prompt_len = 50;
  lim.max_new_tokens = 12;
  lim.prefill_chunk = 16;
  md::Decoder<md::CudaBackend> reused(gpu, c, weights, p, lim), fresh(gpu, c, weights, p, lim);
  for (md::Decoder<md::CudaBackend>* d : {&reused, &fresh}) {
    d->set_attention_timing(false);
    d->set_graph_steps(true);
  }
  std::vector<float> logits = reused.prefill(random_prompts({50, 41, 33}, c.vocab_size, 5));
  for (int step = 0; step < 5; ++step) {  // one correction (step 2): its graph recorded for 3 sequences
    std::vector<std::int32_t> next;
    for (int b = 0; b < 3; ++b) next.push_back(md::argmax(logits.data() + b * c.vocab_size, c.vocab_size));
    logits = reused.decode(next);
  }
  const std::vector<std::vector<std::int32_t>> second = {{4, 9}, {11}};
  CHECK(reused.prefill(second) == fresh.prefill(second));
  std::vector<std::int32_t> next = {2, 3};
  for (int step = 0; step < 8; ++step) {  // corrections at steps 2 and 5: recorded, then replayed
    CAPTURE(step);
    const std::vector<float> a = reused.decode(next), b = fresh.decode(next);
    REQUIRE(a.size() == b.size());
    for (float x : a) REQUIRE(std::isfinite(x));
    CHECK(a == b);
    next = {md::argmax(a.data(), c.vocab_size), md::argmax(a.data() + c.vocab_size, c.vocab_size)};
  }
}

// The roofline's default bandwidth (--roofline-tbps unset): the measured ceilings where they are known,
// else 92% of the peak the device attributes give, which must then lie between a PCIe card's and an HBM3e one's.
TEST_CASE("minimal decoder: the GPU's roofline bandwidth is its streaming-read ceiling") {
  md::CudaBackend gpu;
  const double tbps = gpu.streaming_read_tbps();
  const std::string name = gpu.name();
  INFO(name, ": ", tbps, " TB/s");
  if (name.find("H200") != std::string::npos) CHECK(tbps == 4.45);
  else if (name.find("H100 80GB HBM3") != std::string::npos) CHECK(tbps == 3.08);
  else CHECK((tbps > 0.1 && tbps < 10));
}

TEST_CASE("minimal decoder: --profile on the GPU times every part of a decode step (graph replay and direct launches)") {
  const md::ModelConfig c = small_config();
  md::CudaBackend gpu;
  const md::BackendWeights<md::CudaBackend> w = md::random_device_weights(gpu, c, 3);
  for (bool graph : {true, false})
    for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kLycheeDecode}) {
      md::GenerationRequest req;
      req.prompts = random_prompts({700, 400}, c.vocab_size, 5);
      req.synthetic_prefill = true;
      req.new_tokens = 2;
      req.graph_steps = graph;
      req.policy = decoder_test::test_policy(kind, 64, 64, 4, 8);
      const md::StepProfile p = md::profile_step(gpu, c, w, req, 15);
      INFO("policy ", p.policy, ", graph ", graph);
      CHECK(p.graph == graph);
      CHECK(std::string(p.clock) == "CUDA events");
      CHECK(p.lengths == std::vector<int>{701, 401});
      REQUIRE(p.parts.size() == 5);
      const char* names[] = {"weights", "attention", "selection", "rest", "step"};
      double shares = 0;
      for (std::size_t i = 0; i < 5; ++i) {
        CHECK(p.parts[i].name == names[i]);
        if (p.parts[i].timed) CHECK(p.parts[i].us > 0);
        if (i < 4) shares += p.parts[i].share;
      }
      CHECK(shares == doctest::Approx(1.0).epsilon(1e-9));
      const double step = p.part("step").us;
      // Alone the parts cost about what they cost together: none may exceed the step by far, and the
      // derived ones (selection, rest) may dip below 0 only by the medians' noise. That holds on a GPU
      // the process has to itself; a sanitizer sweep runs several tools' processes side by side, whose
      // time slices land in some parts' medians and not others' (s35: weights + attention 1.6x the
      // step, rest -0.66x), so under a tool only the profile's structure is checked.
      if (!kvsift_test::under_tool()) {
        CHECK(p.part("weights").us + p.part("attention").us <= 1.5 * step);
        CHECK(p.part("rest").us >= -0.25 * step);
        CHECK(p.part("selection").us >= -0.25 * step);
      }
      if (kind == md::PolicyKind::kDense) CHECK(p.part("selection").us == 0.0);
      CHECK(p.part("step").bytes == p.part("weights").bytes + p.part("attention").bytes);
    }
}
