// HardKuma gates on the GPU against the host reference. Both backends run the same KVSIFT_HD code,
// so integer and exactly-rounded results (Philox bits, uniforms, mixing, roles) must match bitwise,
// and results through libm (log, exp, lgamma, ...) to a few ulps. Outputs are poisoned (NaN) before
// every launch, so an element a kernel did not write fails the comparison. Last, the one op shape:
// every workspace query reports 0 on cuda::Exec too, and the ops need no device facts.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

using namespace kvsift;
using kvsift_test::DeviceBuffer;
using kvsift_test::sync_and_check;

namespace {

kvsift::host::Exec cpu;
kvsift::cuda::Exec gpu;

template <class T>
constexpr double rel_tol() {
  return sizeof(T) == 4 ? 2e-6 : 1e-12;
}

// |got - want| <= rel * |want| + abs, element by element; NaN never passes.
template <class T>
void check_all_close(const std::vector<T>& got, const std::vector<T>& want, double rel, double abs_tol, const char* what) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    if (!(std::fabs(g - w) <= rel * std::fabs(w) + abs_tol)) {
      if (++bad <= 5) FAIL_CHECK(std::string(what), "[", i, "]: gpu ", g, " host ", w);
    }
  }
  CHECK_MESSAGE(bad == 0, std::string(what), ": ", bad, " of ", got.size(), " elements differ");
}

template <class T>
void check_all_equal(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  check_all_close(got, want, 0.0, 0.0, what);
}

// Gate shapes log-uniform in [lo, hi].
template <class T>
std::vector<T> random_shapes(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(std::log(lo), std::log(hi));
  std::vector<T> v(n);
  for (auto& x : v) x = T(std::exp(d(rng)));
  return v;
}

__global__ void philox_kernel(const PhiloxBlock* counters, const PhiloxKey* keys, PhiloxBlock* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = philox4x32_10(counters[i], keys[i]);
}

__global__ void uniforms_kernel(PhiloxStream s, float* f, double* d, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    f[i] = philox_uniform<float>(s, std::uint64_t(i));
    d[i] = philox_uniform<double>(s, std::uint64_t(i));
  }
}

}  // namespace

TEST_CASE("philox4x32-10 on the device: Random123 known answers and the host's bits for random inputs") {
  auto rng = kvsift_test::make_rng(101);
  const int n = 4096;
  std::vector<PhiloxBlock> counters(n), want(n);
  std::vector<PhiloxKey> keys(n);
  for (int i = 0; i < n; ++i) {
    for (auto& w : counters[i].w) w = std::uint32_t(rng());
    for (auto& w : keys[i].w) w = std::uint32_t(rng());
  }
  counters[0] = PhiloxBlock{{0, 0, 0, 0}};
  keys[0] = PhiloxKey{{0, 0}};
  counters[1] = PhiloxBlock{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  keys[1] = PhiloxKey{{0xa4093822u, 0x299f31d0u}};
  for (int i = 0; i < n; ++i) want[i] = philox4x32_10(counters[i], keys[i]);
  DeviceBuffer<PhiloxBlock> d_counters(counters), d_out(n);
  DeviceBuffer<PhiloxKey> d_keys(keys);
  d_out.poison();
  philox_kernel<<<(n + 255) / 256, 256>>>(d_counters.get(), d_keys.get(), d_out.get(), n);
  sync_and_check();
  const std::vector<PhiloxBlock> got = d_out.download();
  CHECK(got[0].w[0] == 0x6627e8d5u);
  CHECK(got[0].w[3] == 0x9b00dbd8u);
  CHECK(got[1].w[0] == 0xd16cfe09u);
  CHECK(got[1].w[3] == 0x24126ea1u);
  int mismatches = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < 4; ++j) mismatches += got[i].w[j] != want[i].w[j];
  CHECK(mismatches == 0);

  const PhiloxStream stream{0x0123456789abcdefull, 0xfedcba9876543210ull};
  DeviceBuffer<float> f(n);
  DeviceBuffer<double> d(n);
  f.poison();
  d.poison();
  uniforms_kernel<<<(n + 255) / 256, 256>>>(stream, f.get(), d.get(), n);
  sync_and_check();
  std::vector<float> fw(n);
  std::vector<double> dw(n);
  for (int i = 0; i < n; ++i) {
    fw[i] = philox_uniform<float>(stream, std::uint64_t(i));
    dw[i] = philox_uniform<double>(stream, std::uint64_t(i));
  }
  check_all_equal(f.download(), fw, "float uniforms");
  check_all_equal(d.download(), dw, "double uniforms");
}

