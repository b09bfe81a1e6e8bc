#pragma once
// --probe-roles: which KV heads read the passkey? For every (layer, KV head), over the decode
// queries of the dense continuation (positions L..L+3, teacher-forced answer digits):
//   mass    the softmax attention on the five digit tokens, mean over the group's query heads;
//   recall  the share of the five digits in the head's own LycheeDecode token selection (group-mean
//           raw scores, sink + recent forced, budget), i.e. what it would hand to sparse heads.
// The roles file gets layer 0 plus the --probe-heads heads of highest mass beyond layer 0. Every
// single extra head, and the chosen set, are also decoded under LycheeDecode on the same prompts.
// This is a probe on training prompts, not HardKuma training (--train-roles, role_training.hpp).
// It reads the KV cache on the host: CPU backend only.

#include "engine/host_engine.hpp"
#include "tools/passkey_tool_options.hpp"

namespace minimal_decoder {

int run_probe_roles(HostBackend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                    const BackendWeights<HostBackend>& weights);

}  // namespace minimal_decoder
