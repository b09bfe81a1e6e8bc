#pragma once
// decode_attention: attention of the newest q_len query positions over a KV view, for decoding.
//
// Per (batch b, KV head h) the keys are either
//   dense:    tokens [0, len), len = min(kv.length(b), max_kv_length), or
//   gathered: the entries of index-set row b * num_kv_heads + h (tokens, or blocks of block_size
//             tokens), with entries outside the sequence skipped;
// a per-KV-head role mask chooses, so dense retrieval heads and gathered sparse heads run in one
// launch (LycheeDecode's hybrid kernel). The G = num_q_heads / num_kv_heads query heads of a KV head
// share its keys (GQA): query head hq reads KV head hq / G.
//
// Queries are the last q_len positions of the sequence: query position i (0-based) sits at token
// len - q_len + i and sees tokens t <= len - q_len + i (causal); a gathered entry obeys the same mask.
//
//   q    [batch, q_len, num_q_heads, head_dim] through element strides (head_dim contiguous)
//   out  same shape and dtype as q, own strides; every element of every row is written
//   lse  optional float [batch, q_len, num_q_heads], natural log of sum_t exp(sm_scale * q.k_t)
//
// Rows with no visible key (length 0, an empty or fully out-of-range index row, a query position
// before the start of the sequence) give out = 0 and lse = -inf, never NaN.
//
// Duplicate entries in an index row are separate keys: a token listed twice is attended twice (its
// weight doubles), exactly as if the cache held two copies. The kernels never deduplicate, so an
// index row costs what it lists; producers such as top-k never emit duplicates.
//
// Score emission (dense heads only, for the retrieval heads' top-k): with `scores` set, the raw
// score of the group-mean query of the last position, s_t = (1/G) sum_g q_g . k_t (no sm_scale, no
// softmax), is written to row b * num_kv_heads + h of `scores`, fused into the same pass over K:
//   score_block_size == 1:   entry t = s_t for t < len, -inf for len <= t < max_kv_length
//   score_block_size >= 16:  entry j = max of s_t over block j's tokens below len, -inf if none;
//                            j < ceil(max_kv_length / score_block_size)
// Rows of gathered heads are not touched.
//
// Launch geometry and the workspace depend only on host values (shapes, max_kv_length, the index
// set's capacity, the role mask, num_sms), never on device lengths, so a call can be captured in a
// CUDA graph and replayed for any lengths up to max_kv_length.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/contiguous_kv.hpp"
#include "kvsift/kv/head_roles.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/kv/paged_kv.hpp"

