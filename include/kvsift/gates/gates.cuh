#pragma once
/// \file
/// \brief HardKuma head gates: the host API (gates.hpp) plus the CUDA backends (kvsift::cuda).

#include "kvsift/gates/gates.hpp"

#include "kvsift/gates/gate_mixing.cuh"
#include "kvsift/gates/gate_optimizer.cuh"
#include "kvsift/gates/hardkuma.cuh"
#include "kvsift/gates/lagrangian.cuh"
#include "kvsift/gates/roles_from_gates.cuh"
