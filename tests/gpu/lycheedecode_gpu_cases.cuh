#pragma once
// Shared harness of the LycheeDecode GPU tests (one .cu per KV dtype keeps each translation unit's
// kernel instantiations few). A case builds a multi-layer model on the host, lays every layer's
// cache out contiguous (BSHD) or paged (NHD, pages scattered by a random permutation), and runs the
// same decode steps through the policy twice: host::Exec on host copies (the reference) and
// cuda::Exec on device copies, with the device outputs poisoned before every layer and the device
// state and workspace poisoned once. After every layer it compares the attention outputs (dtype
// tolerance) and the whole index table (exact).
//
// Why the table can be compared exactly: keys are multiples of 1/4 in [-2, 2], and so is the
// group-mean query (group_mean_queries: each group's queries are its mean plus deviations that sum to
// zero), so every score qbar . k is a multiple of 1/16 below 2^10: exact in fp32 whatever the
// summation order, on tensor cores (which take qbar rounded to bf16 / fp16: exact here) and in the
// host's double. Equal scores are frequent and both backends break ties toward the lower position,
// so the selections are the same sets, not merely close ones. Free quarter-step queries would not do
// for groups of 3, 5, 6 or 7: their mean (a multiple of 1/12, 1/20, ...) is not exact in bf16 / fp16;
// the kernel rounds it and the host does not, and near-equal scores then swap (38 failing cases in
// the GPU fuzz runs of 2026-12-01, every one with such a group).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/policy/lycheedecode.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

namespace lycheedecode_test {

using kvsift::LycheeDecodeConfig;
using kvsift::LycheeDecodePolicy;
using kvsift::LycheeDecodeState;
using kvsift::LycheeDecodeSelection;
using kvsift_test::DeviceBuffer;
using kvsift_test::HostBuffer;
using kvsift_test::roles_from;

template <class T>
std::vector<T> quarter_steps(std::mt19937_64& rng, std::size_t n) {
  std::vector<T> v(n);
  for (auto& x : v) x = kvsift::from_float<T>(float(kvsift_test::uniform_int(rng, -8, 8)) / 4.f);
  return v;
}

// Queries [rows, kv_heads * group, d] whose group means are quarter steps in [-1.5, 1.5]: every pair of
// heads (2j, 2j + 1) of a group gets mean + e and mean - e (e a quarter step in [-1/2, 1/2]), an odd
// group's last head the mean itself, so the queries stay in [-2, 2] and the mean is exact.
template <class T>
std::vector<T> group_mean_queries(std::mt19937_64& rng, int rows, int kv_heads, int group, int d) {
  std::vector<T> v(std::size_t(rows) * kv_heads * group * d);
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < kv_heads; ++h)
      for (int i = 0; i < d; ++i) {
        const float mean = float(kvsift_test::uniform_int(rng, -6, 6)) / 4.f;
        for (int g = 0; g < group; g += 2) {
          const float e = g + 1 < group ? float(kvsift_test::uniform_int(rng, -2, 2)) / 4.f : 0.f;
          const std::size_t at = ((std::size_t(r) * kv_heads + h) * group + g) * d + i;
          v[at] = kvsift::from_float<T>(mean + e);
          if (g + 1 < group) v[at + d] = kvsift::from_float<T>(mean - e);
        }
      }
  return v;
}

template <class T>
struct Tolerance {
  static constexpr double out = 2e-2;  // bf16
};
template <>
struct Tolerance<kvsift::half_t> {
  static constexpr double out = 4e-3;
};

inline bool close(double got, double want, double tol) { return std::abs(got - want) <= tol * (1.0 + std::abs(want)); }

enum class Layout { kBSHD, kPagedNHD };

struct Case {
  std::string roles = "RRRR/RSSS/SSRS/SRSR";
  int group = 4, d = 128, cap = 640;
  Layout layout = Layout::kBSHD;
  int page_size = 16;
  std::vector<std::int32_t> lengths = {640, 37, 0, 251};  // ragged, with an empty slot
  int steps = 3;
  LycheeDecodeSelection selection = LycheeDecodeSelection::kToken;
  int budget = 96, sink = 8, recent = 24;
  double rho = 0.8;
  int block_size = 64, num_blocks = 5, sink_blocks = 1;
  int num_sms = 0;  // > 0: plan for this many SMs instead of the GPU's (other split plans, same GPU)
  bool candidates = false;      // config.score_candidates (read only by rows of 16K-128K positions)
  bool repeat_queries = false;  // every step reuses its layer's step-0 queries: the candidates' list holds