TEST_CASE_TEMPLATE("hardkuma_sample: same uniforms bitwise, same gates to a few ulps, as the host", T, float, double) {
  auto rng = kvsift_test::make_rng(102);
  const int n = 36 * 8 * 5 + 3;  // several gate vectors, not a multiple of the block
  const std::vector<T> a = random_shapes<T>(rng, n, 0.2, 5.0), b = random_shapes<T>(rng, n, 0.2, 5.0);
  DeviceBuffer<T> da(a), db(b), dh(n), dk(n), du(n);
  const HardKumaOptions o;
  for (std::uint64_t offset : {0ull, 1ull, 123456789ull}) {
    const PhiloxStream stream{777, offset};
    dh.poison();
    dk.poison();
    du.poison();
    REQUIRE(kvsift::cuda::hardkuma_sample(gpu, o, da.get(), db.get(), n, stream, dh.get(), dk.get(), du.get()).ok());
    sync_and_check();
    std::vector<T> h(n), k(n), u(n);
    REQUIRE(kvsift::host::hardkuma_sample(cpu, o, a.data(), b.data(), n, stream, h.data(), k.data(), u.data()).ok());
    check_all_equal(du.download(), u, "u");
    check_all_close(dk.download(), k, 8 * rel_tol<T>(), 0.0, "k");
    check_all_close(dh.download(), h, 8 * rel_tol<T>(), 1e-7, "h");
  }
}

TEST_CASE("hardkuma_sample at extreme shapes and invalid input: no unwritten outputs, NaN for invalid gates") {
  std::vector<float> a = {1e-6f, 100.f, 1e-6f, 100.f, 0.5f, -1.f, 1.f}, b = {1e-6f, 100.f, 100.f, 1e-6f, 0.5f, 1.f, NAN};
  const int n = int(a.size());
  DeviceBuffer<float> da(a), db(b), dh(n);
  dh.poison();
  REQUIRE(kvsift::cuda::hardkuma_sample(gpu, HardKumaOptions{}, da.get(), db.get(), n, PhiloxStream{5, 5}, dh.get()).ok());
  sync_and_check();
  std::vector<float> h = dh.download();
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    CHECK(h[i] >= 0.f);  // clamped shapes (a = -1 included) give valid gates
    CHECK(h[i] <= 1.f);
  }
  CHECK(std::isnan(h[6]));  // b = NaN propagates

  HardKumaOptions strict;
  strict.clamp_shape = false;
  dh.poison();
  std::vector<float> ok_b = b;
  ok_b[6] = 1.f;
  db.upload(ok_b);
  REQUIRE(kvsift::cuda::hardkuma_sample(gpu, strict, da.get(), db.get(), n, PhiloxStream{5, 5}, dh.get()).ok());
  sync_and_check();
  h = dh.download();
  CHECK(std::isnan(h[5]));  // a = -1 without the clamp: NaN, the documented device behaviour
  CHECK(h[6] >= 0.f);

  // Launch-time validation still names the parameter.
  HardKumaOptions bad;
  bad.l = 0.5;
  const Status s = kvsift::cuda::hardkuma_sample(gpu, bad, da.get(), db.get(), n, PhiloxStream{}, dh.get());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("options.l") != std::string::npos);
}

