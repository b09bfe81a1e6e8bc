#pragma once
// HardKuma head gates, host side (no CUDA needed): the math, the batched host ops, output mixing,
// Lagrangian control, the optimizer step, head-role extraction and the roles file.
// docs/ops/hardkuma.md explains how an engine or a training loop uses them.

#include "kvsift/core/philox.hpp"
#include "kvsift/gates/gate_mixing.hpp"
#include "kvsift/gates/gate_optimizer.hpp"
#include "kvsift/gates/hardkuma.hpp"
#include "kvsift/gates/hardkuma_math.hpp"
#include "kvsift/gates/roles_from_gates.hpp"
#include "kvsift/gates/kumaraswamy.hpp"
#include "kvsift/gates/lagrangian.hpp"
#include "kvsift/gates/roles_file.hpp"