  int layers() const { return int(std::count(roles.begin(), roles.end(), '/')) + 1; }
  int hkv() const { return int(roles.find('/')); }
  std::string describe() const {
    std::string s = std::string(layout == Layout::kBSHD ? "BSHD" : "paged NHD") + " d=" + std::to_string(d) +
                    " mode=" + kvsift::to_string(selection) + " roles=" + roles + " lengths=";
    for (int l : lengths) s += std::to_string(l) + ",";
    return s;
  }
  LycheeDecodeConfig config() const {
    LycheeDecodeConfig c;
    c.num_layers = layers();
    c.num_kv_heads = hkv();
    c.num_q_heads = hkv() * group;
    c.head_dim = d;
    c.roles = roles_from(roles);
    c.max_batch = int(lengths.size());
    c.max_kv_length = cap;
    c.selection = selection;
    c.budget = budget;
    c.sink = sink;
    c.recent = recent;
    c.rho = rho;
    c.block_size = block_size;
    c.num_blocks = num_blocks;
    c.sink_blocks = sink_blocks;
    c.score_candidates = candidates;
    return c;
  }
};

// Every layer's K/V on host and device, in the case's layout; views over either copy.
template <class KT>
struct Caches {
  int B, H, D, S, page_size = 0, max_pages = 0, num_pages = 0;
  Layout layout;
  std::vector<std::vector<KT>> k, v;
  std::vector<std::unique_ptr<DeviceBuffer<KT>>> dk, dv;
  std::vector<std::int32_t> table = {0};
  std::unique_ptr<DeviceBuffer<std::int32_t>> dtable;

  Caches(std::mt19937_64& rng, const Case& c)
      : B(int(c.lengths.size())), H(c.hkv()), D(c.d), S(c.cap), layout(c.layout) {
    std::size_t elems = std::size_t(B) * S * H * D;
    if (layout == Layout::kPagedNHD) {
      page_size = c.page_size;
      max_pages = (S + page_size - 1) / page_size;
      num_pages = B * max_pages + 3;  // spare pages, never referenced
      std::vector<std::int32_t> perm(num_pages);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table.assign(perm.begin(), perm.begin() + std::size_t(B) * max_pages);
      elems = std::size_t(num_pages) * page_size * H * D;
    }
    dtable = std::make_unique<DeviceBuffer<std::int32_t>>(table);
    for (int l = 0; l < c.layers(); ++l) {
      k.push_back(quarter_steps<KT>(rng, elems));
      v.push_back(kvsift_test::random_values<KT>(rng, elems));
      dk.push_back(std::make_unique<DeviceBuffer<KT>>(k.back()));
      dv.push_back(std::make_unique<DeviceBuffer<KT>>(v.back()));
    }
  }

  kvsift::ContiguousKV<KT> contiguous(KT* kp, KT* vp, const std::int32_t* len) const {
    return kvsift::make_bshd(kp, vp, B, H, S, D, len);
  }
  kvsift::PagedKV<KT> paged(KT* kp, KT* vp, const std::int32_t* tab, const std::int32_t* len) const {
    return kvsift::make_paged(kp, vp, tab, B, max_pages, num_pages, H, page_size, D, kvsift::PageLayout::kNHD, len);
  }
  template <class F>
  void with_host_view(int l, const std::int32_t* len, F&& f) {
    if (layout == Layout::kBSHD) f(contiguous(k[l].data(), v[l].data(), len));
    else f(paged(k[l].data(), v[l].data(), table.data(), len));
  }
  template <class F>
  void with_device_view(int l, const std::int32_t* len, F&& f) {
    if (layout == Layout::kBSHD) f(contiguous(dk[l]->get(), dv[l]->get(), len));
    else f(paged(dk[l]->get(), dv[l]->get(), dtable->get(), len));
  }
};

// The policy on one backend: decoder, state and workspace in that backend's memory.
struct HostPolicy {
  LycheeDecodePolicy decoder;
  LycheeDecodeState state;
  std::unique_ptr<HostBuffer> state_memory, workspace;
  template <class KT>
  void init(const LycheeDecodeConfig& c) {
    const auto st = LycheeDecodePolicy::create(c, &decoder);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    state_memory = std::make_unique<HostBuffer>(decoder.state_bytes());
    REQUIRE(decoder.make_state(state_memory->get(), state_memory->bytes(), &state).ok());
    std::size_t bytes = 0;
    REQUIRE(decoder.workspace_bytes<KT>(kvsift::host::Exec{}, &bytes).ok());
    workspace = std::make_unique<HostBuffer>(bytes);
  }
};

struct DevicePolicy {
  LycheeDecodePolicy decoder;
  LycheeDecodeState state;
  std::unique_ptr<DeviceBuffer<unsigned char>> state_memory, workspace;
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device();
  template <class KT>
  void init(const LycheeDecodeConfig& c, int num_sms = 0) {
    if (num_sms > 0) exec.device.num_sms = num_sms;
    const auto st = LycheeDecodePolicy::create(c, &decoder);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    state_memory = std::make_unique<DeviceBuffer<unsigned char>>(decoder.state_bytes());
    state_memory->poison();  // the table needs no initialisation: layer 0 writes every row
    REQUIRE(decoder.make_state(state_memory->get(), state_memory->size(), &state).ok());
    std::size_t bytes = 0;
    REQUIRE(decoder.workspace_bytes<KT>(exec, &bytes).ok());
    workspace = std::make_unique<DeviceBuffer<unsigned char>>(bytes);
    workspace->poison();
  }
};

