#pragma once
// Shared by the topk GPU tests (test_topk_gpu_paths.cu, test_topk_gpu_contract.cu): cases, inputs,
// the host reference on host copies, device copies with poisoned outputs, exact comparison, and the
// plan a case gets (so a test can assert which kernel, CTA group and CTA size it forces).

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "kvsift/ops/topk.cuh"
#include "kvsift/ops/topk_reference.hpp"
#include "support/device_buffer.cuh"
#include "support/random.hpp"
#include "support/tool_scale.hpp"

namespace kvsift_topk_test {

using kvsift::bfloat16_t;
using kvsift::half_t;
using kvsift_test::DeviceBuffer;


// kConstant: every value equal (one bucket per pass, all ties); kAllNaN: every key is the lowest;
// kSignedZeros: +0 and -0 must tie; kSampledHigh: the highest scores sit only in the positions the
// stream select samples (its threshold then passes fewer than budget keys: the exact fallback).
enum class Fill {
  kRandom, kFewValues, kLeadingBits, kInfinities, kNaNs, kAscending, kConstant, kAllNaN, kSignedZeros, kSampledHigh,
  kStrideHigh
};

inline float draw(std::mt19937_64& rng, Fill fill, int position) {
  const int u = kvsift_test::uniform_int(rng, 0, 15);
  const float inf = std::numeric_limits<float>::infinity();
  switch (fill) {
    case Fill::kRandom: return std::uniform_real_distribution<float>(-8.f, 8.f)(rng);
    case Fill::kFewValues: return float(u % 3) - 1.f;
    case Fill::kLeadingBits: return 1.0f + float(kvsift_test::uniform_int(rng, 0, 1 << 12)) * 1.2e-7f;
    case Fill::kInfinities: return u == 0 ? inf : (u == 1 ? -inf : float(u) * 0.25f);
    case Fill::kNaNs: return u < 4 ? std::numeric_limits<float>::quiet_NaN() : (u == 4 ? -inf : float(u) - 8.f);
    case Fill::kAscending: return float(position % 65536);
    case Fill::kConstant: return 0.75f;
    case Fill::kAllNaN: return std::numeric_limits<float>::quiet_NaN();
    case Fill::kSignedZeros: return u < 6 ? 0.f : (u < 12 ? -0.f : (u < 14 ? 1.f : -1.f));
    case Fill::kSampledHigh:  // the first 8 of every 64 positions: inside the sampled 32-byte sectors
      return std::uniform_real_distribution<float>(position % 64 < 8 ? 100.f : -8.f, position % 64 < 8 ? 200.f : 8.f)(rng);
    case Fill::kStrideHigh:  // every 64th position high: on the candidate select's stride sample (period 16-64)
      return std::uniform_real_distribution<float>(position % 64 == 0 ? 100.f : -8.f, position % 64 == 0 ? 200.f : 8.f)(rng);
  }
  return 0.f;
}

struct Case {
  int rows = 1, cols = 1, stride_pad = 0, capacity = 1;
  kvsift::TopKParams params;
  std::vector<std::int32_t> lengths, per_row_k;
  Fill fill = Fill::kRandom;
  bool flagged = false;  // FlagFirstKey with random flags
  // With flagged (fp32 scores): the scores' magnitudes, and the device runs FlagFirstNonNegativeKey
  // (32 bits) where the host reference keeps FlagFirstKey<float> (33): the two must select the same.
  bool nonnegative = false;
  // Device facts the plan sees: the real device's, or a smaller GPU's to force the radix select.
  // kFewSms: a 4-SM device, so a few rows already fill it and small cases get CTA groups of 2 and 4.
  enum class Facts { kDevice, kNoClusters, kNoClustersSmallSmem, kFewSms } facts = Facts::kDevice;
  // Run the stream select (plan_topk_stream) whatever the plan picks, with its list cut to
  // stream_list entries when that is > 0 (so the overflow streams run on ordinary rows too).
  bool stream = false;
  int stream_list = 0;
  int stream_period = 0;  // > 0: the sample's period in sectors (the plan's 4 otherwise)
  // Candidate select in CTA groups and register select: false runs the exact searches only (the
  // plan's bracket off).
  bool bracket = true;
  // false: the plan without the register and short-row selects (plan_topk_cta_groups), so the
  // candidate select stays tested on the few-row and short-row shapes those kernels now take.
  bool register_kernels = true;
  // > 0: the register select in CTAs of this many threads (plan_topk_register's own group for it).
  int register_threads = 0;
};

// The plan cuda::topk makes for the case's key width, or plan_topk_cta_groups for a case that turns
// the register kernels off.
template <class KeyT>
kvsift::detail::TopkPlan case_plan(const Case& c, std::int64_t rows, const kvsift::DeviceFacts& device) {
  if (c.register_threads > 0) return kvsift::detail::plan_topk_register<KeyT>(rows, c.cols, 0, device, c.register_threads);
  return c.register_kernels ? kvsift::detail::plan_topk<KeyT>(rows, c.cols, device)
                           : kvsift::detail::plan_topk_cta_groups<KeyT>(rows, c.cols, device);
}

inline kvsift::cuda::Exec exec_for(const Case& c, cudaStream_t stream) {
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  if (c.facts == Case::Facts::kNoClusters || c.facts == Case::Facts::kNoClustersSmallSmem) exec.device.clusters = false;
  if (c.facts == Case::Facts::kFewSms) exec.device.num_sms = 4;
  if (c.facts == Case::Facts::kNoClustersSmallSmem) exec.device.max_smem_optin = std::size_t(99) << 10;  // an sm_86
  return exec;
}

// The plan cuda::topk makes for this case (tests assert the path they mean to force): sized by the
// rows the filter writes, as cuda::topk sizes it.
template <class T>
kvsift::detail::TopkPlan plan_of(const Case& c) {
  const auto exec = exec_for(c, nullptr);
  const std::int64_t rows = kvsift::topk_written_rows(c.params, c.rows);
  if (c.flagged && c.nonnegative) return case_plan<kvsift::FlagFirstNonNegativeKey::key_type>(c, rows, exec.device);
  if (c.flagged) return case_plan<typename kvsift::FlagFirstKey<T>::key_type>(c, rows, exec.device);
  return case_plan<typename kvsift::ScoreKey<T>::key_type>(c, rows, exec.device);
}

// REQUIREs that the case runs the given kernel with the given CTA group and CTA size.
template <class T>
void require_path(const Case& c, kvsift::detail::TopkKernel kernel, int ctas_per_row, int threads) {
  const auto p = plan_of<T>(c);
  INFO("rows ", c.rows, ", cols ", c.cols, ": plan kernel ", int(p.kernel), ", ctas_per_row ", p.ctas_per_row,
       ", threads ", p.threads, ", slice ", p.slice);
  REQUIRE(int(p.kernel) == int(kernel));
  REQUIRE(p.ctas_per_row == ctas_per_row);
  REQUIRE(p.threads == threads);
}

// REQUIREs that the case's plan takes the sampled bracket (a bracket list of at least `capacity` keys).
template <class T>
void require_bracket(const Case& c, int capacity) {
  const auto p = plan_of<T>(c);
  INFO("rows ", c.rows, ", cols ", c.cols, ": bracket capacity ", p.bracket_capacity);
  REQUIRE(p.bracket_capacity >= capacity);
}

template <class T>
struct Inputs {
  std::vector<T> scores;
  std::vector<std::uint8_t> flags;
  std::int64_t stride;
};

template <class T>
Inputs<T> make_inputs(std::mt19937_64& rng, const Case& c) {
  Inputs<T> in;
  in.stride = c.cols + c.stride_pad;
  in.scores.assign(std::size_t(std::max<std::int64_t>(c.rows * in.stride, 1)), kvsift::from_float<T>(3.f));
  for (int r = 0; r < c.rows; ++r)
    for (int i = 0; i < c.cols; ++i) {
      const float x = draw(rng, c.fill, i);
      in.scores[r * in.stride + i] = kvsift::from_float<T>(c.nonnegative ? std::fabs(x) : x);  // fabs keeps NaN
    }
  if (c.flagged) {
    in.flags.resize(std::size_t(std::max(c.rows * c.cols, 1)));
    const int density = kvsift_test::uniform_int(rng, 1, 9);
    for (auto& f : in.flags) f = kvsift_test::uniform_int(rng, 0, 9) < density ? 1 : 0;
  }
  return in;
}

struct Result {
  std::vector<std::int32_t> indices, counts;
  std::vector<std::uint16_t> value_bits;  // values compared bitwise (NaN payloads included)
};

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> b(v.size() * sizeof(T) / 2);
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

// Host reference on host copies.
template <class T>
Result reference(const Case& c, const Inputs<T>& in) {
  Result r;
  r.indices.assign(std::size_t(c.rows) * c.capacity + 1, -1);
  r.counts.assign(std::size_t(c.rows), -1);
  std::vector<T> values(r.indices.size());
  kvsift::TopKParams p = c.params;
  p.lengths = c.lengths.empty() ? nullptr : c.lengths.data();
  p.per_row_k = c.per_row_k.empty() ? nullptr : c.per_row_k.data();
  const auto view = kvsift::make_strided_view<const T>(in.scores.data(), c.rows, c.cols, in.stride);
  const auto out = kvsift::make_index_set(r.indices.data(), r.counts.data(), c.rows, c.capacity);
  kvsift::Status st;
  if (c.flagged) {
    kvsift::FlagFirstKey<T> key;
    key.flags = in.flags.data();
    key.row_stride = c.cols;
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
  } else {
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data());
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  r.value_bits = bits_of(values);
  return r;
}

// Device copies of one case's inputs and outputs.
template <class T>
struct DeviceCase {
  DeviceBuffer<T> scores;
  DeviceBuffer<std::uint8_t> flags;
  DeviceBuffer<std::int32_t> lengths, per_row_k, indices, counts;
  DeviceBuffer<T> values;
  DeviceCase(const Case& c, const Inputs<T>& in)
      : scores(in.scores), flags(in.flags), lengths(c.lengths), per_row_k(c.per_row_k),
        indices(std::size_t(c.rows) * c.capacity + 1), counts(std::size_t(c.rows)),
        values(std::size_t(c.rows) * c.capacity + 1) {}