namespace kvsift {

template <class T>
struct DecodeAttentionParams {
  using value_type = T;
  const T* q = nullptr;
  std::int64_t q_batch_stride = 0, q_token_stride = 0, q_head_stride = 0;  // elements
  T* out = nullptr;
  std::int64_t out_batch_stride = 0, out_token_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional, [batch, q_len, num_q_heads]
  int num_q_heads = 0;
  int head_dim = 0;  // must equal kv.head_dim; 64, 128 or 256
  int q_len = 1;
  float sm_scale = 0.f;
  // Upper bound on the lengths of this call: sizes the grid. 0 takes the view's capacity
  // (ContiguousKV, PagedKV); a custom view must set it. Keys at or past it are ignored.
  int max_kv_length = 0;
  HeadRoleMask roles;  // default: every head dense
  // Rows b * num_kv_heads + h for the gathered heads; token or block granularity (block_size a
  // power of two >= 16). Unused, and may be empty, when no head is gathered.
  ConstIndexSet gather;
  float* scores = nullptr;  // optional, see the header comment
  std::int64_t score_row_stride = 0;
  int score_block_size = 1;  // 1: per token; a power of two >= 16: max per block
  // SMs of the target GPU, used to size the split-KV grid (one wave of kDecodeCtasPerSm blocks per
  // SM). 0 assumes 132 (H100/H200). Set it from cudaDevAttrMultiProcessorCount for other GPUs; the
  // workspace query and the launch must see the same value.
  int num_sms = 0;
};

// Params for dense q/out tensors [batch, q_len, num_q_heads, head_dim] and sm_scale = 1/sqrt(d).
template <class T>
DecodeAttentionParams<T> make_decode_attention_params(const T* q, T* out, int q_len, int num_q_heads, int head_dim) {
  DecodeAttentionParams<T> p;
  p.q = q;
  p.out = out;
  p.num_q_heads = num_q_heads;
  p.head_dim = head_dim;
  p.q_len = q_len;
  p.q_head_stride = p.out_head_stride = head_dim;
  p.q_token_stride = p.out_token_stride = std::int64_t(num_q_heads) * head_dim;
  p.q_batch_stride = p.out_batch_stride = std::int64_t(q_len) * num_q_heads * head_dim;
  p.sm_scale = 1.f / std::sqrt(float(head_dim));
  return p;
}

namespace detail {

inline constexpr int kDecodeCtasPerSm = 2;     // blocks resident per SM the split plan assumes
inline constexpr int kDecodeCtaTokens = 64;    // tokens one block consumes per step (4 warps x 16)
inline constexpr int kDecodeMaxChunk = 32768;  // bounds the block-max scratch in shared memory

// Tokens a view can hold (kv_capacity), 0 for a view that does not say: sizes the grid when
// max_kv_length = 0.
template <class V>
int view_capacity(const V& kv) {
  const int cap = kv_capacity(kv);
  return cap > 0 ? cap : 0;
}

// The tensor-core kernel serves 16-bit K/V; float K/V take the CUDA-core kernel.
template <class View>
constexpr bool decode_uses_tensor_cores() {
  return sizeof(typename View::value_type) == 2;
}

// The split-KV work decomposition: a pure function of host values, shared by the workspace query,
// the launcher and the merge.
struct DecodePlan {
  int batch = 0, num_kv_heads = 0, group = 0, head_dim = 0;
  int max_len = 0;          // tokens a dense head covers
  int gathered_tokens = 0;  // tokens a gathered head covers (index capacity * block size, capped)
  int rows = 0;             // query rows per KV head: q_len * group, plus the score row
  int row_tile = 0;         // rows per block (8 or 16)
  int row_tiles = 0;
  int num_dense = 0, num_gathered = 0;
  int chunk = 0;            // tokens per split (a multiple of kDecodeCtaTokens and of every block size)
  int dense_splits = 0, gathered_splits = 0;
  int ctas_per_tile = 0;    // grid.x: num_dense * dense_splits + num_gathered * gathered_splits
  std::uint8_t head_at[kMaxKvHeads] = {};  // dense heads first, then gathered, by head index
  std::uint8_t rank_of[kMaxKvHeads] = {};  // position of a head among those of its role

