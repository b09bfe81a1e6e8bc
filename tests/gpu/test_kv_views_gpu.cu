// Views read on the device: copy_kv_to_dense's kernel walks every live row through the view's address
// map; the result must equal the host reference and the brute-force encoding, with outputs poisoned.

#include <doctest/doctest.h>

#include <cstring>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/kv_fixtures.hpp"

using kvsift::PageLayout;
using kvsift_test::DeviceBuffer;
using kvsift_test::KVShape;

namespace {

// Rows beyond a sequence's length are not written: the poison must still be there.
std::vector<float> expected_with_poison(const KVShape& s, const std::vector<std::int32_t>& len, int max_tokens, float sign) {
  float poison;
  std::memset(&poison, kvsift_test::kPoisonByte, sizeof poison);
  return kvsift_test::expected_dense(s, len, max_tokens, sign, poison);
}

void check_equal_bits(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
}

template <class MakeView>
void run_copy(const KVShape& s, const std::vector<std::int32_t>& lengths, int max_tokens, MakeView make_view) {
  const std::size_t n = std::size_t(s.batch) * s.heads * max_tokens * s.head_dim;
  DeviceBuffer<float> k_out(n), v_out(n);
  k_out.poison();
  v_out.poison();
  const auto kv = make_view();
  REQUIRE(kvsift::cuda::copy_kv_to_dense(kvsift::cuda::Exec::for_current_device(), kv, max_tokens, k_out.get(), v_out.get()).ok());
  kvsift_test::sync_and_check();
  check_equal_bits(k_out.download(), expected_with_poison(s, lengths, max_tokens, 1.f));
  check_equal_bits(v_out.download(), expected_with_poison(s, lengths, max_tokens, -1.f));
}

}  // namespace

TEST_CASE("ContiguousKV read on the device matches brute force") {
  auto rng = kvsift_test::make_rng(20);
  for (int trial = 0; trial < 10; ++trial)
    for (auto layout : {kvsift_test::ContiguousLayout::kBHSD, kvsift_test::ContiguousLayout::kBSHD,
                        kvsift_test::ContiguousLayout::kPadded}) {
      // Every third trial: rows longer than a warp's register segment (256, core/warp_rows.cuh).
      const int max_dim = trial % 3 == 2 ? 600 : 130;
      const KVShape s{kvsift_test::uniform_int(rng, 1, 4), kvsift_test::uniform_int(rng, 1, 8),
                      kvsift_test::uniform_int(rng, 1, 130), kvsift_test::uniform_int(rng, 1, max_dim)};
      kvsift_test::ContiguousFixture f(rng, s, layout);
      DeviceBuffer<float> k(f.k), v(f.v);
      DeviceBuffer<std::int32_t> len(f.lengths);
      const int max_tokens = kvsift_test::uniform_int(rng, 1, s.capacity);
      run_copy(s, f.lengths, max_tokens, [&] { return f.view(k.get(), v.get(), len.get()); });
    }
}

TEST_CASE("PagedKV read on the device matches brute force for random page tables") {
  auto rng = kvsift_test::make_rng(21);
  for (int trial = 0; trial < 6; ++trial)
    for (auto layout : {PageLayout::kNHD, PageLayout::kHND})
      for (int page_size : {1, 16, 64}) {
        const KVShape s{kvsift_test::uniform_int(rng, 1, 4), kvsift_test::uniform_int(rng, 1, 8),
                        kvsift_test::uniform_int(rng, 1, 200), kvsift_test::uniform_int(rng, 1, 130)};
        kvsift_test::PagedFixture f(rng, s, page_size, layout, trial % 2 ? 5 : 0);
        DeviceBuffer<float> k(f.k), v(f.v);
        DeviceBuffer<std::int32_t> table(f.block_table), len(f.lengths);
        run_copy(f.shape, f.lengths, f.shape.capacity,
                 [&] { return f.view(k.get(), v.get(), table.get(), len.get()); });
      }
}

TEST_CASE("16-bit views on the device copy the exact bits the host reference copies") {
  auto rng = kvsift_test::make_rng(22);
  const int B = 2, H = 4, S = 100, D = 128;
  auto kh = kvsift_test::random_values<__nv_bfloat16>(rng, std::size_t(B) * H * S * D);
  auto vh = kvsift_test::random_values<__nv_bfloat16>(rng, kh.size());
  std::vector<std::int32_t> lh = {100, 37};
  DeviceBuffer<__nv_bfloat16> k(kh), v(vh), k_out(kh.size()), v_out(kh.size());
  DeviceBuffer<std::int32_t> len(lh);
  k_out.poison();
  v_out.poison();
  const auto dkv = kvsift::make_bshd(k.get(), v.get(), B, H, S, D, len.get());
  REQUIRE(kvsift::cuda::copy_kv_to_dense(kvsift::cuda::Exec::for_current_device(), dkv, S, k_out.get(), v_out.get()).ok());
  kvsift_test::sync_and_check();

  std::vector<__nv_bfloat16> k_ref(kh.size()), v_ref(kh.size());
  std::memset(static_cast<void*>(k_ref.data()), kvsift_test::kPoisonByte, k_ref.size() * 2);
  std::memset(static_cast<void*>(v_ref.data()), kvsift_test::kPoisonByte, v_ref.size() * 2);
  const auto hkv = kvsift::make_bshd(kh.data(), vh.data(), B, H, S, D, lh.data());
  REQUIRE(kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, hkv, S, k_ref.data(), v_ref.data()).ok());
  const auto kd = k_out.download(), vd = v_out.download();
  CHECK(std::memcmp(kd.data(), k_ref.data(), kd.size() * 2) == 0);
  CHECK(std::memcmp(vd.data(), v_ref.data(), vd.size() * 2) == 0);
}

TEST_CASE("the CUDA launcher validates before launching") {
  std::int32_t* no_lengths = nullptr;
  const auto kv = kvsift::make_bhsd<float>(reinterpret_cast<float*>(16), reinterpret_cast<float*>(16), 1, 1, 4, 8, no_lengths);
  DeviceBuffer<float> out(32);
  const auto st = kvsift::cuda::copy_kv_to_dense(kvsift::cuda::Exec::for_current_device(), kv, 4, out.get(), out.get());
  CHECK(st.code() == kvsift::StatusCode::kNullPointer);
  CHECK(st.message() == "kv.lengths is null");
}
