// Core device helpers against host arithmetic: 16-bit conversions, warp/block reductions, and the
// online-softmax merge as kernels use it.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

using kvsift_test::DeviceBuffer;

namespace {

template <class T>
__global__ void widen_all_patterns(float* out) {
  const unsigned b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < 0x10000u) out[b] = kvsift::to_float(T{static_cast<std::uint16_t>(b)});
}
template <class T>
__global__ void narrow(const float* in, std::uint16_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = kvsift::from_float<T>(in[i]).bits;
}

// fp8: every code widened on the device, and every float narrowed both by the hardware conversion and
// by the software one compiled for the device (the host's code); mismatches are counted.
template <class T>
__global__ void widen_fp8_codes(std::uint32_t* out) {
  const unsigned b = threadIdx.x;
  out[b] = kvsift::detail::float_to_bits(kvsift::to_float(T{static_cast<std::uint8_t>(b)}));
}
__global__ void widen_e4m3_pairs(std::uint32_t* out) {
  const unsigned b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < 0x10000u) out[b] = kvsift::detail::e4m3x2_bits_to_half2_bits(static_cast<std::uint16_t>(b));
}
__global__ void narrow_all_floats(unsigned long long* mismatches, std::uint32_t* first_bad) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    const float x = kvsift::detail::bits_to_float(std::uint32_t(i));
    const bool bad4 = kvsift::detail::float_to_e4m3_bits(x) != kvsift::detail::float_to_fp8_bits_soft<3, 7, 0x7eu>(x);
    const bool bad5 = kvsift::detail::float_to_e5m2_bits(x) != kvsift::detail::float_to_fp8_bits_soft<2, 15, 0x7bu>(x);
    if (bad4 || bad5) {
      atomicAdd(mismatches, 1ull);
      atomicMin(first_bad, std::uint32_t(i));
    }
  }
}

__global__ void reductions(const float* in, float* warp_sums, float* warp_maxes, float* block_sum, float* block_max) {
  __shared__ kvsift::BlockAllReduce<float, 256>::TempStorage tmp;
  const float x = in[threadIdx.x];
  const float ws = kvsift::warp_sum(x);
  const float wm = kvsift::warp_max(x);
  if (threadIdx.x % 32 == 0) {
    warp_sums[threadIdx.x / 32] = ws;
    warp_maxes[threadIdx.x / 32] = wm;
  }
  const float bs = kvsift::BlockAllReduce<float, 256>::sum(tmp, x);
  const float bm = kvsift::BlockAllReduce<float, 256>::max(tmp, x);
  // Every thread must see the same block result.
  block_sum[threadIdx.x] = bs;
  block_max[threadIdx.x] = bm;
}

// Each thread folds a slice of logits online; thread 0 merges the partials in order.
__global__ void softmax_merge(const float* x, const float* val, int n, float* out_lse, float* out_val) {
  // Plain arrays: __shared__ variables cannot have initialisers, and SoftmaxState has them.
  __shared__ float ms[32], ds[32], accs[32];
  const int per = (n + 31) / 32;
  kvsift::SoftmaxState s;
  float acc = 0.f;
  for (int i = threadIdx.x * per; i < min(n, (int(threadIdx.x) + 1) * per); ++i) {
    float p;
    const float scale = s.push(x[i], &p);
    acc = acc * scale + p * val[i];
  }
  ms[threadIdx.x] = s.m;
  ds[threadIdx.x] = s.d;
  accs[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    kvsift::SoftmaxState total;
    total.m = ms[0];
    total.d = ds[0];
    float a = accs[0];
    for (int j = 1; j < 32; ++j) {
      kvsift::SoftmaxState other;
      other.m = ms[j];
      other.d = ds[j];
      float fs, fo;
      total.merge(other, &fs, &fo);
      a = a * fs + accs[j] * fo;
    }
    *out_lse = total.lse();
    *out_val = a * total.inv_denominator();
  }
}

}  // namespace