TEST_CASE_TEMPLATE("hardkuma_stats: every output matches the host", T, float, double) {
  auto rng = kvsift_test::make_rng(103);
  const int n = 1000;
  std::vector<T> a = random_shapes<T>(rng, n, 1e-3, 50.0), b = random_shapes<T>(rng, n, 1e-3, 50.0);
  a[0] = T(1);  // the first row of docs/algorithms/hardkuma.md §11.2
  b[0] = T(1);
  a[1] = T(200);  // clamped
  b[2] = T(-1);   // clamped
  DeviceBuffer<T> da(a), db(b);
  std::vector<DeviceBuffer<T>> d_out;
  d_out.reserve(8);
  for (int j = 0; j < 8; ++j) {
    d_out.emplace_back(n);
    d_out.back().poison();
  }
  GateStatsOutputs<T> dev;
  dev.prob_zero = d_out[0].get();
  dev.prob_one = d_out[1].get();
  dev.prob_interior = d_out[2].get();
  dev.expected_l0 = d_out[3].get();
  dev.kuma_mean = d_out[4].get();
  dev.mean = d_out[5].get();
  dev.d_prob_zero_da = d_out[6].get();
  dev.d_prob_zero_db = d_out[7].get();
  REQUIRE(kvsift::cuda::hardkuma_stats(gpu, HardKumaOptions{}, da.get(), db.get(), n, dev).ok());
  sync_and_check();
  std::vector<std::vector<T>> want(8, std::vector<T>(n));
  GateStatsOutputs<T> ref;
  ref.prob_zero = want[0].data();
  ref.prob_one = want[1].data();
  ref.prob_interior = want[2].data();
  ref.expected_l0 = want[3].data();
  ref.kuma_mean = want[4].data();
  ref.mean = want[5].data();
  ref.d_prob_zero_da = want[6].data();
  ref.d_prob_zero_db = want[7].data();
  REQUIRE(kvsift::host::hardkuma_stats(cpu, HardKumaOptions{}, a.data(), b.data(), n, ref).ok());
  const char* names[8] = {"P(h=0)", "P(h=1)", "P(0<h<1)", "P(h!=0)", "E[K]", "E[h]", "dP0/da", "dP0/db"};
  // Probabilities are at most 1: an absolute floor of a few float ulps of 1 covers the ones near 0.
  const double abs_floor = sizeof(T) == 4 ? 1e-7 : 1e-15;
  for (int j = 0; j < 6; ++j) check_all_close(d_out[j].download(), want[j], 8 * rel_tol<T>(), abs_floor, names[j]);
  // The gradients are exp((b - 1) log(1 - c0^a)) times logs: a rounding error e in the exponent's
  // inputs becomes a relative error of about |(b - 1) log(1 - c0^a)| * e in the result, which the
  // two backends' libm (a few ulps apart) do not share. Scale the tolerance by that condition number.
  const double log_c0 = std::log(0.1 / 1.2);
  for (int j = 6; j < 8; ++j) {
    const auto got = d_out[j].download();
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      const double aa = std::min(std::max(double(a[i]), 1e-6), 100.0), bb = std::min(std::max(double(b[i]), 1e-6), 100.0);
      const double log_s0 = std::log(-std::expm1(aa * log_c0));
      const double cond = 1.0 + std::fabs((bb - 1.0) * log_s0) + std::fabs(aa * log_c0);
      const double w = double(want[j][i]), g = double(got[i]);
      if (!(std::fabs(g - w) <= 8 * rel_tol<T>() * cond * std::fabs(w) + abs_floor) && ++bad <= 5)
        FAIL_CHECK(names[j], "[", i, "]: gpu ", g, " host ", w, " (a ", aa, ", b ", bb, ", condition ", cond, ")");
    }
    CHECK_MESSAGE(bad == 0, names[j], ": ", bad, " of ", n, " elements differ");
  }
}

