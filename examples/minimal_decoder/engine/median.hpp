#pragma once
// The median of timings: the decoder's reports use it where a mean would let one slow sample (the
// first step, which also records the CUDA graph; a preempted repetition) speak for all.

#include <algorithm>
#include <vector>

namespace minimal_decoder {

// The middle value (the mean of the two middle ones for an even count); 0 for none.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

}  // namespace minimal_decoder
