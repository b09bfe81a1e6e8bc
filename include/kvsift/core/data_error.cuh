#pragma once
/// \file
/// \brief The device side of core/data_error.hpp: how a kernel records the first bad item of engine data
/// it met. Called only on the path that found one, so a kernel's normal path pays nothing but the test
/// that led here.

#include "kvsift/core/data_error.hpp"

namespace kvsift {
namespace detail {

/// Records the item in `*e` if `e` is set and nothing is recorded yet (the first caller wins the
/// state 0 -> 1 exchange, writes the fields, then publishes state 2); every other call returns at once.
/// Kernels call it outside their hot loops (a loop notes the item, the record follows it): not inlined,
/// so each call site is a call on the cold path; static, so every translation unit that includes this
/// header has its own copy (a non-inline definition in a header would be defined twice at link).
static __device__ __noinline__ void record_data_error(DataError* e, DataErrorOp op, DataErrorKind kind, int batch, int row,
                                                  int position, long long value) {
  if (e == nullptr) return;
  if (atomicCAS(reinterpret_cast<int*>(&e->state), 0, 1) != 0) return;
  e->op = op;
  e->kind = kind;
  e->batch = batch;
  e->row = row;
  e->position = position;
  e->value = value;
  __threadfence();
  atomicExch(reinterpret_cast<int*>(&e->state), 2);
}

}  // namespace detail
}  // namespace kvsift
