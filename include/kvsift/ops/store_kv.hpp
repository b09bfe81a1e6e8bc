#pragma once
/// \file
/// \brief store_kv: write new K/V rows into a KV view of any KV dtype, quantizing to fp8 where the view is fp8.
///
/// An engine's append: row i of `rows` (n rows, each num_kv_heads x head_dim values of K and of V, in
/// float, bf16 or fp16) is token `pos[i]` of sequence `seq[i]`. For every KV head h it is written to
/// kv.k_row(seq[i], h, pos[i]) and kv.v_row(...), element by element:
///
///   16/32-bit view:       from_float<KT>(to_float(x))                     (scales untouched)
///   fp8, per-head scales: from_float<KT>(x / kv.scales.k[h])              (the engine's scale, read)
///   fp8, per-token:       s = amax / fp8_max_finite<KT>(), written to kv.scales.k[kv.scale_offset(b, h, t)],
///                         then from_float<KT>(x / s)
///
/// with amax the largest |x| over the row's finite elements, so the largest magnitude lands on the
/// largest finite fp8 value. A row whose s would not be a normal float (all zeros, or amax below
/// fp8_max * FLT_MIN) gets s = 1 and stores zeros: dequantization then gives 0, never NaN. Narrowing is
/// round-to-nearest-even with saturation (core/dtype.hpp): infinities become +-fp8 max, NaN stays NaN.
/// V is handled the same way with its own scale. Every step is a single correctly rounded float
/// operation (max, division, conversion), so the host reference and the CUDA kernel write the same
/// bytes.
///
/// Positions are explicit (device arrays on the GPU), so one call covers a decode step (one row per
/// sequence at its current length), a prefill chunk, or rows of several sequences at different
/// lengths, and a CUDA graph replays it for any positions. The op writes rows only: lengths are the
/// engine's (bump them after the store, before attention reads the rows). Rows whose seq[i] is outside
/// [0, kv.batch) or pos[i] outside [0, capacity) are skipped, never written out of bounds; all n source
/// rows are read all the same (the GPU loads a row before its seq and pos arrive), so a padded batch's
/// unused rows must be readable memory. Two rows with the same (seq, pos) race on the GPU; an engine's
/// append never produces them.
///
/// With `rotary` set (StoreKvRotary, with_rotary) each K row is first turned by RoPE, and Q rows, when
/// given, are turned in place: an engine's rotary embedding and append in one call.
///
/// This header is the contract (params, validation, the per-row quantization both backends use). The
/// workspace query is in store_kv_plan.hpp (0 bytes), the host reference in store_kv_reference.hpp, the
/// CUDA launcher in store_kv.cuh (kernel in detail/store_kv_kernel.cuh).

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/kv/kv_scales.hpp"
#include "kvsift/kv/kv_view.hpp"