  std::size_t partials() const { return std::size_t(batch) * row_tiles * ctas_per_tile; }
  // Workspace: normalised partial outputs [partials, row_tile, head_dim] and their base-2 LSE.
  template <class Carve>
  void carve(Carve& ws, float** partial_out, float** partial_lse) const {
    *partial_out = ws.template take<float>(partials() * row_tile * head_dim);
    *partial_lse = ws.template take<float>(partials() * row_tile);
  }
};

inline int ceil_div(std::int64_t a, std::int64_t b) { return int((a + b - 1) / b); }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }
inline bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// Shapes and values; `check_pointers` is off for the workspace-size query, which needs no data.
template <class View, class T>
Status validate_decode_attention(const View& kv, const DecodeAttentionParams<T>& p, bool check_pointers = true) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256, kUnsupported, "head_dim = ", p.head_dim,
                 " is not supported (64, 128 or 256)");
  KVSIFT_REQUIRE(kv.head_dim == p.head_dim, kInvalidArgument, "kv.head_dim = ", kv.head_dim,
                 " must equal params.head_dim = ", p.head_dim);
  KVSIFT_REQUIRE(kv.num_kv_heads <= kMaxKvHeads, kUnsupported, "kv.num_kv_heads = ", kv.num_kv_heads,
                 " exceeds ", kMaxKvHeads);
  KVSIFT_REQUIRE(p.num_q_heads > 0 && p.num_q_heads % kv.num_kv_heads == 0, kInvalidArgument, "num_q_heads = ",
                 p.num_q_heads, " must be a positive multiple of kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(p.q_len >= 1, kInvalidArgument, "q_len = ", p.q_len, " must be >= 1");
  KVSIFT_REQUIRE(std::isfinite(p.sm_scale), kInvalidArgument, "sm_scale = ", p.sm_scale, " must be finite");
  KVSIFT_REQUIRE(p.max_kv_length >= 0, kInvalidArgument, "max_kv_length = ", p.max_kv_length, " must be >= 0");
  KVSIFT_REQUIRE(p.max_kv_length > 0 || view_capacity(kv) > 0 || kv.batch == 0, kInvalidArgument,
                 "max_kv_length = 0 needs a view with a known capacity; set it for this view");
  KVSIFT_REQUIRE(p.num_sms >= 0, kInvalidArgument, "num_sms = ", p.num_sms, " must be >= 0");
  const int group = p.num_q_heads / kv.num_kv_heads;
  KVSIFT_REQUIRE(std::int64_t(p.q_len) * group + 1 <= 4096, kUnsupported, "q_len * num_q_heads / num_kv_heads = ",
                 std::int64_t(p.q_len) * group, " exceeds 4095 query rows per KV head");
  const int num_gathered = p.roles.count_sparse(kv.num_kv_heads);
  if (num_gathered > 0) {
    KVSIFT_TRY(p.gather.validate("gather"));
    KVSIFT_REQUIRE(p.gather.rows >= kv.batch * kv.num_kv_heads, kInvalidArgument, "gather.rows = ", p.gather.rows,
                   " must be >= batch * num_kv_heads = ", kv.batch * kv.num_kv_heads);
    KVSIFT_REQUIRE(p.gather.granularity == Granularity::kToken || p.gather.block_size >= 16, kInvalidArgument,
                   "gather.block_size = ", p.gather.block_size, " must be a power of two >= 16");
  }
  if (p.scores) {
    KVSIFT_REQUIRE(p.score_block_size == 1 || (is_pow2(p.score_block_size) && p.score_block_size >= 16),
                   kInvalidArgument, "score_block_size = ", p.score_block_size, " must be 1 or a power of two >= 16");
  }
  if (p.scores) {
    const int max_len = p.max_kv_length > 0 ? p.max_kv_length : view_capacity(kv);
    const int cols = ceil_div(max_len, p.score_block_size);
    KVSIFT_REQUIRE(p.score_row_stride >= cols, kInvalidArgument, "score_row_stride = ", p.score_row_stride,
                   " must be >= ceil(max_kv_length / score_block_size) = ", cols);
  }
  if (kv.batch == 0 || !check_pointers) return Status();
  KVSIFT_REQUIRE_NOT_NULL(p.q, "q");
  KVSIFT_REQUIRE_NOT_NULL(p.out, "out");
  return Status();
}

