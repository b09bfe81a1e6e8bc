// store_kv on the device against the host reference, byte for byte: K/V rows and per-token scales of
// every layout, KV dtype and input dtype, with the cache and scales poisoned so that an element the
// kernel should not write (rows outside the view, other tokens) is caught too.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/store_kv_cases.hpp"

using kvsift::ScaleGranularity;
using kvsift_test::DeviceBuffer;
using kvsift_test::StoreCase;
using kvsift_test::StoreLayout;

namespace {

template <class X>
std::vector<X> poisoned(std::size_t n) {
  std::vector<X> x(n);
  std::memset(x.data(), kvsift_test::kPoisonByte, n * sizeof(X));
  return x;
}

template <class X>
void require_same_bytes(const std::vector<X>& got, const std::vector<X>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    REQUIRE_MESSAGE(std::memcmp(&got[i], &want[i], sizeof(X)) == 0, what << " element " << i);
}

// The same store on the host (hp into host memory) and on the device (dp into device memory), in the
// case's layout; both must succeed.
template <class KT, class T>
void store_on_both(const StoreCase& c, std::vector<KT>& hk, std::vector<KT>& hv, std::vector<float>& hks, std::vector<float>& hvs,
                   DeviceBuffer<KT>& dk, DeviceBuffer<KT>& dv, DeviceBuffer<float>& dks, DeviceBuffer<float>& dvs,
                   const kvsift::StoreKvParams<T>& hp, const kvsift::StoreKvParams<T>& dp) {
  DeviceBuffer<std::int32_t> dlen(c.lengths), dtable(c.table);
  std::vector<std::int32_t> lengths(c.lengths);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  kvsift::Status hs, ds;
  if (c.paged()) {
    hs = kvsift::host::store_kv(kvsift::host::Exec{},
                                kvsift_test::store_paged_view(c, hk.data(), hv.data(), hks.data(), hvs.data(), c.table.data(), lengths.data()), hp);
    ds = kvsift::cuda::store_kv(exec, kvsift_test::store_paged_view(c, dk.get(), dv.get(), dks.get(), dvs.get(), dtable.get(), dlen.get()), dp);
  } else {
    hs = kvsift::host::store_kv(kvsift::host::Exec{},
                                kvsift_test::store_contiguous_view(c, hk.data(), hv.data(), hks.data(), hvs.data(), lengths.data()), hp);
    ds = kvsift::cuda::store_kv(exec, kvsift_test::store_contiguous_view(c, dk.get(), dv.get(), dks.get(), dvs.get(), dlen.get()), dp);
  }
  REQUIRE_MESSAGE(hs.ok(), hs.to_string());
  REQUIRE_MESSAGE(ds.ok(), ds.to_string());
  kvsift_test::sync_and_check();
}

template <class KT, class T>
void check_case(std::mt19937_64& rng, StoreLayout layout, ScaleGranularity g, bool specials) {
  const StoreCase c = kvsift_test::random_store_case(rng, layout, g);
  const auto kin = kvsift_test::random_store_rows<T>(rng, c, specials);
  const auto vin = kvsift_test::random_store_rows<T>(rng, c, specials);
  // Host: poisoned cache, poisoned per-token scales (per-head scales are inputs: real values).
  auto hk = poisoned<KT>(c.cache_elements()), hv = poisoned<KT>(c.cache_elements());
  auto hks = poisoned<float>(c.scale_count()), hvs = poisoned<float>(c.scale_count());
  if (g == ScaleGranularity::kPerHead)
    for (int h = 0; h < c.heads; ++h) {
      hks[h] = 0.03f * float(h + 1);
      hvs[h] = 0.7f / float(h + 1);
    }
  DeviceBuffer<KT> dk(hk), dv(hv);
  DeviceBuffer<float> dks(hks), dvs(hvs);
  DeviceBuffer<T> dkin(kin), dvin(vin);
  DeviceBuffer<std::int32_t> dseq(c.seq), dpos(c.pos);
  const auto hp = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  const auto dp = kvsift::make_store_kv_params(dkin.get(), dvin.get(), c.n, c.heads, c.head_dim, dseq.get(), dpos.get());
  store_on_both(c, hk, hv, hks, hvs, dk, dv, dks, dvs, hp, dp);
  require_same_bytes(dk.download(), hk, "K");
  require_same_bytes(dv.download(), hv, "V");
  require_same_bytes(dks.download(), hks, "K scales");
  require_same_bytes(dvs.download(), hvs, "V scales");
}

template <class KT, class T>
void every_layout(std::mt19937_64& rng, bool specials) {
  for (auto layout : {StoreLayout::kBHSD, StoreLayout::kBSHD, StoreLayout::kPagedNHD, StoreLayout::kPagedHND})
    for (auto g : {ScaleGranularity::kPerToken, ScaleGranularity::kPerHead})
      for (int trial = 0; trial < 6; ++trial) check_case<KT, T>(rng, layout, g, specials);
}

}  // namespace

