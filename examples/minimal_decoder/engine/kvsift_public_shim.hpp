#pragma once
// TEMPORARY: removed when the lead's include/ change lands (issue 13, /work/plan/house.md "Public
// helpers an example may call instead of detail::"). The decoder calls kvsift's public names only;
// until include/ has them, this header defines them in terms of the detail:: functions they replace.
// Nothing else in the decoder may name kvsift::detail.

#include <climits>
#include <cstdint>

#include <kvsift/core/dtype.hpp>
#include <kvsift/policy/prompt_compression.hpp>

namespace kvsift {

// The checks of a compression config that need no shape (window, capacity, sinks, policy).
inline Status validate(const PromptCompressionConfig& c) {
  // A shape that passes every shape check, so that only the config's own fields are judged.
  const PromptCompressionShape any{1, 1, 1, INT_MAX};
  return detail::validate_compression_config(c, any);
}

inline float bf16_bits_to_float(std::uint16_t bits) { return detail::bf16_bits_to_float(bits); }

}  // namespace kvsift
