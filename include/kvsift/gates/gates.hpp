#pragma once
/// \file
/// \brief HardKuma head gates, host side (no CUDA needed): the math, the contracts and host references of the
/// batched gate ops, output mixing, Lagrangian control, the optimizer step, head-role extraction,
/// LycheeDecode's roles from gates and the roles file. docs/ops/hardkuma.md explains how an engine or
/// a training loop uses them.
///
/// Per op: <op>.hpp is the contract (options, validation, <op>_workspace_bytes), <op>_reference.hpp the
/// host reference (kvsift::host), <op>.cuh the CUDA launcher (kvsift::cuda, in gates.cuh). Every op is
///   Status op(const Exec& exec, <params>, Workspace workspace = {})
/// on both backends; none needs a workspace or the Exec's device facts.

#include "kvsift/core/philox.hpp"
#include "kvsift/gates/hardkuma_math.hpp"
#include "kvsift/gates/kumaraswamy.hpp"

#include "kvsift/gates/gate_mixing.hpp"
#include "kvsift/gates/gate_mixing_reference.hpp"
#include "kvsift/gates/gate_optimizer.hpp"
#include "kvsift/gates/gate_optimizer_reference.hpp"
#include "kvsift/gates/hardkuma.hpp"
#include "kvsift/gates/hardkuma_reference.hpp"
#include "kvsift/gates/lagrangian.hpp"
#include "kvsift/gates/lagrangian_reference.hpp"
#include "kvsift/gates/roles_from_gates.hpp"
#include "kvsift/gates/roles_from_gates_reference.hpp"

#include "kvsift/gates/lycheedecode_roles.hpp"
#include "kvsift/gates/roles_file.hpp"
