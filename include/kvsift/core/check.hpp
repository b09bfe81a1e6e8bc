#pragma once
/// \file
/// \brief Check macros for host code. They return a Status from the enclosing function; nothing throws.

#include "kvsift/core/status.hpp"

/// Evaluates `expr` (a Status) once and returns it from the enclosing function when it is not ok.
#define KVSIFT_TRY(expr)                                     \
  do {                                                       \
    ::kvsift::Status kvsift_try_status_ = (expr);            \
    if (!kvsift_try_status_.ok()) return kvsift_try_status_; \
  } while (0)

/// Returns a Status of `StatusCode::code` whose message is the remaining arguments streamed together,
/// when `cond` is false; name the parameter and its value:
/// `KVSIFT_REQUIRE(k >= 0, kInvalidArgument, "k = ", k, " must be >= 0");`
#define KVSIFT_REQUIRE(cond, code, ...)                                        \
  do {                                                                         \
    if (!(cond)) return ::kvsift::make_status(::kvsift::StatusCode::code, __VA_ARGS__); \
  } while (0)

/// Returns `StatusCode::kNullPointer` with the message "<name> is null" when `ptr` is null.
#define KVSIFT_REQUIRE_NOT_NULL(ptr, name) \
  KVSIFT_REQUIRE((ptr) != nullptr, kNullPointer, name, " is null")

namespace kvsift {
namespace detail {
/// True for 1, 2, 4, ...: the block and page sizes the validators accept.
constexpr bool is_power_of_two(long long x) { return x > 0 && (x & (x - 1)) == 0; }
}  // namespace detail
}  // namespace kvsift