TEST_CASE_TEMPLATE("hardkuma_sample_backward and hardkuma_expected_l0 match the host", T, float, double) {
  auto rng = kvsift_test::make_rng(104);
  const int n = 288;  // Qwen3-8B: 36 layers x 8 KV heads
  const std::vector<T> a = random_shapes<T>(rng, n, 0.1, 10.0), b = random_shapes<T>(rng, n, 0.1, 10.0);
  std::vector<T> grad_h(n);
  for (auto& g : grad_h) g = T(std::uniform_real_distribution<double>(-1, 1)(rng));
  const PhiloxStream stream{2026, 41};
  const HardKumaOptions o;
  DeviceBuffer<T> da(a), db(b), dgh(grad_h), dga(n), dgb(n);
  dga.poison();
  dgb.poison();
  REQUIRE(kvsift::cuda::hardkuma_sample_backward(gpu, o, da.get(), db.get(), n, stream, dgh.get(), dga.get(), dgb.get()).ok());
  sync_and_check();
  std::vector<T> ga(n), gb(n);
  REQUIRE(kvsift::host::hardkuma_sample_backward(cpu, o, a.data(), b.data(), n, stream, grad_h.data(), ga.data(), gb.data()).ok());
  check_all_close(dga.download(), ga, 32 * rel_tol<T>(), sizeof(T) == 4 ? 1e-6 : 1e-13, "dL/da");
  check_all_close(dgb.download(), gb, 32 * rel_tol<T>(), sizeof(T) == 4 ? 1e-6 : 1e-13, "dL/db");

  // Expected L0 with a device-side scale, accumulated onto the sample gradient.
  const T scale = T(1.75);
  DeviceBuffer<T> dscale(std::vector<T>{scale}), dsum(1), ddensity(1);
  dsum.poison();
  ddensity.poison();
  ExpectedL0Outputs<T> dev;
  dev.sum = dsum.get();
  dev.density = ddensity.get();
  dev.grad_a = dga.get();
  dev.grad_b = dgb.get();
  dev.grad_scale = dscale.get();
  dev.write = GradientWrite::kAccumulate;
  REQUIRE(kvsift::cuda::hardkuma_expected_l0(gpu, o, da.get(), db.get(), n, dev).ok());
  sync_and_check();
  T sum = 0, density = 0;
  ExpectedL0Outputs<T> ref = dev;
  ref.sum = &sum;
  ref.density = &density;
  ref.grad_a = ga.data();
  ref.grad_b = gb.data();
  ref.grad_scale = &scale;
  REQUIRE(kvsift::host::hardkuma_expected_l0(cpu, o, a.data(), b.data(), n, ref).ok());
  check_all_close(dsum.download(), std::vector<T>{sum}, rel_tol<T>(), 0.0, "sum");
  check_all_close(ddensity.download(), std::vector<T>{density}, rel_tol<T>(), 0.0, "density");
  check_all_close(dga.download(), ga, 32 * rel_tol<T>(), sizeof(T) == 4 ? 1e-6 : 1e-13, "dL/da + penalty");
  check_all_close(dgb.download(), gb, 32 * rel_tol<T>(), sizeof(T) == 4 ? 1e-6 : 1e-13, "dL/db + penalty");
}

