// Host-only consumer: the host reference through kvsift.hpp, no CUDA needed.
#include <kvsift/kvsift.hpp>
#include <kvsift/version.hpp>  // found in the fetched source tree and in the installed tree alike

#include <cstdio>
#include <vector>

int main() {
  const int B = 1, H = 2, S = 4, D = 8;
  std::vector<float> k(B * H * S * D), v(k.size()), k_out(k.size(), 0.f), v_out(k.size(), 0.f);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = float(i);
  std::vector<std::int32_t> len = {S};
  const auto kv = kvsift::make_bshd(k.data(), v.data(), B, H, S, D, len.data());
  const kvsift::Status st = kvsift::host::copy_kv_to_dense(kvsift::host::Exec{}, kv, S, k_out.data(), v_out.data());
  if (!st.ok()) {
    std::printf("engine_cpu: %s\n", st.to_string().c_str());
    return 1;
  }
  // BSHD -> BHSD: token 1 of head 1 sits at (1 * H + 1) * D in the source.
  const bool ok = k_out[(1 * S + 1) * D] == k[(1 * H + 1) * D];
  std::printf("engine_cpu: kvsift %s %s\n", KVSIFT_VERSION_STRING, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