TEST_CASE("device 16-bit widening equals the host conversion on every bit pattern") {
  DeviceBuffer<float> out(0x10000);
  out.poison();
  widen_all_patterns<kvsift::half_t><<<256, 256>>>(out.get());
  kvsift_test::sync_and_check();
  auto h = out.download();
  out.poison();
  widen_all_patterns<kvsift::bfloat16_t><<<256, 256>>>(out.get());
  kvsift_test::sync_and_check();
  auto b = out.download();
  for (std::uint32_t i = 0; i < 0x10000u; ++i) {
    const float hh = kvsift::to_float(kvsift::half_t{std::uint16_t(i)});
    const float bb = kvsift::to_float(kvsift::bfloat16_t{std::uint16_t(i)});
    if (std::isnan(hh)) REQUIRE(std::isnan(h[i])); else REQUIRE(h[i] == hh);
    if (std::isnan(bb)) REQUIRE(std::isnan(b[i])); else REQUIRE(b[i] == bb);
  }
}

TEST_CASE("device 16-bit narrowing equals the host conversion") {
  auto rng = kvsift_test::make_rng(30);
  std::vector<float> x = kvsift_test::random_values<float>(rng, 100000, -70000.f, 70000.f);
  auto small = kvsift_test::random_values<float>(rng, 1000, -1e-6f, 1e-6f);  // half subnormals
  x.insert(x.end(), small.begin(), small.end());
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  x.push_back(0.f);
  x.push_back(-0.f);
  const int n = int(x.size());
  DeviceBuffer<float> in(x);
  DeviceBuffer<std::uint16_t> out(n);
  out.poison();
  narrow<kvsift::half_t><<<(n + 255) / 256, 256>>>(in.get(), out.get(), n);
  kvsift_test::sync_and_check();
  auto h = out.download();
  out.poison();
  narrow<kvsift::bfloat16_t><<<(n + 255) / 256, 256>>>(in.get(), out.get(), n);
  kvsift_test::sync_and_check();
  auto b = out.download();
  for (int i = 0; i < n; ++i) {
    REQUIRE(h[i] == kvsift::from_float<kvsift::half_t>(x[i]).bits);
    REQUIRE(b[i] == kvsift::from_float<kvsift::bfloat16_t>(x[i]).bits);
  }
}

TEST_CASE("warp and block reductions") {
  auto rng = kvsift_test::make_rng(31);
  auto x = kvsift_test::random_values<float>(rng, 256, -100.f, 100.f);
  // Integers keep sums exact regardless of association order.
  for (auto& v : x) v = std::round(v);
  DeviceBuffer<float> in(x), ws(8), wm(8), bs(256), bm(256);
  for (auto* buf : {&ws, &wm, &bs, &bm}) buf->poison();
  reductions<<<1, 256>>>(in.get(), ws.get(), wm.get(), bs.get(), bm.get());
  kvsift_test::sync_and_check();
  const auto ws_h = ws.download(), wm_h = wm.download(), bs_h = bs.download(), bm_h = bm.download();
  float total = 0, top = -INFINITY;
  for (int w = 0; w < 8; ++w) {
    float s = 0, m = -INFINITY;
    for (int i = 0; i < 32; ++i) {
      s += x[w * 32 + i];
      m = std::max(m, x[w * 32 + i]);
    }
    CHECK(ws_h[w] == s);
    CHECK(wm_h[w] == m);
    total += s;
    top = std::max(top, m);
  }
  for (int t = 0; t < 256; ++t) {
    REQUIRE(bs_h[t] == total);
    REQUIRE(bm_h[t] == top);
  }
}