TEST_CASE("a captured CUDA graph replays the same draw; a new offset in a new launch draws a new one") {
  const int n = 256;
  auto rng = kvsift_test::make_rng(105);
  const std::vector<float> a = random_shapes<float>(rng, n, 0.3, 3.0), b = random_shapes<float>(rng, n, 0.3, 3.0);
  DeviceBuffer<float> da(a), db(b), dh(n), du(n);
  cudaStream_t stream;
  KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  REQUIRE(kvsift::cuda::hardkuma_sample(kvsift::cuda::Exec::for_current_device(stream), HardKumaOptions{}, da.get(), db.get(), n, PhiloxStream{8, 3},
                                dh.get(), nullptr, du.get())
              .ok());
  KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  KVSIFT_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> h(n), u(n);
  REQUIRE(kvsift::host::hardkuma_sample(cpu, HardKumaOptions{}, a.data(), b.data(), n, PhiloxStream{8, 3}, h.data(), nullptr,
                                u.data())
              .ok());
  for (int replay = 0; replay < 2; ++replay) {
    du.poison();
    dh.poison();
    KVSIFT_TEST_CUDA(cudaGraphLaunch(exec, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    check_all_equal(du.download(), u, "u after replay");
    check_all_close(dh.download(), h, 16 * rel_tol<float>(), 1e-7, "h after replay");
  }
  KVSIFT_TEST_CUDA(cudaGraphExecDestroy(exec));
  KVSIFT_TEST_CUDA(cudaGraphDestroy(graph));
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE_TEMPLATE("gate mixing forward and backward match the host", T, float, half_t, bfloat16_t) {
  GateMixShape shape;
  shape.tokens = 37;
  shape.q_heads = 32;
  shape.kv_heads = 8;
  shape.head_dim = 128;
  shape.token_stride = 32 * 128 + 64;  // padded rows
  const std::size_t size = std::size_t(shape.tokens) * shape.token_stride;
  auto rng = kvsift_test::make_rng(106);
  const std::vector<T> dense = kvsift_test::random_values<T>(rng, size), sparse = kvsift_test::random_values<T>(rng, size);
  const std::vector<T> grad_o = kvsift_test::random_values<T>(rng, size);
  std::vector<float> z(8);
  for (auto& x : z) x = std::uniform_real_distribution<float>(0, 1)(rng);
  z[0] = 0.f;
  z[1] = 1.f;
  DeviceBuffer<T> d_dense(dense), d_sparse(sparse), d_grad_o(grad_o), d_o(size), d_gd(size), d_gs(size);
  DeviceBuffer<float> d_z(z), d_gz(8);
  // Host outputs start as copies of the poisoned device buffers, so padding compares equal too.
  d_o.poison();
  d_gd.poison();
  d_gs.poison();
  d_gz.poison();
  std::vector<T> o = d_o.download(), gd = d_gd.download(), gs = d_gs.download();
  std::vector<float> gz(8);
  REQUIRE(kvsift::cuda::gate_mix_forward(gpu, shape, d_z.get(), d_dense.get(), d_sparse.get(), d_o.get()).ok());
  REQUIRE(kvsift::cuda::gate_mix_backward(gpu, shape, d_z.get(), d_dense.get(), d_sparse.get(), d_grad_o.get(), d_gd.get(),
                                  d_gs.get(), d_gz.get())
              .ok());
  sync_and_check();
  REQUIRE(kvsift::host::gate_mix_forward(cpu, shape, z.data(), dense.data(), sparse.data(), o.data()).ok());
  REQUIRE(kvsift::host::gate_mix_backward(cpu, shape, z.data(), dense.data(), sparse.data(), grad_o.data(), gd.data(), gs.data(),
                                  gz.data())
              .ok());
  auto same_bits = [&](const std::vector<T>& got, const std::vector<T>& want, const char* what) {
    int bad = 0;
    for (std::size_t i = 0; i < size; ++i) {
      const bool pad = std::int64_t(i % std::size_t(shape.token_stride)) >= std::int64_t(32) * 128;
      bool equal;
      if constexpr (std::is_same<T, float>::value)
        equal = std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
      else
        equal = got[i].bits == want[i].bits;
      if (!equal && ++bad <= 5) FAIL_CHECK(what, "[", i, "] differs", pad ? " (padding)" : "");
    }
    CHECK_MESSAGE(bad == 0, what, ": ", bad, " elements differ");
  };
  same_bits(d_o.download(), o, "O");
  same_bits(d_gd.download(), gd, "dL/dO_dense");
  same_bits(d_gs.download(), gs, "dL/dO_sparse");
  check_all_close(d_gz.download(), gz, 1e-6, 1e-6, "dL/dz");
}

TEST_CASE("Lagrangian update on the device matches the host step for step") {
  for (const LagrangianConfig& config : {LagrangianConfig::lycheedecode(0.0833), LagrangianConfig::bastings(0.3)}) {
    LagrangianState host_state = lagrangian_initial_state(config);
    DeviceBuffer<LagrangianState> d_state(std::vector<LagrangianState>{host_state});
    DeviceBuffer<float> d_density(1), d_scale(1);
    DeviceBuffer<LagrangianStep> d_step(1);
    const float densities[] = {0.9f, 0.5f, 0.2f, 0.08f, 0.05f, 0.4f};
    for (float rho : densities) {
      d_density.upload(std::vector<float>{rho});
      d_scale.poison();
      REQUIRE(kvsift::cuda::lagrangian_update(gpu, config, d_state.get(), d_density.get(), d_scale.get(), d_step.get()).ok());
      sync_and_check();
      float scale = 0;
      LagrangianStep want;
      REQUIRE(kvsift::host::lagrangian_update(cpu, config, &host_state, &rho, &scale, &want).ok());
      const LagrangianStep got = d_step.download()[0];
      const LagrangianState got_state = d_state.download()[0];
      CHECK(got.c_hat == want.c_hat);
      CHECK(got.c == doctest::Approx(want.c).epsilon(1e-14));
      CHECK(got.lambda == doctest::Approx(want.lambda).epsilon(1e-14));
      CHECK(got_state.lambda == doctest::Approx(host_state.lambda).epsilon(1e-14));
      CHECK(got_state.steps == host_state.steps);
      CHECK(d_scale.download()[0] == doctest::Approx(scale).epsilon(1e-6));
    }
  }
}

TEST_CASE_TEMPLATE("AdamW step on the device matches the host", T, float, double) {
  auto rng = kvsift_test::make_rng(107);
  const int n = 5000;
  std::vector<T> p(n), m(n, T(0)), v(n, T(0));
  for (auto& x : p) x = T(std::uniform_real_distribution<double>(0.5, 2)(rng));
  DeviceBuffer<T> dp(p), dm(m), dv(v), dg(n);
  AdamWConfig config;
  config.weight_decay = 0.01;
  for (int step = 0; step < 5; ++step) {
    std::vector<T> g(n);
    for (auto& x : g) x = T(std::uniform_real_distribution<double>(-1, 1)(rng));
    dg.upload(g);
    const double lr = config.lr * warmup_decay_lr_factor(step, 100);
    REQUIRE(kvsift::cuda::adamw_step(gpu, config, lr, step, dp.get(), dg.get(), dm.get(), dv.get(), n).ok());
    REQUIRE(kvsift::host::adamw_step(cpu, config, lr, step, p.data(), g.data(), m.data(), v.data(), n).ok());
  }
  sync_and_check();
  // Same fma-explicit arithmetic and IEEE sqrt/division on both sides: equal up to an ulp.
  const double tol = sizeof(T) == 4 ? 3e-7 : 1e-15;
  check_all_close(dp.download(), p, tol, 0.0, "params");
  check_all_close(dm.download(), m, tol, 0.0, "exp_avg");
  check_all_close(dv.download(), v, tol, 0.0, "exp_avg_sq");
}

TEST_CASE("head-role extraction on the device gives the host's roles, threshold and top-N") {
  auto rng = kvsift_test::make_rng(108);
  const int layers = 36, kv_heads = 8, n = layers * kv_heads;
  const std::vector<float> a = random_shapes<float>(rng, n, 0.05, 20.0), b = random_shapes<float>(rng, n, 0.05, 20.0);
  DeviceBuffer<float> da(a), db(b), dscores(n);
  DeviceBuffer<std::uint8_t> droles(n);
  for (RoleSelection sel : {RoleSelection::kThreshold, RoleSelection::kTopN}) {
    RoleExtractionOptions o;
    o.selection = sel;
    o.total_retrieval_heads = 32;
    droles.poison();
    dscores.poison();
    REQUIRE(kvsift::cuda::extract_head_roles(gpu, o, da.get(), db.get(), layers, kv_heads, droles.get(), dscores.get()).ok());
    sync_and_check();
    std::vector<std::uint8_t> roles(n);
    std::vector<float> scores(n);
    REQUIRE(kvsift::host::extract_head_roles(cpu, o, a.data(), b.data(), layers, kv_heads, roles.data(), scores.data()).ok());
    CHECK(droles.download() == roles);
    check_all_close(dscores.download(), scores, 1e-6, 0.0, "E[K]");
    if (sel == RoleSelection::kTopN) {
      int count = 0;
      for (auto r : roles) count += r;
      CHECK(count == 32);
    }
  }
}

// ---------------------------------------------------------------- the op shape

namespace {

// Every gate op on the device, on the same inputs each time (36 layers x 8 KV heads of gates, a small
// mixing shape); outputs are poisoned first and downloaded as bytes for a bitwise comparison.
struct DeviceGateOps {
  static constexpr int layers = 36, kv_heads = 8, n = layers * kv_heads;
  static constexpr std::size_t mix_size = 5 * 8 * 16;
  DeviceBuffer<double> a, b, grad_h, h, k, u, ga, gb, p, m, v, scores, sum, density;
  DeviceBuffer<std::uint8_t> roles;
  DeviceBuffer<float> z, dense, sparse, grad_o, mixed, gd, gs, gz, f_density, grad_scale;
  DeviceBuffer<LagrangianState> lag_state;
  DeviceBuffer<LagrangianStep> lag_step;
  GateMixShape shape;
  LagrangianConfig lag = LagrangianConfig::lycheedecode(0.1);

  static std::vector<double> ramp(double first, double step) {
    std::vector<double> x(n);
    for (int i = 0; i < n; ++i) x[std::size_t(i)] = first + step * (i % 29);
    return x;
  }
  static std::vector<float> wave(float scale) {
    std::vector<float> x(mix_size);
    for (std::size_t i = 0; i < mix_size; ++i) x[i] = scale * float(int(i % 13) - 6);
    return x;
  }

  DeviceGateOps()
      : a(ramp(0.2, 0.3)), b(ramp(4.0, -0.13)), grad_h(ramp(-0.5, 0.04)), h(n), k(n), u(n), ga(n), gb(n),
        p(ramp(1.0, 0.01)), m(std::vector<double>(n, 0.0)), v(std::vector<double>(n, 0.0)), scores(n), sum(1),
        density(1), roles(n), z(std::vector<float>{0.25f, 0.75f}), dense(wave(0.5f)), sparse(wave(-0.25f)),
        grad_o(wave(0.125f)), mixed(mix_size), gd(mix_size), gs(mix_size), gz(2),
        f_density(std::vector<float>{0.3f}), grad_scale(1),
        lag_state(std::vector<LagrangianState>{lagrangian_initial_state(LagrangianConfig::lycheedecode(0.1))}),
        lag_step(1) {
    shape.tokens = 5;
    shape.q_heads = 8;
    shape.kv_heads = 2;
    shape.head_dim = 16;
    for (DeviceBuffer<double>* d : {&h, &k, &u, &ga, &gb, &scores, &sum, &density}) d->poison();
    for (DeviceBuffer<float>* d : {&mixed, &gd, &gs, &gz, &grad_scale}) d->poison();
    roles.poison();
  }

  GateStatsOutputs<double> stats() const {
    GateStatsOutputs<double> out;
    out.prob_zero = h.get();
    out.expected_l0 = k.get();
    return out;
  }
  ExpectedL0Outputs<double> l0() const {
    ExpectedL0Outputs<double> out;
    out.sum = sum.get();
    out.density = density.get();
    out.grad_a = ga.get();
    out.grad_b = gb.get();
    out.write = GradientWrite::kAccumulate;
    return out;
  }

  // Each query's reported size, in op order; -1 where a query failed.
  std::vector<long long> query_all(const kvsift::cuda::Exec& exec) const {
    const HardKumaOptions o;
    const PhiloxStream draw{3, 4};
    std::vector<long long> sizes;
    auto ask = [&](auto query) {
      std::size_t bytes = 12345;  // a query that does not write it fails the check
      const Status s = query(&bytes);
      sizes.push_back(s.ok() ? (long long)bytes : -1);
    };
    ask([&](std::size_t* bytes) { return hardkuma_stats_workspace_bytes(exec, o, a.get(), b.get(), n, stats(), bytes); });
    ask([&](std::size_t* bytes) {
      return hardkuma_sample_workspace_bytes(exec, o, a.get(), b.get(), n, draw, h.get(), k.get(), u.get(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return hardkuma_sample_backward_workspace_bytes(exec, o, a.get(), b.get(), n, draw, grad_h.get(), ga.get(),
                                                      gb.get(), GradientWrite::kOverwrite, bytes);
    });
    ask([&](std::size_t* bytes) { return hardkuma_expected_l0_workspace_bytes(exec, o, a.get(), b.get(), n, l0(), bytes); });
    ask([&](std::size_t* bytes) {
      return gate_mix_forward_workspace_bytes(exec, shape, z.get(), dense.get(), sparse.get(), mixed.get(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return gate_mix_backward_workspace_bytes(exec, shape, z.get(), dense.get(), sparse.get(), grad_o.get(), gd.get(),
                                               gs.get(), gz.get(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return adamw_step_workspace_bytes(exec, AdamWConfig{}, 0.01, 0, p.get(), ga.get(), m.get(), v.get(), n, bytes);
    });
    ask([&](std::size_t* bytes) {
      return lagrangian_update_workspace_bytes(exec, lag, lag_state.get(), f_density.get(), grad_scale.get(),
                                               lag_step.get(), bytes);
    });
    ask([&](std::size_t* bytes) {
      return extract_head_roles_workspace_bytes(exec, RoleExtractionOptions{}, a.get(), b.get(), layers, kv_heads,
                                                roles.get(), scores.get(), bytes);
    });
    return sizes;
  }

  // Every op in a training step's order, then a sync; the first failing op's Status, or ok.
  Status run_all(const kvsift::cuda::Exec& exec, Workspace workspace = {}) {
    const HardKumaOptions o;
    const PhiloxStream draw{3, 4};
    RoleExtractionOptions ro;
    ro.selection = RoleSelection::kTopN;
    ro.total_retrieval_heads = 32;
    KVSIFT_TRY(kvsift::cuda::hardkuma_stats(exec, o, a.get(), b.get(), n, stats(), workspace));
    KVSIFT_TRY(kvsift::cuda::hardkuma_sample(exec, o, a.get(), b.get(), n, draw, h.get(), k.get(), u.get(), workspace));
    KVSIFT_TRY(kvsift::cuda::hardkuma_sample_backward(exec, o, a.get(), b.get(), n, draw, grad_h.get(), ga.get(),
                                                      gb.get(), GradientWrite::kOverwrite, workspace));
    KVSIFT_TRY(kvsift::cuda::gate_mix_forward(exec, shape, z.get(), dense.get(), sparse.get(), mixed.get(), workspace));
    KVSIFT_TRY(kvsift::cuda::gate_mix_backward(exec, shape, z.get(), dense.get(), sparse.get(), grad_o.get(), gd.get(),
                                               gs.get(), gz.get(), workspace));
    KVSIFT_TRY(kvsift::cuda::lagrangian_update(exec, lag, lag_state.get(), f_density.get(), grad_scale.get(),
                                               lag_step.get(), workspace));
    ExpectedL0Outputs<double> penalty = l0();
    KVSIFT_TRY(kvsift::cuda::hardkuma_expected_l0(exec, o, a.get(), b.get(), n, penalty, workspace));
    KVSIFT_TRY(kvsift::cuda::adamw_step(exec, AdamWConfig{}, 0.01, 0, p.get(), ga.get(), m.get(), v.get(), n, workspace));
    KVSIFT_TRY(kvsift::cuda::extract_head_roles(exec, ro, p.get(), b.get(), layers, kv_heads, roles.get(), scores.get(),
                                                workspace));
    sync_and_check();
    return Status();
  }

  // Every output, as bytes.
  std::vector<std::vector<unsigned char>> results() const {
    std::vector<std::vector<unsigned char>> r;
    auto add = [&r](const auto& buffer) {
      const auto host = buffer.download();
      const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
      r.emplace_back(bytes, bytes + host.size() * sizeof(host[0]));
    };
    for (const DeviceBuffer<double>* d : {&h, &k, &u, &ga, &gb, &p, &m, &v, &scores, &sum, &density}) add(*d);
    for (const DeviceBuffer<float>* d : {&mixed, &gd, &gs, &gz, &grad_scale}) add(*d);
    add(roles);
    add(lag_step);
    return r;
  }
};

}  // namespace

TEST_CASE("every gate op's workspace query reports 0 bytes on cuda::Exec, with or without device facts") {
  DeviceGateOps ops;
  for (const kvsift::cuda::Exec& exec : {kvsift::cuda::Exec{}, kvsift::cuda::Exec::for_current_device()}) {
    const std::vector<long long> sizes = ops.query_all(exec);
    CHECK(sizes.size() == 9);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      CHECK(sizes[i] == 0);
    }
  }
}

TEST_CASE("the gate ops need no device facts: a default cuda::Exec, one from for_current_device on a stream, "
          "and a passed workspace give the same bits") {
  kvsift::cuda::Exec no_facts;
  CHECK(no_facts.device.num_sms == 0);  // nothing filled: the ops must not need it
  cudaStream_t stream;
  KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
  const kvsift::cuda::Exec with_facts = kvsift::cuda::Exec::for_current_device(stream);
  CHECK(with_facts.device.num_sms > 0);
  DeviceBuffer<unsigned char> scratch(1024);  // cudaMalloc: 256-byte aligned

  DeviceGateOps plain, on_stream, with_workspace;
  const Status s_plain = plain.run_all(no_facts);
  CHECK_MESSAGE(s_plain.ok(), s_plain.message());
  const Status s_stream = on_stream.run_all(with_facts);
  CHECK_MESSAGE(s_stream.ok(), s_stream.message());
  const Status s_ws = with_workspace.run_all(with_facts, Workspace{scratch.get(), scratch.size()});
  CHECK_MESSAGE(s_ws.ok(), s_ws.message());
  const auto want = plain.results();
  const auto got_stream = on_stream.results(), got_ws = with_workspace.results();
  REQUIRE(got_stream.size() == want.size());
  REQUIRE(got_ws.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got_stream[i] == want[i]);
    CHECK(got_ws[i] == want[i]);
  }
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
}