// The table rows of sequences b < batch: counts, then each row's entries below its count.
inline std::vector<std::vector<std::int32_t>> table_rows(const kvsift::IndexSet& t, int rows,
                                                        const std::int32_t* indices, const std::int32_t* counts) {
  std::vector<std::vector<std::int32_t>> out(rows);
  for (int r = 0; r < rows; ++r) {
    const int n = counts[r];
    if (n < 0 || n > t.capacity) {
      out[r] = {-999, n};  // an impossible row, reported by the comparison
      continue;
    }
    out[r].assign(indices + std::size_t(r) * t.row_stride, indices + std::size_t(r) * t.row_stride + n);
  }
  return out;
}

inline std::vector<std::vector<std::int32_t>> device_table_rows(const kvsift::IndexSet& t, int rows) {
  std::vector<std::int32_t> indices(std::size_t(t.rows) * t.row_stride), counts(t.rows);
  KVSIFT_TEST_CUDA(cudaMemcpy(indices.data(), t.indices, indices.size() * 4, cudaMemcpyDeviceToHost));
  KVSIFT_TEST_CUDA(cudaMemcpy(counts.data(), t.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
  return table_rows(t, rows, indices.data(), counts.data());
}

template <class KT>
int compare_outputs(const std::vector<KT>& got, const std::vector<KT>& want, const char* what) {
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 8; ++i) {
    const double g = kvsift::to_float(got[i]), w = kvsift::to_float(want[i]);
    if (!(close(g, w, Tolerance<KT>::out))) {
      ++bad;
      FAIL_CHECK(what << "[" << i << "] = " << g << ", host reference " << w);
    }
  }
  return bad;
}

// Runs the case's decode steps on both backends and compares after every layer.
template <class KT>
void run_case(const Case& c, std::uint64_t salt) {
  INFO(c.describe());
  auto rng = kvsift_test::make_rng(salt);
  const LycheeDecodeConfig config = c.config();
  Caches<KT> caches(rng, c);
  HostPolicy host;
  DevicePolicy device;
  host.init<KT>(config);
  device.init<KT>(config, c.num_sms);
  const int B = caches.B, H = caches.H, Hq = H * c.group, D = c.d;
  std::vector<std::int32_t> lengths = c.lengths;
  DeviceBuffer<std::int32_t> dlengths(lengths);
  DeviceBuffer<KT> dq(std::size_t(B) * Hq * D), dout(std::size_t(B) * Hq * D);
  std::vector<std::vector<KT>> first_queries(std::size_t(c.layers()));
  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    dlengths.upload(lengths);
    for (int l = 0; l < c.layers(); ++l) {
      CAPTURE(l);
      if (step == 0 || !c.repeat_queries) first_queries[std::size_t(l)] = group_mean_queries<KT>(rng, B, H, c.group, D);
      const auto q = first_queries[std::size_t(l)];
      std::vector<KT> want(q.size());
      caches.with_host_view(l, lengths.data(), [&](const auto& kv) {
        const auto io = kvsift::make_query_io(q.data(), want.data(), 1, Hq, D);
        const auto st = host.decoder.decode_layer(kvsift::host::Exec{}, host.state, l, kv, io, kvsift::Workspace{host.workspace->get(), host.workspace->bytes()});
        REQUIRE_MESSAGE(st.ok(), st.to_string());
      });
      dq.upload(q);
      dout.poison();
      caches.with_device_view(l, dlengths.get(), [&](const auto& kv) {
        const auto io = kvsift::make_query_io(dq.get(), dout.get(), 1, Hq, D);
        const auto st = device.decoder.decode_layer(device.exec, device.state, l, kv, io,
                                                    kvsift::Workspace{device.workspace->get(), device.workspace->size()});
        REQUIRE_MESSAGE(st.ok(), st.to_string());
      });
      kvsift_test::sync_and_check();
      CHECK(compare_outputs(dout.download(), want, "out") == 0);
      const auto& ht = host.state.table;
      const auto want_rows = table_rows(ht, B * H, ht.indices, ht.counts);
      const auto got_rows = device_table_rows(device.state.table, B * H);
      for (int r = 0; r < B * H; ++r) {
        INFO("index row " << r << " (sequence " << r / H << ", KV head " << r % H << ")");
        CHECK(got_rows[r] == want_rows[r]);
      }
    }
    for (auto& len : lengths)
      if (len > 0 && len < c.cap) ++len;
  }
  CHECK(device.state.next_layer == 0);
}

}  // namespace lycheedecode_test
