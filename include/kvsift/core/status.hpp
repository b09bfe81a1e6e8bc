#pragma once
// Status: what every kvsift launcher returns. Never thrown; an ok Status holds no message and
// allocates nothing, so checking it on the decode hot path costs a compare.

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

namespace kvsift {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    ///< a parameter is out of its documented range (the message names it)
  kNullPointer,        ///< a required pointer is null
  kMisaligned,         ///< a pointer or stride breaks an alignment the kernel needs
  kUnsupported,        ///< a valid value this build or kernel does not handle (e.g. head_dim 96)
  kInsufficientSpace,  ///< a caller buffer or workspace is smaller than required
  kCudaError,          ///< the CUDA runtime reported an error (the message holds its name and text)
  kInternal,
};

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

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid argument: k = -1 must be >= 0"
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
template <class... Parts>
Status make_status(StatusCode code, const Parts&... parts) {
  return Status(code, detail::concat(parts...));
}
template <class... Parts>
Status invalid_argument(const Parts&... parts) {
  return make_status(StatusCode::kInvalidArgument, parts...);
}

}  // namespace kvsift