// Sizes the grid for about one wave of kDecodeCtasPerSm blocks per SM with equal tokens per block;
// a dense head gets proportionally more splits than a gathered one.
template <class View, class T>
Status plan_decode_attention(const View& kv, const DecodeAttentionParams<T>& p, DecodePlan* plan) {
  KVSIFT_TRY(validate_decode_attention(kv, p, /*check_pointers=*/false));
  DecodePlan& pl = *plan;
  pl = DecodePlan();
  pl.batch = kv.batch;
  pl.num_kv_heads = kv.num_kv_heads;
  pl.group = p.num_q_heads / kv.num_kv_heads;
  pl.head_dim = p.head_dim;
  pl.max_len = p.max_kv_length > 0 ? p.max_kv_length : view_capacity(kv);
  pl.rows = p.q_len * pl.group + (p.scores ? 1 : 0);
  const bool mma = decode_uses_tensor_cores<View>();
  pl.row_tile = (!mma || pl.rows <= 8 || p.head_dim == 256) ? 8 : 16;
  pl.row_tiles = ceil_div(pl.rows, pl.row_tile);
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    if (p.roles.is_sparse(h)) continue;
    pl.rank_of[h] = std::uint8_t(pl.num_dense);
    pl.head_at[pl.num_dense++] = std::uint8_t(h);
  }
  for (int h = 0; h < kv.num_kv_heads; ++h) {
    if (!p.roles.is_sparse(h)) continue;
    pl.rank_of[h] = std::uint8_t(pl.num_gathered);
    pl.head_at[pl.num_dense + pl.num_gathered++] = std::uint8_t(h);
  }
  if (pl.num_gathered > 0)
    pl.gathered_tokens = int(std::min<std::int64_t>(std::int64_t(p.gather.capacity) * p.gather.block_size, pl.max_len));

  int quantum = kDecodeCtaTokens;
  if (pl.num_gathered > 0) quantum = std::max(quantum, p.gather.block_size);
  if (p.scores) quantum = std::max(quantum, p.score_block_size);
  const int num_sms = p.num_sms > 0 ? p.num_sms : 132;
  const std::int64_t target = std::int64_t(num_sms) * kDecodeCtasPerSm;
  const std::int64_t work = std::int64_t(std::max(kv.batch, 1)) * pl.row_tiles *
                            (std::int64_t(pl.num_dense) * pl.max_len + std::int64_t(pl.num_gathered) * pl.gathered_tokens);
  const double per_cta = std::max(1.0, double(work) / double(target));
  // Splits per head rounded down so the grid never spills into a second, mostly idle wave.
  const int sd = std::max(1, int(double(pl.max_len) / per_cta));
  const int sg = std::max(1, int(double(pl.gathered_tokens) / per_cta));
  int chunk = std::max(pl.num_dense ? ceil_div(pl.max_len, sd) : 1, pl.num_gathered ? ceil_div(pl.gathered_tokens, sg) : 1);
  chunk = std::min(round_up(chunk, quantum), std::max(kDecodeMaxChunk, quantum));
  pl.chunk = chunk;
  pl.dense_splits = std::max(1, ceil_div(pl.max_len, chunk));
  pl.gathered_splits = std::max(1, ceil_div(pl.gathered_tokens, chunk));
  pl.ctas_per_tile = pl.num_dense * pl.dense_splits + pl.num_gathered * pl.gathered_splits;
  return Status();
}

}  // namespace detail

// Bytes of workspace the CUDA launcher needs for these views and params (no device memory needed).
template <class View, class T>
Status decode_attention_workspace_bytes(const View& kv, const DecodeAttentionParams<T>& p, std::size_t* bytes) {
  static_assert(check_kv_view<View>());
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  // The split plan rounds per batch size, so a smaller batch can need more scratch than a larger one.
  // Engines size once for their largest batch: report the most any batch up to kv.batch needs.
  *bytes = 0;
  View smaller = kv;
  for (int b = kv.batch < 1 ? kv.batch : 1; b <= kv.batch; ++b) {
    smaller.batch = b;
    detail::DecodePlan plan;
    KVSIFT_TRY(detail::plan_decode_attention(smaller, p, &plan));
    WorkspaceCarver ws(nullptr, 0);
    float *o, *l;
    plan.carve(ws, &o, &l);
    *bytes = std::max(*bytes, ws.required_bytes());
  }
  return Status();
}

