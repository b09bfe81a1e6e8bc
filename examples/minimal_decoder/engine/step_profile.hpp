#pragma once
// --profile: where a decode step's time goes. After the request's prefill, the step that would come
// next is set up (Decoder::begin_step_parts) and its parts are launched one at a time
// (Decoder::run_step_part: the decoder's own step code, each part from a CUDA graph of its own on
// the GPU). A part's time is the median of N repetitions on the backend's clock (CUDA events on the
// GPU, std::chrono on the CPU); the repetitions are interleaved, one of every part per round in a
// rotating order, so a change of the machine's speed during the run touches every part alike.
//
//   weights    the step with empty attention slots: embedding, norms, projections, RoPE, K/V store,
//              MLP, LM head (everything but attention and selection)
//   attention  kvsift's attention launches of every layer (LycheeDecode's with its score output)
//   selection  LycheeDecode: its layer calls (attention, then the top-k index handoff) minus their
//              attention launches; 0 for the other policies (their selection happens at prefill)
//   rest       the step minus the three parts: the gaps between them and what they cost only together
//   step       the whole step as decode runs it (graph replay on the GPU unless --no-graph)
//
// selection and rest are differences of medians, so where they are near 0 they can come out
// slightly negative; the shares (part / step) of the four parts sum to 1 by construction. The
// selection part runs each handoff after its attention; the step runs it on the side stream beside
// the next kernels (decoder.hpp), so there rest comes out near minus the selection the overlap hides.

#include <cstdint>
#include <string>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/errors.hpp"
#include "engine/generate.hpp"
#include "engine/median.hpp"
#include "engine/sampling.hpp"

namespace minimal_decoder {

struct StepProfilePart {
  std::string name;      // weights, attention, selection, rest, step
  double us = 0;         // median microseconds per step
  double share = 0;      // us / the step's us
  std::int64_t bytes = 0;  // HBM bytes the part must move at the least (Decoder::step_bytes' terms); 0: not counted
  bool timed = true;     // false: a difference of timed parts (selection, rest)
};

struct StepProfile {
  std::string policy;        // PolicyOptions::describe()
  std::vector<int> lengths;  // each sequence's cache length during the profiled step
  int repetitions = 0;
  const char* clock = "";    // the backend's kClock
  bool graph = false;        // parts replayed from CUDA graphs
  std::vector<StepProfilePart> parts;  // weights, attention, selection, rest, step: in that order

  // The part called `name`; a DecoderError if there is none.
  const StepProfilePart& part(const std::string& name) const {
    for (const StepProfilePart& p : parts)
      if (p.name == name) return p;
    throw DecoderError("step profile: no part \"" + name + "\"");
  }
};

// Rounds before the timed ones: the first records each part's graph, the second warms the caches.
constexpr int kProfileWarmupRounds = 2;

// Prefills req (real or synthetic) on a decoder of its own, then times the parts of the next
// decode step. Compiled once per backend (host_engine.cpp, cuda/cuda_engine.cu).
template <class Backend>
StepProfile profile_step(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                         const GenerationRequest& req, int repetitions) {
  if (repetitions < 1) throw DecoderError("--profile-reps: " + std::to_string(repetitions) + " is not >= 1");
  DecoderLimits limits = request_limits(req);
  // Room for the profiled step's token and no more (req.new_tokens does not apply): a prompt of
  // max_position_embeddings - 1 tokens profiles the step at the full context.
  limits.max_new_tokens = 1;
  Decoder<Backend> model(be, config, weights, req.policy, limits);
  model.set_graph_steps(req.graph_steps);
  const std::vector<float> logits = prefill_request(model, req);
  // The step's next tokens: greedy from the prefill (a token's id does not change what a step costs).
  std::vector<std::int32_t> next;
  for (int b = 0; b < model.batch(); ++b) next.push_back(argmax(logits.data() + std::int64_t(b) * config.vocab_size, config.vocab_size));
  model.begin_step_parts(next);

  using Part = typename Decoder<Backend>::StepPart;
  std::vector<Part> launched = {Part::kStep, Part::kWeights, Part::kAttention};
  if (model.step_selects()) launched.push_back(Part::kLayerCalls);
  std::vector<std::vector<double>> ms(launched.size());
  const std::size_t n = launched.size();
  for (int round = -kProfileWarmupRounds; round < repetitions; ++round)
    for (std::size_t k = 0; k < n; ++k) {
      // Each round starts one part later, so every part follows every other equally often: a part
      // that finds the caches warm from the one before it (the KV of a small model) gets no edge.
      const std::size_t i = (std::size_t(round + kProfileWarmupRounds) + k) % n;
      const double t = be.elapsed_ms([&] { model.run_step_part(launched[i]); });
      if (round >= 0) ms[i].push_back(t);
    }
  std::vector<double> us;
  for (const auto& m : ms) us.push_back(1e3 * median(m));
  const double step = us[0], weights_us = us[1], attention = us[2];
  const double layer_calls = model.step_selects() ? us[3] : attention;

  StepProfile p;
  p.policy = req.policy.describe();
  p.lengths = model.cache_lengths();
  p.repetitions = repetitions;
  p.clock = Backend::kClock;
  p.graph = model.graph_steps() && Backend::kRecordsGraphs;
  p.parts = {{"weights", weights_us, 0, model.weight_bytes(), true},
             {"attention", attention, 0, model.attended_kv_bytes(), true},
             {"selection", layer_calls - attention, 0, 0, false},
             {"rest", step - weights_us - layer_calls, 0, 0, false},
             {"step", step, 0, model.step_bytes(), true}};
  for (StepProfilePart& part : p.parts) part.share = step > 0 ? part.us / step : 0.0;
  return p;
}

}  // namespace minimal_decoder