namespace kvsift {

/// Rotary position embedding ("rotate half", the GPT-NeoX / Llama form) that store_kv applies to the K
/// rows before it stores them, and optionally to Q rows in place, so an engine's RoPE and KV append are
/// one launch. Per head, dims j and j + r/2 (j < r/2, r = rotary_dim) of row i turn by the angle
///
///   a = float(position[i]) * inv_freq[j]             (one float product)
///   c = float(cos(double(a))), s = float(sin(double(a)))
///   x_j' = x_j c - x_{j+r/2} s,   x_{j+r/2}' = x_{j+r/2} c + x_j s   (each product and difference
///                                                                     rounded to float: no fused multiply-add)
///
/// and dims from r on are kept. inv_freq is the engine's (theta^(-2j/r) for plain RoPE, or any scaled
/// form such as Llama 3's), so every schedule of frequencies is one table. position is the rotary
/// position, which need not be the cache slot `pos` (a compressed cache stores a token at a slot below
/// its position). The host reference and the GPU take cos and sin in double and round them, so their
/// rotated rows agree to within one rounding of the stored type (the libraries' double cos/sin differ by
/// an ulp of a double at most), not bit for bit.
template <class T>
struct StoreKvRotary {
  const float* inv_freq = nullptr;         ///< [rotary_dim / 2] inverse frequencies; null: no rotation
  const std::int32_t* position = nullptr;  ///< [n] rotary position of each row
  int rotary_dim = 0;                      ///< dims rotated per head: even, in [2, head_dim]
  T* q = nullptr;                          ///< optional Q rows rotated in place: head h of row i at q + i * q_row_stride + h * head_dim
  int num_q_heads = 0;                     ///< heads of each Q row (with q)
  std::int64_t q_row_stride = 0;           ///< elements between consecutive Q rows, >= num_q_heads * head_dim (with q)
};

/// The rows of one store_kv call (see the file comment); pointers in the Exec's memory space. Build it
/// with make_store_kv_params for dense [n, num_kv_heads, head_dim] K and V buffers.
template <class T>
struct StoreKvParams {
  using value_type = T;  ///< the element type of the new rows: float, half_t, bfloat16_t (or CUDA's 16-bit types)
  const T* k = nullptr;  ///< new K: head h of row i at k + i * row_stride + h * head_stride, head_dim contiguous
  const T* v = nullptr;  ///< new V, the same strides as k
  int n = 0;             ///< rows, >= 0
  std::int64_t row_stride = 0;   ///< elements between consecutive rows, >= 0
  std::int64_t head_stride = 0;  ///< elements between the heads of one row, >= 0
  const std::int32_t* seq = nullptr;  ///< [n] sequence of each row
  const std::int32_t* pos = nullptr;  ///< [n] token position of each row in its sequence
  StoreKvRotary<T> rotary;            ///< RoPE applied to K (and Q) on the way in; off by default
};

/// `p` with RoPE on: K rows rotated by `inv_freq` at `position` before they are stored, and the dense
/// Q rows q [n, num_q_heads, head_dim] rotated in place (q may be null: K only). rotary_dim 0 means
/// head_dim.
template <class T>
StoreKvParams<T> with_rotary(StoreKvParams<T> p, const float* inv_freq, const std::int32_t* position, int rotary_dim,
                             T* q = nullptr, int num_q_heads = 0, int head_dim = 0) {
  p.rotary.inv_freq = inv_freq;
  p.rotary.position = position;
  p.rotary.rotary_dim = rotary_dim > 0 ? rotary_dim : head_dim;
  p.rotary.q = q;
  p.rotary.num_q_heads = num_q_heads;
  p.rotary.q_row_stride = std::int64_t(num_q_heads) * head_dim;
  return p;
}

/// Params for dense new rows k, v of [n, num_kv_heads, head_dim] (row_stride num_kv_heads * head_dim,
/// head_stride head_dim).
template <class T>
StoreKvParams<T> make_store_kv_params(const T* k, const T* v, int n, int num_kv_heads, int head_dim,
                                      const std::int32_t* seq, const std::int32_t* pos) {
  StoreKvParams<T> p;
  p.k = k;
  p.v = v;
  p.n = n;
  p.row_stride = std::int64_t(num_kv_heads) * head_dim;
  p.head_stride = head_dim;
  p.seq = seq;
  p.pos = pos;
  return p;
}

namespace detail {

template <class V, class = void>
struct has_scale_storage : std::false_type {};
template <class V>
struct has_scale_storage<V, std::enable_if_t<std::is_same_v<std::decay_t<decltype(std::declval<const V&>().scales)>, KvScales> &&
                                             std::is_convertible_v<decltype(std::declval<const V&>().scale_offset(0, 0, 0)),
                                                                   std::int64_t>>> : std::true_type {};

/// What an op that writes fp8 rows needs of the view: `KvScales scales` and `scale_offset(b, h, t)`,
/// the addresses it writes per-token scales to (ContiguousKV and PagedKV have both).
template <class V>
constexpr bool check_writable_scales() {
  static_assert(!is_fp8_view_v<V> || has_scale_storage<V>::value,
                "kvsift: writing an fp8 view needs the members `kvsift::KvScales scales` and "
                "`KVSIFT_HD std::int64_t scale_offset(int batch, int kv_head, int token) const` "
                "(ContiguousKV and PagedKV have them)");
  return true;
}

/// The per-token scale of a row whose largest finite magnitude is `amax`: amax / fp8_max, or 1 when that
/// is not a normal float (so a zero row stores zeros and dequantizes to 0, and FTZ cannot change it).
template <class KT>
KVSIFT_HD inline float per_token_scale(float amax) {
#if defined(__CUDA_ARCH__)
  const float s = __fdiv_rn(amax, fp8_max_finite<KT>());
#else
  const float s = amax / fp8_max_finite<KT>();
#endif
  return s >= FLT_MIN ? s : 1.f;
}

/// Folds |x| into the running amax when x is finite (NaN and infinities are left out, the same way on
/// host and device, since neither std::max nor fmaxf is used).
KVSIFT_HD inline float fold_amax(float amax, float x) {
  const float a = x < 0.f ? -x : x;
  return (a <= FLT_MAX && a > amax) ? a : amax;
}

/// One stored element: x / scale narrowed to KT for fp8, x narrowed to KT otherwise.
template <class KT>
KVSIFT_HD inline KT quantize_element(float x, float scale) {
  if constexpr (is_fp8_dtype<KT>::value) {
#if defined(__CUDA_ARCH__)
    return from_float<KT>(__fdiv_rn(x, scale));
#else
    return from_float<KT>(x / scale);
#endif
  } else {
    (void)scale;
    return from_float<KT>(x);
  }
}

/// One rotary pair (StoreKvRotary): x1' = x1 c - x2 s, x2' = x2 c + x1 s, every product and difference
/// rounded to float on its own (no fused multiply-add on the GPU).
KVSIFT_HD inline void rotate_pair(float& x1, float& x2, float c, float s) {
#if defined(__CUDA_ARCH__)
  const float a = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  const float b = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
#else
  const float x1c = x1 * c, x2s = x2 * s, x2c = x2 * c, x1s = x1 * s;
  const float a = x1c - x2s, b = x2c + x1s;
#endif
  x1 = a;
  x2 = b;
}

/// The rotary angle's cos and sin (StoreKvRotary): the float product, then double cos and sin rounded.
KVSIFT_HD inline void rotary_cos_sin(std::int32_t position, float inv_freq, float* c, float* s) {
#if defined(__CUDA_ARCH__)
  const float a = __fmul_rn(float(position), inv_freq);
  double sd, cd;
  sincos(double(a), &sd, &cd);
#else
  const float a = float(position) * inv_freq;
  const double sd = std::sin(double(a)), cd = std::cos(double(a));
#endif
  *c = float(cd);
  *s = float(sd);
}

/// Whether row (b, t) of a store lands inside the view: b in [0, batch), t in [0, capacity) (capacity
/// -1: the view does not say, and the caller is trusted).
KVSIFT_HD inline bool store_row_in_range(int b, int t, int batch, int capacity) {
  return b >= 0 && b < batch && t >= 0 && (capacity < 0 || t < capacity);
}

template <class View, class T>
Status validate_store_kv(const View& kv, const StoreKvParams<T>& p) {
  static_assert(is_supported_dtype<T>::value, "store_kv: the new rows must be float, half or bfloat16");
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(p.n >= 0, kInvalidArgument, "n = ", p.n, " must be >= 0");
  KVSIFT_REQUIRE(p.row_stride >= 0, kInvalidArgument, "row_stride = ", p.row_stride, " must be >= 0");
  KVSIFT_REQUIRE(p.head_stride >= 0, kInvalidArgument, "head_stride = ", p.head_stride, " must be >= 0");
  if (p.n == 0 || kv.batch == 0) return Status();
  KVSIFT_REQUIRE_NOT_NULL(p.k, "k");
  KVSIFT_REQUIRE_NOT_NULL(p.v, "v");
  KVSIFT_REQUIRE_NOT_NULL(p.seq, "seq");
  KVSIFT_REQUIRE_NOT_NULL(p.pos, "pos");
  const StoreKvRotary<T>& r = p.rotary;
  if (r.inv_freq) {
    KVSIFT_REQUIRE_NOT_NULL(r.position, "rotary.position");
    KVSIFT_REQUIRE(r.rotary_dim >= 2 && r.rotary_dim % 2 == 0 && r.rotary_dim <= kv.head_dim, kInvalidArgument,
                   "rotary.rotary_dim = ", r.rotary_dim, " must be even and in [2, head_dim = ", kv.head_dim, "]");
    if (r.q) {
      KVSIFT_REQUIRE(r.num_q_heads >= 1, kInvalidArgument, "rotary.num_q_heads = ", r.num_q_heads, " must be >= 1 with rotary.q");
      KVSIFT_REQUIRE(r.q_row_stride >= std::int64_t(r.num_q_heads) * kv.head_dim, kInvalidArgument, "rotary.q_row_stride = ",
                     r.q_row_stride, " must be >= num_q_heads * head_dim = ", std::int64_t(r.num_q_heads) * kv.head_dim);
    }
  }
  return Status();
}

}  // namespace detail
}  // namespace kvsift
