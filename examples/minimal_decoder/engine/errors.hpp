#pragma once
// How the minimal decoder reports failure: one exception type whose message is the single line the
// program prints before exiting non-zero. kvsift itself never throws; `check` turns a kvsift Status
// into this error at the boundary where the example decides to give up.

#include <stdexcept>
#include <string>

#include <kvsift/core/status.hpp>

namespace minimal_decoder {

class DecoderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `what` says which step failed, so the line reads "decode attention (layer 3): invalid argument: ...".
inline void check(const kvsift::Status& st, const std::string& what) {
  if (!st.ok()) throw DecoderError(what + ": " + st.to_string());
}

}  // namespace minimal_decoder
