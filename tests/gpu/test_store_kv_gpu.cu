// store_kv on the device against the host reference, byte for byte: K/V rows and per-token scales of
// every layout, KV dtype and input dtype, with the cache and scales poisoned so that an element the
// kernel should not write (rows outside the view, other tokens) is caught too.

#include <doctest/doctest.h>

#include <cstring>
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
  DeviceBuffer<std::int32_t> dseq(c.seq), dpos(c.pos), dlen(c.lengths), dtable(c.table);
  std::vector<std::int32_t> lengths(c.lengths);
  const auto hp = kvsift::make_store_kv_params(kin.data(), vin.data(), c.n, c.heads, c.head_dim, c.seq.data(), c.pos.data());
  const auto dp = kvsift::make_store_kv_params(dkin.get(), dvin.get(), c.n, c.heads, c.head_dim, dseq.get(), dpos.get());
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