  void poison() {
    indices.poison();
    counts.poison();
    values.poison();
  }
  kvsift::Status launch(const Case& c, std::int64_t stride, cudaStream_t stream) {
    kvsift::TopKParams p = c.params;
    p.lengths = c.lengths.empty() ? nullptr : lengths.get();
    p.per_row_k = c.per_row_k.empty() ? nullptr : per_row_k.get();
    const auto view = kvsift::make_strided_view<const T>(scores.get(), c.rows, c.cols, stride);
    const auto out = kvsift::make_index_set(indices.get(), counts.get(), c.rows, c.capacity);
    const auto exec = exec_for(c, stream);
    auto run = [&](auto key) {
      using Key = decltype(key);
      if (!c.bracket || !c.register_kernels || c.register_threads > 0) {
        KVSIFT_TRY(kvsift::detail::validate_topk(view, p, out, static_cast<const T*>(values.get()), key));
        auto plan = case_plan<typename Key::key_type>(c, kvsift::topk_written_rows(p, c.rows), exec.device);
        if (!c.bracket) plan.bracket_capacity = 0;
        return kvsift::detail::launch_topk(exec, kvsift::detail::TopkLaunch<T, Key>{view, p, out, values.get(), key, plan});
      }
      if (!c.stream) return kvsift::cuda::topk(exec, view, p, out, values.get(), key);
      KVSIFT_TRY(kvsift::detail::validate_topk(view, p, out, static_cast<const T*>(values.get()), key));
      auto plan = kvsift::detail::plan_topk_stream<typename Key::key_type>(c.cols, exec.device);
      REQUIRE(plan.list_capacity > 0);
      if (c.stream_list > 0 && c.stream_list < plan.list_capacity) plan.list_capacity = c.stream_list;
      if (c.stream_period > 0) plan.sample_period = c.stream_period;
      return kvsift::detail::launch_topk(exec, kvsift::detail::TopkLaunch<T, Key>{view, p, out, values.get(), key, plan});
    };
    if constexpr (std::is_same_v<T, float>) {
      if (c.flagged && c.nonnegative) {
        kvsift::FlagFirstNonNegativeKey key;
        key.flags = flags.get();
        key.row_stride = c.cols;
        return run(key);
      }
    }
    REQUIRE_MESSAGE(!c.nonnegative, "FlagFirstNonNegativeKey takes fp32 scores");
    if (c.flagged) {
      kvsift::FlagFirstKey<T> key;
      key.flags = flags.get();
      key.row_stride = c.cols;
      return run(key);
    }
    return run(kvsift::ScoreKey<T>{});
  }
  Result download() const {
    Result r;
    r.indices = indices.download();
    r.counts = counts.download();
    r.value_bits = bits_of(values.download());
    return r;
  }
};

// Compares the first counts[r] entries of every row (the rest of a row is documented as untouched).
inline void require_equal(const Case& c, const Result& want, const Result& got, int value_halfwords) {
  for (int r = 0; r < c.rows; ++r) {
    INFO("row ", r, " of ", c.rows, ", cols ", c.cols, ", capacity ", c.capacity);
    REQUIRE(got.counts[r] == want.counts[r]);
    for (int j = 0; j < want.counts[r]; ++j) {
      const std::size_t o = std::size_t(r) * c.capacity + j;
      if (got.indices[o] != want.indices[o]) {
        INFO("entry ", j);
        REQUIRE(got.indices[o] == want.indices[o]);
      }
      for (int h = 0; h < value_halfwords; ++h)
        REQUIRE(got.value_bits[o * value_halfwords + h] == want.value_bits[o * value_halfwords + h]);
    }
  }
}

// Fresh inputs for the case, the reference, one launch over poisoned outputs, and the comparison;
// returns what the device wrote.
template <class T>
Result check_case(std::mt19937_64& rng, const Case& c) {
  const Inputs<T> in = make_inputs<T>(rng, c);
  const Result want = reference(c, in);
  DeviceCase<T> dev(c, in);
  dev.poison();
  const auto t0 = std::chrono::steady_clock::now();
  const kvsift::Status st = dev.launch(c, in.stride, nullptr);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  if (kvsift_test::trace_launches()) {
    const auto p = plan_of<T>(c);
    std::printf("topk launch: %d x %d (%zu-byte scores), fill %d, kernel %d, %d CTAs a row of %d threads: %.1f ms\n", c.rows,
                c.cols, sizeof(T), int(c.fill), int(p.kernel), p.ctas_per_row, p.threads,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  Result got = dev.download();
  require_equal(c, want, got, int(sizeof(T) / 2));
  return got;
}

// check_case for a call with the row filter: the written rows against the reference, and every row the
// filter skips still holding the poison in its count and all of its entries (nothing written there).
template <class T>
void check_filtered_case(std::mt19937_64& rng, const Case& c) {
  const Result got = check_case<T>(rng, c);
  for (int r = 0; r < c.rows; ++r) {
    if (!kvsift::topk_skips_row(c.params, r)) continue;
    INFO("skipped row ", r);
    REQUIRE(got.counts[r] == -1);
    for (int j = 0; j < c.capacity; ++j) REQUIRE(got.indices[std::size_t(r) * c.capacity + j] == -1);
  }
}

// check(f) for every fill of `fills`, or under a sanitizer (tests/support/tool_scale.hpp) for the first
// `under_tool` of them: the callers list the fills that take paths of their own first.
template <class F>
void for_fills(std::initializer_list<Fill> fills, int under_tool, F&& check) {
  const int most = kvsift_test::repetitions(int(fills.size()), under_tool);
  int n = 0;
  for (Fill f : fills) {
    if (n++ == most) break;
    check(f);
  }
}

// Every fill; under a sanitizer the four that take distinct paths through a select: distinct keys,
// ties at the k-th key, keys that share their leading bits (the deepest digit searches) and one value
// throughout. The others differ from these in their keys only.
template <class T>
void check_all_fills(std::mt19937_64& rng, Case c) {
  for_fills({Fill::kRandom, Fill::kFewValues, Fill::kLeadingBits, Fill::kConstant, Fill::kInfinities, Fill::kNaNs,
             Fill::kAscending, Fill::kAllNaN, Fill::kSignedZeros},
            4, [&](Fill f) {
              c.fill = f;
              CAPTURE(int(f));
              check_case<T>(rng, c);
            });
}

inline Case shape(int rows, int cols, int capacity, int k) {
  Case c;
  c.rows = rows;
  c.cols = cols;
  c.capacity = capacity;
  c.params.k = k;
  return c;
}


// Rows that probe the edges of one launch shape: lengths 0, 1, 2, 3, cols - 1, cols and random, each
// with a budget of len - 1, len, len + 1, 0, 1, capacity + 5 or -1 (per-row k, clamped by the op).
inline Case edge_rows(std::mt19937_64& rng, int rows, int cols, int capacity) {
  Case c = shape(rows, cols, capacity, 0);
  for (int r = 0; r < rows; ++r) {
    const int lens[] = {0, 1, 2, 3, cols - 1, cols, kvsift_test::uniform_int(rng, 0, cols)};
    const int len = lens[r % 7];
    const int ks[] = {len - 1, len, len + 1, 0, 1, capacity + 5, -1, kvsift_test::uniform_int(rng, 0, capacity)};
    c.lengths.push_back(len);
    c.per_row_k.push_back(ks[(r / 7 + r) % 8]);
  }
  return c;
}

}  // namespace kvsift_topk_test