TEST_CASE("online-softmax partials merged on the device equal the exact softmax") {
  auto rng = kvsift_test::make_rng(32);
  for (int n : {1, 5, 31, 32, 33, 1000}) {
    auto x = kvsift_test::random_values<float>(rng, n, -20.f, 20.f);
    auto val = kvsift_test::random_values<float>(rng, n);
    DeviceBuffer<float> dx(x), dv(val), lse(1), out(1);
    lse.poison();
    out.poison();
    softmax_merge<<<1, 32>>>(dx.get(), dv.get(), n, lse.get(), out.get());
    kvsift_test::sync_and_check();
    double m = -INFINITY, s = 0, o = 0;
    for (float v : x) m = std::max(m, double(v));
    for (int i = 0; i < n; ++i) {
      s += std::exp(x[i] - m);
      o += std::exp(x[i] - m) * val[i];
    }
    CHECK(lse.download()[0] == doctest::Approx(m + std::log(s)).epsilon(1e-5));
    CHECK(out.download()[0] == doctest::Approx(o / s).epsilon(1e-5));
  }
}

TEST_CASE("device fp8 widening equals the host conversion on every code, NaN bits included") {
  DeviceBuffer<std::uint32_t> out(256);
  out.poison();
  widen_fp8_codes<kvsift::fp8_e4m3_t><<<1, 256>>>(out.get());
  kvsift_test::sync_and_check();
  const auto e4 = out.download();
  out.poison();
  widen_fp8_codes<kvsift::fp8_e5m2_t><<<1, 256>>>(out.get());
  kvsift_test::sync_and_check();
  const auto e5 = out.download();
  for (std::uint32_t b = 0; b < 256; ++b) {
    const std::uint8_t c = std::uint8_t(b);
    REQUIRE_MESSAGE(e4[b] == kvsift::detail::float_to_bits(kvsift::to_float(kvsift::fp8_e4m3_t{c})), "e4m3 code " << b);
    REQUIRE_MESSAGE(e5[b] == kvsift::detail::float_to_bits(kvsift::to_float(kvsift::fp8_e5m2_t{c})), "e5m2 code " << b);
    // The same values as CUDA's own host conversion.
    __nv_fp8_e4m3 n4;
    n4.__x = c;
    __nv_fp8_e5m2 n5;
    n5.__x = c;
    const float r4 = float(n4), r5 = float(n5);
    if (std::isnan(r4)) REQUIRE(std::isnan(kvsift::to_float(kvsift::fp8_e4m3_t{c})));
    else REQUIRE(r4 == kvsift::to_float(kvsift::fp8_e4m3_t{c}));
    if (std::isnan(r5)) REQUIRE(std::isnan(kvsift::to_float(kvsift::fp8_e5m2_t{c})));
    else REQUIRE(r5 == kvsift::to_float(kvsift::fp8_e5m2_t{c}));
  }
  DeviceBuffer<std::uint32_t> pairs(0x10000);
  pairs.poison();
  widen_e4m3_pairs<<<256, 256>>>(pairs.get());
  kvsift_test::sync_and_check();
  const auto p = pairs.download();
  for (std::uint32_t b = 0; b < 0x10000u; ++b)
    REQUIRE_MESSAGE(p[b] == kvsift::detail::e4m3x2_bits_to_half2_bits(std::uint16_t(b)), "pair " << b);
}

TEST_CASE("device fp8 narrowing (cvt.rn.satfinite) equals the software conversion on every float") {
  DeviceBuffer<unsigned long long> count(std::vector<unsigned long long>{0ull});
  DeviceBuffer<std::uint32_t> first(std::vector<std::uint32_t>{0xffffffffu});
  narrow_all_floats<<<4096, 256>>>(count.get(), first.get());
  kvsift_test::sync_and_check();
  const auto c = count.download();
  const auto f = first.download();
  CHECK_MESSAGE(c[0] == 0ull, "first mismatching float bits 0x" << std::hex << f[0]);
  // The host conversion against CUDA's own host emulation of __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...).
  for (std::uint64_t i = 0; i < (1ull << 32); i += 4099) {
    const float x = kvsift::detail::bits_to_float(std::uint32_t(i));
    REQUIRE(kvsift::from_float<kvsift::fp8_e4m3_t>(x).bits == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
    REQUIRE(kvsift::from_float<kvsift::fp8_e5m2_t>(x).bits == __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
  }
}