TEST_CASE("store_kv on the device writes the host's bytes: fp8 E4M3 and E5M2, per-token and per-head") {
  auto rng = kvsift_test::make_rng(1410);
  every_layout<kvsift::fp8_e4m3_t, kvsift::bfloat16_t>(rng, false);
  every_layout<kvsift::fp8_e4m3_t, kvsift::half_t>(rng, false);
  every_layout<kvsift::fp8_e4m3_t, float>(rng, true);
  every_layout<kvsift::fp8_e5m2_t, kvsift::bfloat16_t>(rng, true);
  every_layout<__nv_fp8_e4m3, __nv_bfloat16>(rng, false);  // CUDA's own types through the same traits
}

TEST_CASE("store_kv on the device writes the host's bytes: 16/32-bit caches") {
  auto rng = kvsift_test::make_rng(1411);
  every_layout<kvsift::bfloat16_t, float>(rng, true);
  every_layout<kvsift::half_t, kvsift::bfloat16_t>(rng, false);
  every_layout<float, kvsift::half_t>(rng, false);
}

TEST_CASE("store_kv on the device: nothing to store launches nothing; errors before any launch") {
  std::int32_t* none = nullptr;
  auto kv = kvsift::make_bshd<kvsift::fp8_e4m3_t>(nullptr, nullptr, 1, 1, 4, 16, none);
  auto p = kvsift::make_store_kv_params<kvsift::bfloat16_t>(nullptr, nullptr, 0, 1, 16, none, none);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  CHECK(kvsift::cuda::store_kv(exec, kv, p).message() == "kv.k is null");
  kv.batch = 0;
  CHECK(kvsift::cuda::store_kv(exec, kv, p).ok());
}

