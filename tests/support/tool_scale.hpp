#pragma once
// Repetition counts a compute-sanitizer run lowers. A tool checks each kernel's own accesses (bounds,
// initialization, barriers, shared-memory hazards), which depend on the code path a launch takes, not
// on how many times or on which values of the same path it runs; under racecheck every launch is
// 100-1000x slower, so the GPU tests' repetitions (fills of one path, identical runs, launch
// configurations, launches a thread) would not fit a run. scripts/gpu-sanitize.sh sets
// KVSIFT_UNDER_TOOL=1; a test then keeps every shape and path and drops the repeats that take the same
// path (each test says which). Unset, every test runs whole.

#include <cstdio>
#include <cstdlib>

namespace kvsift_test {

// Whether the environment variable `name` is set to something other than "" or "0".
inline bool env_flag(const char* name) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' && *s != '0';
}

inline bool under_tool() {
  static const bool on = [] {
    const bool set = env_flag("KVSIFT_UNDER_TOOL");
    if (set) std::printf("kvsift tests: KVSIFT_UNDER_TOOL set: repeats of one path reduced (tests/support/tool_scale.hpp)\n");
    return set;
  }();
  return on;
}

// `full` unsanitized, `reduced` under a tool.
inline int repetitions(int full, int reduced) { return under_tool() ? reduced : full; }

// KVSIFT_TOOL_TRACE=1: the tests that support it print one line per launch with its wall time
// (launch to synchronization, host clock), so a run that a sanitizer's time-out cuts shows which
// launches its time went to: the input for reducing that test under the tool.
inline bool trace_launches() {
  static const bool on = env_flag("KVSIFT_TOOL_TRACE");
  return on;
}

// A positive count from the environment variable `name`, else `fallback`.
inline int count_from_env(const char* name, int fallback) {
  const char* s = std::getenv(name);
  const long v = s ? std::strtol(s, nullptr, 10) : 0;
  return v >= 1 ? int(v) : fallback;
}

}  // namespace kvsift_test
