#pragma once
// The passkey tools (issue 9; checkpoints like passkey-llama-13m, docs/fidelity.md), one entry point:
//   kEval       passkey_eval.hpp: per-length accuracy of every policy
//   kCalibrate  calibration.hpp: ClusterAttn theta x num_block with kvsift::calibrate_num_block
//   kProbe      role_probe.hpp: a CPU probe for LycheeDecode retrieval heads (not HardKuma training)
//   kTrain      role_training.hpp: LycheeDecode head roles from HardKuma gate training
// Compiled for each backend once (tools_host.cpp; tools_cuda.cu through nvcc, where the tools' kvsift
// calls find the CUDA launchers); callers link to those.

#include <cstdio>
#include <type_traits>

#include "engine/host_engine.hpp"
#include "tools/calibration.hpp"
#include "tools/passkey_eval.hpp"
#include "tools/passkey_tool_options.hpp"
#include "tools/role_probe.hpp"
#include "tools/role_training.hpp"
#ifdef MINIMAL_DECODER_CUDA
#include "engine/cuda/cuda_engine.hpp"
#endif

namespace minimal_decoder {

template <class Backend>
int run_passkey_eval(Backend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                     const BackendWeights<Backend>& weights) {
  const std::vector<PasskeyCase> all = read_passkey_file(o.prompt_file);
  const std::vector<EvalPolicy> policies = passkey_policies(o.policy, o.eval_clusterattn);
  const PasskeyReport r =
      evaluate_passkey(be, config, weights, all, o.lengths, o.limit, policies, o.batch, o.prefill_chunk, o.verbose,
                       o.kv_dtype);
  std::printf("passkey accuracy (%s, %s, KV %s; all five digits correct)\n", o.prompt_file.c_str(), be.name(),
              kv_dtype_name(o.kv_dtype));
  print_passkey_table(r);
  if (!o.json.empty()) write_passkey_json(r, all, o.limit, o.model_dir, be.name(), o.json);
  return 0;
}

template <class Backend>
int run_passkey_tool(Backend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                     const BackendWeights<Backend>& weights) {
  switch (o.tool) {
    case PasskeyTool::kEval: return run_passkey_eval(be, o, config, weights);
    case PasskeyTool::kCalibrate: return run_calibrate_clusterattn(be, o, config, weights);
    case PasskeyTool::kTrain: return run_train_roles(be, o, config, weights);
    case PasskeyTool::kProbe:
      if constexpr (std::is_same<Backend, HostBackend>::value) return run_probe_roles(be, o, config, weights);
      throw DecoderError("--probe-roles reads the KV cache on the host: run it with --device cpu");
    case PasskeyTool::kNone: break;
  }
  throw DecoderError("run_passkey_tool: no tool chosen");
}

extern template int run_passkey_tool<HostBackend>(HostBackend&, const PasskeyToolOptions&, const ModelConfig&,
                                                  const BackendWeights<HostBackend>&);
#ifdef MINIMAL_DECODER_CUDA
extern template int run_passkey_tool<CudaBackend>(CudaBackend&, const PasskeyToolOptions&, const ModelConfig&,
                                                  const BackendWeights<CudaBackend>&);
#endif

}  // namespace minimal_decoder
