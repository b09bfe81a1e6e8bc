#pragma once
// Launch shape of the elementwise gate kernels: a grid-stride loop over n elements with a bounded
// grid. The bounds are element counts, not SM counts, so no gate op needs the Exec's device facts.

#include <cstdint>

namespace kvsift {
namespace detail {

inline constexpr int kGateThreads = 256;

// Blocks of `threads` for n elements, at most `max_blocks` (the loop strides over the rest).
inline unsigned gate_blocks(std::int64_t n, int threads = kGateThreads, std::int64_t max_blocks = 4096) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < max_blocks ? blocks : max_blocks);
}

}  // namespace detail
}  // namespace kvsift
