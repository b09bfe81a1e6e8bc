#pragma once
// Check macros for host code. They return a Status from the enclosing function; nothing throws.

#include "kvsift/core/status.hpp"

// Propagate a non-ok Status.
#define KVSIFT_TRY(expr)                                     \
  do {                                                       \
    ::kvsift::Status kvsift_try_status_ = (expr);            \
    if (!kvsift_try_status_.ok()) return kvsift_try_status_; \
  } while (0)

// Return an error naming the parameter when a condition fails:
//   KVSIFT_REQUIRE(k >= 0, kInvalidArgument, "k = ", k, " must be >= 0");
#define KVSIFT_REQUIRE(cond, code, ...)                                        \
  do {                                                                         \
    if (!(cond)) return ::kvsift::make_status(::kvsift::StatusCode::code, __VA_ARGS__); \
  } while (0)

// A required pointer: the message is "<name> is null".
#define KVSIFT_REQUIRE_NOT_NULL(ptr, name) \
  KVSIFT_REQUIRE((ptr) != nullptr, kNullPointer, name, " is null")
