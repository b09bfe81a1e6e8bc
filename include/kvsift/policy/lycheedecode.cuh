#pragma once
/// \file
/// \brief LycheeDecode on the CUDA backend: the policy (lycheedecode.hpp, written once over Exec) plus the
/// CUDA launchers its unqualified calls resolve to with a cuda::Exec.

#include "kvsift/ops/decode_attention.cuh"
#include "kvsift/ops/topk.cuh"
#include "kvsift/policy/lycheedecode.hpp"
#include "kvsift/policy/lycheedecode_handoff.cuh"
