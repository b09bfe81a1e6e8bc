#pragma once
// The fuzz suites' run control (tests/host/test_fuzz.cpp, tests/gpu/test_fuzz_*_gpu.cu): one seed per
// run, a case budget and a time box shared out among the op families, and a generator per case that
// depends only on (seed, family, case index), so any one failing case replays alone.
//
//   KVSIFT_FUZZ_SEED=<n>     the run's seed (default: a fresh one, printed; KVSIFT_TEST_SEED also works)
//   KVSIFT_FUZZ_CASES=<n>    cases of the whole run, shared out by family weight (default 10000)
//   KVSIFT_FUZZ_SECONDS=<s>  time box of the whole run, shared out the same way (default 45)
//   KVSIFT_FUZZ_CASE=<i>     run only case i of each family (replay; with -tc=<family's test case>)
//
// A family stops at its case quota or at its share of the time box, whichever comes first; running
// out of time is reported (the run still passes: the time box is what makes it usable in CI), so the
// number of cases a run drew is always printed.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "support/random.hpp"

namespace kvsift_test {
namespace fuzz {

struct Budget {
  std::uint64_t seed = 0;
  long cases = 10000;
  double seconds = 45.0;
  long only_case = -1;  // >= 0: replay this case index only
};

inline const Budget& budget() {
  static const Budget b = [] {
    Budget r;
    // One seed for the fuzz families and for the shared harnesses they call (which draw from
    // test_seed()): KVSIFT_FUZZ_SEED is handed to test_seed() as KVSIFT_TEST_SEED before its first use.
    if (const char* s = std::getenv("KVSIFT_FUZZ_SEED")) setenv("KVSIFT_TEST_SEED", s, 1);
    r.seed = test_seed();
    if (const char* s = std::getenv("KVSIFT_FUZZ_CASES")) r.cases = std::max(1L, std::strtol(s, nullptr, 10));
    if (const char* s = std::getenv("KVSIFT_FUZZ_SECONDS")) r.seconds = std::max(0.1, std::strtod(s, nullptr));
    if (const char* s = std::getenv("KVSIFT_FUZZ_CASE")) r.only_case = std::strtol(s, nullptr, 10);
    std::printf("kvsift fuzz: seed %llu, %ld cases, %.1f s (replay with KVSIFT_FUZZ_SEED=%llu)\n",
                (unsigned long long)r.seed, r.cases, r.seconds, (unsigned long long)r.seed);
    return r;
  }();
  return b;
}

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finalizer: nearby inputs, unrelated streams
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_name(const std::string& s) {  // FNV-1a
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The cases of one family: `weight` is its share of the run's cases (and, unless time_weight says
// otherwise, of its seconds); each binary's comment lists its families' shares. Use as
//   for (Family f("topk", 0.2); f.next();) { auto rng = f.rng(); INFO(f.replay()); ... }
class Family {
 public:
  // time_weight < 0: the same share of the time box as of the cases; families whose cases cost more
  // than the average (a multi-layer decode step) take a larger share of the seconds.
  Family(std::string name, double weight, std::string test_case, double time_weight = -1)
      : name_(std::move(name)), test_case_(std::move(test_case)),
        quota_(std::max(1L, long(double(budget().cases) * weight + 0.5))),
        seconds_(budget().seconds * (time_weight < 0 ? weight : time_weight)),
        start_(std::chrono::steady_clock::now()) {}
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  ~Family() {
    const double s = elapsed();
    std::printf("kvsift fuzz: %-28s %6ld cases in %6.2f s%s\n", name_.c_str(), done_, s,
                timed_out_ ? " (time box reached before the case quota)"
                : done_ < quota_ && budget().only_case < 0 ? " (stopped by a failure)" : "");
  }

  // Advances to the next case; false when the family is done.
  bool next() {
    if (budget().only_case >= 0) {
      if (started_) return false;
      started_ = true;
      index_ = budget().only_case;
      done_ = 1;
      return true;
    }
    if (started_) ++index_;
    started_ = true;
    if (index_ >= quota_) return false;
    if (index_ > 0 && elapsed() > seconds_) {
      timed_out_ = true;
      return false;
    }
    done_ = index_ + 1;
    return true;
  }
  long index() const { return index_; }
  long cases() const { return done_; }
  // The generator of the current case: a function of (seed, family, index) only.
  std::mt19937_64 rng() const {
    return std::mt19937_64(mix64(budget().seed ^ mix64(hash_name(name_)) ^ mix64(std::uint64_t(index_) + 1)));
  }
  // What a failure prints: how to run this very case again.
  std::string replay() const {
    return "fuzz " + name_ + " case " + std::to_string(index_) + ": replay with KVSIFT_FUZZ_SEED=" +
           std::to_string(budget().seed) + " KVSIFT_FUZZ_CASE=" + std::to_string(index_) + " <binary> -tc=\"" +
           test_case_ + "\"";
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  std::string name_, test_case_;
  long quota_;
  double seconds_;
  std::chrono::steady_clock::time_point start_;
  long index_ = 0, done_ = 0;
  bool started_ = false, timed_out_ = false;
};

inline int pick(std::mt19937_64& rng, int lo, int hi) { return uniform_int(rng, lo, hi); }
inline bool chance(std::mt19937_64& rng, int percent) { return uniform_int(rng, 0, 99) < percent; }
template <class T, std::size_t N>
const T& one_of(std::mt19937_64& rng, const T (&a)[N]) {
  return a[std::size_t(uniform_int(rng, 0, int(N) - 1))];
}

}  // namespace fuzz
}  // namespace kvsift_test
