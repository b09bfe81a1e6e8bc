#pragma once
/// \file
/// \brief kvsift umbrella for CUDA translation units: the host-only API plus the CUDA backend (kvsift::cuda).

#include "kvsift/kvsift.hpp"

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/reduce.cuh"
#include "kvsift/ops/copy_kv_to_dense.cuh"
#include "kvsift/ops/store_kv.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "kvsift/ops/topk.cuh"
#include "kvsift/ops/window_scores.cuh"
#include "kvsift/ops/score_pooling.cuh"
#include "kvsift/ops/cluster_flags.cuh"
#include "kvsift/ops/compact_kv.cuh"
#include "kvsift/ops/attention_similarity.cuh"
#include "kvsift/gates/gates.cuh"
#include "kvsift/policy/lycheedecode.cuh"
