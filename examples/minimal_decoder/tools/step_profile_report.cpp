// The --profile table and JSON (step_profile_report.hpp).

#include "tools/step_profile_report.hpp"

#include <cstdarg>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace minimal_decoder {
namespace {

// The part's fraction of the bandwidth ceiling: bytes / (time x bandwidth); < 0 where it has none.
double ceiling_fraction(const StepProfilePart& part, double bandwidth_tbps) {
  if (bandwidth_tbps <= 0 || part.bytes <= 0 || part.us <= 0) return -1;
  return double(part.bytes) / (part.us * 1e-6 * bandwidth_tbps * 1e12);
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

}  // namespace

std::string step_profile_table(const StepProfile& p, double bandwidth_tbps) {
  const bool bw = bandwidth_tbps > 0;
  std::string lengths;
  for (int n : p.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(n);
  std::string out = format("profile: %s, batch %zu, lengths %s; median of %d repetitions per part (%s%s)\n",
                           p.policy.c_str(), p.lengths.size(), lengths.c_str(), p.repetitions, p.clock,
                           p.graph ? ", each part replayed from its own CUDA graph" : "");
  out += format("%-10s %12s %8s", "part", "us/step", "share");
  if (bw) out += format(" %10s %10s", "GB/step", ("% of " + format("%.2f", bandwidth_tbps) + " TB/s").c_str());
  out += "\n";
  for (const StepProfilePart& part : p.parts) {
    out += format("%-10s %12.1f %7.1f%%", part.name.c_str(), part.us, 100.0 * part.share);
    if (bw) {
      const double f = ceiling_fraction(part, bandwidth_tbps);
      if (f >= 0)
        out += format(" %10.3f %9.1f%%", double(part.bytes) / 1e9, 100.0 * f);
      else
        out += format(" %10s %10s", "-", "-");
    }
    out += "\n";
  }
  return out;
}

std::string step_profile_json(const StepProfile& p, double bandwidth_tbps) {
  nlohmann::json j = {{"policy", p.policy}, {"lengths", p.lengths}, {"repetitions", p.repetitions},
                      {"clock", p.clock}, {"graph", p.graph}};
  j["bandwidth_tbps"] = bandwidth_tbps > 0 ? nlohmann::json(bandwidth_tbps) : nlohmann::json(nullptr);
  nlohmann::json parts = nlohmann::json::array();
  for (const StepProfilePart& part : p.parts) {
    const double f = ceiling_fraction(part, bandwidth_tbps);
    parts.push_back({{"part", part.name},
                     {"us", part.us},
                     {"share", part.share},
                     {"timed", part.timed},
                     {"bytes", part.bytes > 0 ? nlohmann::json(part.bytes) : nlohmann::json(nullptr)},
                     {"ceiling_fraction", f >= 0 ? nlohmann::json(f) : nlohmann::json(nullptr)}});
  }
  j["parts"] = parts;
  return j.dump(1) + "\n";
}

}  // namespace minimal_decoder
