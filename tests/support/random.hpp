#pragma once
// Random inputs for tests. Every run draws a fresh seed (printed, so a failure can be replayed with
// KVSIFT_TEST_SEED=<seed>); tests never run on zeros.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kvsift/core/dtype.hpp"

namespace kvsift_test {

inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    if (const char* env = std::getenv("KVSIFT_TEST_SEED")) return std::uint64_t(std::strtoull(env, nullptr, 10));
    const std::uint64_t s = std::uint64_t(std::random_device{}()) * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
    std::printf("kvsift tests: seed %llu (replay with KVSIFT_TEST_SEED=%llu)\n", (unsigned long long)s,
                (unsigned long long)s);
    return s;
  }();
  return seed;
}

// A generator per test case, derived from the run's seed and a per-call salt.
inline std::mt19937_64 make_rng(std::uint64_t salt = 0) { return std::mt19937_64(test_seed() ^ (salt * 0x2545F4914F6CDD1Dull)); }

inline int uniform_int(std::mt19937_64& rng, int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

template <class T>
std::vector<T> random_values(std::mt19937_64& rng, std::size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = kvsift::from_float<T>(dist(rng));
  return v;
}

}  // namespace kvsift_test
