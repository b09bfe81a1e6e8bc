#pragma once
// kvsift host-only umbrella: everything that compiles with a plain C++17 compiler (no nvcc, no CUDA
// toolkit). The host reference backend (kvsift::host) of every primitive is here.

#include "kvsift/core/backend.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/online_softmax.hpp"
#include "kvsift/core/status.hpp"
#include "kvsift/core/strided_view.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/kv/paged_kv.hpp"
#include "kvsift/ops/copy_kv_to_dense.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/gates/gates.hpp"
#include "kvsift/policy/lycheedecode.hpp"
