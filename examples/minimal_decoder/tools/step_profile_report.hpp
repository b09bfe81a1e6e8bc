#pragma once
// What --profile prints and writes: the step profile (engine/step_profile.hpp) as a table and as JSON.
// With a bandwidth (the GPU: --roofline-tbps) each part whose bytes the decoder counts also gets its
// GB per step and the fraction of that bandwidth it reaches; on the CPU a bandwidth ceiling of HBM
// means nothing and those columns are left out (pass 0).

#include <string>

#include "engine/step_profile.hpp"

namespace minimal_decoder {

// One line of caption, then one row per part: part, us per step, share of the step[, GB, % of ceiling].
std::string step_profile_table(const StepProfile& p, double bandwidth_tbps);
// {"policy", "lengths", "repetitions", "clock", "graph", "bandwidth_tbps" (null without),
//  "parts": [{"part", "us", "share", "timed", "bytes" (null: not counted), "ceiling_fraction" (null)}]}
std::string step_profile_json(const StepProfile& p, double bandwidth_tbps);

}  // namespace minimal_decoder