namespace host {

// Reference: double accumulation, the semantics above, directly. Host memory for every pointer
// (views, lengths, index set, q, out, lse, scores). The workspace is not used.
template <class View, class T>
Status decode_attention(Exec, const View& kv, const DecodeAttentionParams<T>& p, void* /*workspace*/ = nullptr,
                        std::size_t /*workspace_bytes*/ = 0) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_decode_attention(kv, p));
  using KT = typename View::value_type;
  const int d = p.head_dim, Hkv = kv.num_kv_heads, G = p.num_q_heads / Hkv;
  const int max_len = p.max_kv_length > 0 ? p.max_kv_length : detail::view_capacity(kv);
  std::vector<double> qv(d), acc(d), logits;
  std::vector<int> keys;
  for (int b = 0; b < kv.batch; ++b) {
    const int len = std::min(kv.length(b), max_len);
    // Lengths are host memory here, so the reference can check what the CUDA launcher cannot.
    KVSIFT_REQUIRE(len == 0 || p.q_len <= len, kInvalidArgument, "q_len = ", p.q_len, " exceeds kv.length(", b,
                   ") = ", len);
    for (int h = 0; h < Hkv; ++h) {
      const bool gathered = p.roles.is_sparse(h);
      keys.clear();
      if (!gathered) {
        for (int t = 0; t < len; ++t) keys.push_back(t);
      } else {
        const int row = b * Hkv + h, bs = p.gather.block_size;
        for (int e = 0; e < p.gather.count(row); ++e) {
          const std::int64_t first = std::int64_t(p.gather.row(row)[e]) * bs;
          for (int i = 0; i < bs; ++i)
            if (first + i >= 0 && first + i < len) keys.push_back(int(first + i));
        }
      }
      for (int qi = 0; qi < p.q_len; ++qi) {
        const int limit = len - p.q_len + qi;  // last visible token
        for (int g = 0; g < G; ++g) {
          const int hq = h * G + g;
          const T* q = p.q + b * p.q_batch_stride + qi * p.q_token_stride + hq * p.q_head_stride;
          for (int i = 0; i < d; ++i) qv[i] = to_float(q[i]);
          logits.clear();
          double m = -INFINITY;
          for (int t : keys) {
            if (t > limit) continue;
            const KT* k = kv.k_row(b, h, t);
            double s = 0;
            for (int i = 0; i < d; ++i) s += qv[i] * double(to_float(k[i]));
            logits.push_back(s * p.sm_scale);
            m = std::max(m, logits.back());
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          std::size_t n = 0;
          for (int t : keys) {
            if (t > limit) continue;
            const double w = std::exp(logits[n++] - m);
            sum += w;
            const KT* v = kv.v_row(b, h, t);
            for (int i = 0; i < d; ++i) acc[i] += w * double(to_float(v[i]));
          }
          T* o = p.out + b * p.out_batch_stride + qi * p.out_token_stride + hq * p.out_head_stride;
          for (int i = 0; i < d; ++i) o[i] = from_float<T>(sum > 0 ? float(acc[i] / sum) : 0.f);
          if (p.lse) p.lse[(std::int64_t(b) * p.q_len + qi) * p.num_q_heads + hq] = sum > 0 ? float(m + std::log(sum)) : -INFINITY;
        }
      }
      if (p.scores && !gathered) {
        std::fill(qv.begin(), qv.end(), 0.0);
        for (int g = 0; g < G; ++g) {
          const T* q = p.q + b * p.q_batch_stride + (p.q_len - 1) * p.q_token_stride + (h * G + g) * p.q_head_stride;
          for (int i = 0; i < d; ++i) qv[i] += double(to_float(q[i])) / G;
        }
        float* row = p.scores + (std::int64_t(b) * Hkv + h) * p.score_row_stride;
        const int bs = p.score_block_size;
        const int cols = detail::ceil_div(max_len, bs);
        for (int j = 0; j < cols; ++j) row[j] = -INFINITY;
        for (int t = 0; t < len; ++t) {
          const KT* k = kv.k_row(b, h, t);
          double s = 0;
          for (int i = 0; i < d; ++i) s += qv[i] * double(to_float(k[i]));
          row[t / bs] = std::max(row[t / bs], float(s));
        }
      }
    }
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