// RoPE on the way in (StoreKvRotary) on the device against the host reference: V, V's scales and the
// unrotated dims byte for byte; the rotated K dims, K's per-token scales and Q within one rounding of
// their type (the two sides' double cos/sin may differ by an ulp of a double). Every layout, fp8 and
// 16/32-bit caches, whole and partial rotaries (pairs within a lane, r a multiple of 64, and across
// lanes), heads of 16 to 256 dims, Q rows of more heads than K.
namespace {

template <class KT, class T>
void check_rotary_case(std::mt19937_64& rng, StoreLayout layout, int head_dim, int rotary_dim) {
  const StoreCase c = kvsift_test::random_store_case(rng, layout, ScaleGranularity::kPerToken, head_dim);
  const auto r = kvsift_test::random_rotary_case(rng, c, rotary_dim);
  const auto kin = kvsift_test::random_store_rows<T>(rng, c, false);
  const auto vin = kvsift_test::random_store_rows<T>(rng, c, false);
  std::vector<T> hq = kvsift_test::random_query_rows<T>(rng, c, r);
  auto hk = poisoned<KT>(c.cache_elements()), hv = poisoned<KT>(c.cache_elements());
  auto hks = poisoned<float>(c.scale_count()), hvs = poisoned<float>(c.scale_count());
  DeviceBuffer<KT> dk(hk), dv(hv);
  DeviceBuffer<float> dks(hks), dvs(hvs), dinv(r.inv_freq);
  DeviceBuffer<T> dkin(kin), dvin(vin), dq(hq);
  DeviceBuffer<std::int32_t> dseq(c.seq), dpos(c.pos), dposition(r.position);
  auto hp = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  hp = kvsift::with_rotary(hp, r.inv_freq.data(), r.position.data(), rotary_dim, hq.data(), r.q_heads, c.head_dim);
  auto dp = kvsift::make_store_kv_params(dkin.get(), dvin.get(), c.n, c.heads, c.head_dim, dseq.get(), dpos.get());
  dp = kvsift::with_rotary(dp, dinv.get(), dposition.get(), rotary_dim, dq.get(), r.q_heads, c.head_dim);
  store_on_both(c, hk, hv, hks, hvs, dk, dv, dks, dvs, hp, dp);
  require_same_bytes(dv.download(), hv, "V");
  require_same_bytes(dvs.download(), hvs, "V scales");
  const auto gk = dk.download();
  const auto gks = dks.download();
  for (std::size_t s = 0; s < gks.size(); ++s) {  // poison where nothing was written, else one rounding of float apart
    if (std::memcmp(&gks[s], &hks[s], sizeof(float)) == 0) continue;
    REQUIRE_MESSAGE(std::fabs(gks[s] - hks[s]) <= 4e-7 * std::fabs(hks[s]), "K scale " << s);
  }
  // K elements: the same bytes, or one rounding apart (scaled by their row's scale for fp8; rows' scales
  // agree to a float rounding, checked above).
  for (std::size_t e = 0; e < gk.size(); ++e) {
    if (std::memcmp(&gk[e], &hk[e], sizeof(KT)) == 0) continue;
    const double g = kvsift::to_float(gk[e]), h = kvsift::to_float(hk[e]);
    REQUIRE_MESSAGE(std::fabs(g - h) <= 1.01 * kvsift_test::epsilon_of<KT>() * std::max(std::fabs(h), 1e-3), "K element " << e << ": " << g << " vs " << h);
  }
  const auto gq = dq.download();
  for (std::size_t e = 0; e < gq.size(); ++e) {
    if (std::memcmp(&gq[e], &hq[e], sizeof(T)) == 0) continue;
    const double g = kvsift::to_float(gq[e]), h = kvsift::to_float(hq[e]);
    REQUIRE_MESSAGE(std::fabs(g - h) <= 1.01 * kvsift_test::epsilon_of<T>() * std::fabs(h) + 1e-6, "Q element " << e << ": " << g << " vs " << h);
  }
}

}  // namespace

TEST_CASE("store_kv with RoPE on the device: K rotated and stored, Q rotated in place, as the host does") {
  auto rng = kvsift_test::make_rng(1412);
  for (auto layout : {StoreLayout::kBHSD, StoreLayout::kBSHD, StoreLayout::kPagedNHD, StoreLayout::kPagedHND})
    for (const std::pair<int, int>& dims : {std::pair{64, 64}, {64, 2}, {80, 80}, {96, 96}, {96, 32}, {128, 128}, {128, 32},
                                            {128, 64}, {128, 100}, {256, 256}, {256, 64}, {256, 150}, {48, 16}, {16, 16}})
      for (int trial = 0; trial < 2; ++trial) {
        const int head_dim = dims.first, rotary_dim = dims.second;  // partial where rotary_dim < head_dim
        CAPTURE(head_dim);
        CAPTURE(rotary_dim);
        check_rotary_case<float, float>(rng, layout, head_dim, rotary_dim);
        check_rotary_case<kvsift::bfloat16_t, float>(rng, layout, head_dim, rotary_dim);
        check_rotary_case<kvsift::bfloat16_t, kvsift::bfloat16_t>(rng, layout, head_dim, rotary_dim);
        check_rotary_case<kvsift::fp8_e4m3_t, kvsift::half_t>(rng, layout, head_dim, rotary_dim);
      }
}

TEST_CASE("store_kv with RoPE on the device: the GPU's limit is a named error") {
  float* fnone = nullptr;
  std::vector<float> dummy(1);
  DeviceBuffer<float> buf(dummy);
  std::int32_t* ints = reinterpret_cast<std::int32_t*>(buf.get());  // never read: the call fails before a launch
  auto kv320 = kvsift::make_bshd<float>(buf.get(), buf.get(), 1, 1, 4, 320, ints);
  auto p = kvsift::make_store_kv_params<float>(buf.get(), buf.get(), 1, 1, 320, ints, ints);
  p = kvsift::with_rotary(p, buf.get(), ints, 320, fnone, 0, 320);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  CHECK(kvsift::cuda::store_kv(exec, kv320, p).message() == "store_kv with rotary: head_dim = 320 must be <= 256 on the GPU");
}
