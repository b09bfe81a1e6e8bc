#pragma once
/// \file
/// \brief Status: what every kvsift launcher returns. Never thrown; an ok Status holds no message and
/// allocates nothing, so checking it on the decode hot path costs a compare.

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

namespace kvsift {

/// What kind of failure a Status reports; `kOk` is success.
enum class StatusCode : int {
  kOk = 0,             ///< success (an ok Status holds no message)
  kInvalidArgument,    ///< a parameter is out of its documented range (the message names it)
  kNullPointer,        ///< a required pointer is null
  kMisaligned,         ///< a pointer or stride breaks an alignment the kernel needs
  kUnsupported,        ///< a valid value this build or kernel does not handle (e.g. head_dim 96)
  kInsufficientSpace,  ///< a caller buffer or workspace is smaller than required
  kCudaError,          ///< the CUDA runtime reported an error (the message holds its name and text)
  kInternal,           ///< a kvsift bug: an invariant the library itself should have kept failed
};

/// The code's lower-case name ("invalid argument", "CUDA error", ...); "unknown" for a value outside
/// the enumeration.
inline const char* to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNullPointer: return "null pointer";
    case StatusCode::kMisaligned: return "misaligned";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kInsufficientSpace: return "insufficient space";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

/// The result of a kvsift call: a StatusCode and, unless ok, a message that names the parameter and
/// its value. Returned, never thrown; test it with ok() or `if (!st)`.
class Status {
 public:
  /// An ok Status (no message, no allocation).
  Status() = default;
  /// A Status of `code` with `message`; build errors with make_status or invalid_argument instead.
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  /// The same as Status(): success.
  static Status ok_status() { return Status(); }

  /// True when the code is StatusCode::kOk.
  bool ok() const { return code_ == StatusCode::kOk; }
  /// The same as ok(), so `if (!st) return st;` reads naturally.
  explicit operator bool() const { return ok(); }
  /// The failure kind; StatusCode::kOk on success.
  StatusCode code() const { return code_; }
  /// The error text without the code's name (empty when ok).
  const std::string& message() const { return message_; }
  /// The code's name and the message, e.g. "invalid argument: k = -1 must be >= 0"; "ok" on success.
  std::string to_string() const {
    return ok() ? std::string("ok") : std::string(kvsift::to_string(code_)) + ": " + message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

/// Builders used by validation code, so every message has the shape "<param> = <value> <why>".
/// make_status streams `parts` (anything with `operator<<`) into the message of a Status of `code`.
template <class... Parts>
Status make_status(StatusCode code, const Parts&... parts) {
  return Status(code, detail::concat(parts...));
}
/// make_status with StatusCode::kInvalidArgument: `invalid_argument("k = ", k, " must be >= 0")`.
template <class... Parts>
Status invalid_argument(const Parts&... parts) {
  return make_status(StatusCode::kInvalidArgument, parts...);
}

}  // namespace kvsift
