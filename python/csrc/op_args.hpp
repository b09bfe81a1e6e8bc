#pragma once
// From torch tensors to kvsift views and params, shared by the CPU and CUDA implementations of each
// op: the checks that only torch can make (dtype, device, rank, sizes, the strides a view needs) are
// here, so both backends reject bad input with the same message; everything a kvsift view or params
// struct can check itself is left to kvsift's validate(), whose Status becomes the exception.
//
// Errors: an argument problem raises ValueError (TORCH_CHECK_VALUE), a value kvsift does not handle
// (kUnsupported: head_dim 96, ...) NotImplementedError, anything else RuntimeError. Every message
// starts with "kvsift.<op>: " and names the Python argument or the kvsift field.

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <kvsift/gates/roles_file.hpp>
#include <kvsift/kvsift.hpp>

namespace kvsift_torch {

/// Raises `st` as a Python exception (see the file comment); does nothing for an ok Status.
inline void throw_if_error(const kvsift::Status& st, const char* op) {
  if (st.ok()) return;
  switch (st.code()) {
    case kvsift::StatusCode::kInvalidArgument:
    case kvsift::StatusCode::kNullPointer:
    case kvsift::StatusCode::kMisaligned:
    case kvsift::StatusCode::kInsufficientSpace:
      TORCH_CHECK_VALUE(false, "kvsift.", op, ": ", st.to_string());
    case kvsift::StatusCode::kUnsupported:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "kvsift.", op, ": ", st.to_string());
    default:
      TORCH_CHECK(false, "kvsift.", op, ": ", st.to_string());
  }
}

/// A torch int64 argument as the int kvsift's structs hold, or ValueError naming it.
inline int to_int(std::int64_t v, const char* op, const char* name) {
  TORCH_CHECK_VALUE(v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max(), "kvsift.", op,
                    ": ", name, " = ", v, " does not fit int32");
  return static_cast<int>(v);
}

/// Checks that `t` has `dim` dimensions, lives on `device` and has one of the `dtypes`.
inline void check_tensor(const at::Tensor& t, const char* op, const char* name, std::int64_t dim,
                         const c10::Device& device, std::initializer_list<at::ScalarType> dtypes) {
  TORCH_CHECK_VALUE(t.dim() == dim, "kvsift.", op, ": ", name, " must have ", dim, " dimensions (got shape ",
                    t.sizes(), ")");
  TORCH_CHECK_VALUE(t.device() == device, "kvsift.", op, ": ", name, " is on ", t.device(), " but ", device,
                    " was expected (every tensor of a call on one device)");
  bool ok = false;
  std::string names;
  for (at::ScalarType s : dtypes) {
    ok = ok || t.scalar_type() == s;
    names += (names.empty() ? "" : ", ") + std::string(c10::toString(s));
  }
  TORCH_CHECK_VALUE(ok, "kvsift.", op, ": ", name, ".dtype = ", t.scalar_type(), " must be one of ", names);
}

/// The innermost dimension must be dense: kvsift views address rows through strides but read each
/// row's elements contiguously.
inline void check_rows_contiguous(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.size(-1) <= 1 || t.stride(-1) == 1, "kvsift.", op, ": ", name,
                    " must be contiguous in its last dimension (stride(-1) = ", t.stride(-1), ", strides ",
                    t.strides(), ")");
}

/// A [n] int32 tensor on `device`, dense (kvsift reads it as a plain array).
inline void check_int_vector(const at::Tensor& t, const char* op, const char* name, std::int64_t n,
                             const c10::Device& device) {
  check_tensor(t, op, name, 1, device, {at::kInt});
  TORCH_CHECK_VALUE(t.size(0) == n, "kvsift.", op, ": ", name, " must have ", n, " entries (got ", t.size(0), ")");
  TORCH_CHECK_VALUE(t.numel() <= 1 || t.stride(0) == 1, "kvsift.", op, ": ", name, " must be contiguous");
}

// ---- topk ----

/// One topk call: outputs allocated on the scores' device, the view, params and index set over them.
struct TopkCall {
  at::Tensor indices;  ///< [rows, width] int32, entries past a row's count are -1
  at::Tensor counts;   ///< [rows] int32
  kvsift::TopKParams params;
  kvsift::IndexSet out;
  std::int64_t rows = 0, cols = 0, row_stride = 0;
};

/// The width of topk's index output: the budget, or the forced positions when they need more
/// (kvsift returns every forced position even when sink + recent > k). Also the fake kernel's rule
/// (kvsift/_ops.py).
inline std::int64_t topk_width(std::int64_t k, std::int64_t sink, std::int64_t recent) {
  return std::max<std::int64_t>(std::max<std::int64_t>(k, 0), std::max<std::int64_t>(sink, 0) + std::max<std::int64_t>(recent, 0));
}

inline TopkCall prepare_topk(const at::Tensor& scores, std::int64_t k, const c10::optional<at::Tensor>& lengths,
                             const c10::optional<at::Tensor>& per_row_k, std::int64_t sink, std::int64_t recent) {
  const char* op = "topk";
  const c10::Device device = scores.device();
  check_tensor(scores, op, "scores", 2, device, {at::kFloat, at::kHalf, at::kBFloat16});
  check_rows_contiguous(scores, op, "scores");
  TopkCall c;
  c.rows = scores.size(0);
  c.cols = scores.size(1);
  c.row_stride = c.rows <= 1 ? c.cols : scores.stride(0);
  to_int(c.rows, op, "scores.size(0)");
  c.params.k = to_int(k, op, "k");
  c.params.sink = to_int(sink, op, "sink");
  c.params.recent = to_int(recent, op, "recent");
  if (lengths) {
    check_int_vector(*lengths, op, "lengths", c.rows, device);
    c.params.lengths = lengths->data_ptr<std::int32_t>();
  }
  if (per_row_k) {
    check_int_vector(*per_row_k, op, "per_row_k", c.rows, device);
    c.params.per_row_k = per_row_k->data_ptr<std::int32_t>();
  }
  const std::int64_t width = topk_width(k, sink, recent);
  const int capacity = to_int(width, op, "max(k, sink + recent)");
  c.indices = at::full({c.rows, width}, -1, scores.options().dtype(at::kInt));
  c.counts = at::empty({c.rows}, scores.options().dtype(at::kInt));
  c.out = kvsift::make_index_set(c.indices.data_ptr<std::int32_t>(), c.counts.data_ptr<std::int32_t>(),
                                 int(c.rows), capacity);
  return c;
}

/// kvsift's element type for a torch dtype: the 16-bit types have the same bits as at::Half / at::BFloat16.
template <class F>
auto dispatch_dtype(at::ScalarType s, const char* op, F&& f) {
  switch (s) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(kvsift::half_t{});
    case at::kBFloat16: return f(kvsift::bfloat16_t{});
    default: TORCH_CHECK_VALUE(false, "kvsift.", op, ": dtype ", s, " is not float32, float16 or bfloat16");
  }
}

template <class T>
kvsift::StridedView2D<const T> scores_view(const at::Tensor& scores, const TopkCall& c) {
  return kvsift::make_strided_view<const T>(static_cast<const T*>(scores.data_ptr()), c.rows, c.cols, c.row_stride);
}

// ---- decode_attention ----

/// How the KV cache tensors are laid out (the `kv_layout` argument). Contiguous caches: "BHSD" (k
/// [B, H_kv, S, D], q [B, H_q, S_q, D]) and "BSHD" (k [B, S, H_kv, D], q [B, S_q, H_q, D]). Paged
/// caches with a block table: "NHD" (k [pages, page_size, H_kv, D]) and "HND" (k [pages, H_kv,
/// page_size, D]), q [B, S_q, H_q, D].
enum class KvLayout { kBHSD, kBSHD, kNHD, kHND };

inline KvLayout parse_kv_layout(const std::string& s, const char* op) {
  if (s == "BHSD") return KvLayout::kBHSD;
  if (s == "BSHD") return KvLayout::kBSHD;
  if (s == "NHD") return KvLayout::kNHD;
  if (s == "HND") return KvLayout::kHND;
  TORCH_CHECK_VALUE(false, "kvsift.", op, ": kv_layout = '", s, "' must be 'BHSD', 'BSHD' (contiguous) or 'NHD', 'HND' (paged)");
}

inline bool is_paged(KvLayout l) { return l == KvLayout::kNHD || l == KvLayout::kHND; }

/// q's heads sit in dimension 1 for BHSD (the layout HF attention functions receive), else in 2.
inline bool q_heads_first(KvLayout l) { return l == KvLayout::kBHSD; }

/// Everything but the element type: the decoded shape and the pointers that do not depend on T.
struct DecodeCall {
  KvLayout layout = KvLayout::kBHSD;
  int batch = 0, q_len = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  at::Tensor out;  ///< same shape as q, contiguous
  at::Tensor lse;  ///< float32 [B, S_q, H_q] in memory; returned as [B, H_q, S_q] (a permuted view) for BHSD
  kvsift::HeadRoleMask roles;
  kvsift::ConstIndexSet index_set;
  float sm_scale = 0.f;
  int max_kv_length = 0;
};

inline DecodeCall prepare_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& kv_lengths, const std::string& kv_layout,
                                 const c10::optional<at::Tensor>& block_table, c10::optional<double> sm_scale,
                                 std::int64_t max_kv_length, at::IntArrayRef sparse_heads,
                                 const c10::optional<at::Tensor>& indices, const c10::optional<at::Tensor>& index_counts,
                                 std::int64_t index_block_size) {
  const char* op = "decode_attention";
  DecodeCall c;
  c.layout = parse_kv_layout(kv_layout, op);
  const c10::Device device = q.device();
  check_tensor(q, op, "q", 4, device, {at::kFloat, at::kHalf, at::kBFloat16});
  check_tensor(k_cache, op, "k_cache", 4, device, {q.scalar_type()});
  check_tensor(v_cache, op, "v_cache", 4, device, {q.scalar_type()});
  check_rows_contiguous(q, op, "q");
  check_rows_contiguous(k_cache, op, "k_cache");
  check_rows_contiguous(v_cache, op, "v_cache");
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(), "kvsift.", op, ": v_cache shape ", v_cache.sizes(),
                    " must equal k_cache shape ", k_cache.sizes());
  const bool heads_first = q_heads_first(c.layout);
  c.batch = to_int(q.size(0), op, "q.size(0)");
  c.q_len = to_int(q.size(heads_first ? 2 : 1), op, "q_len");
  c.num_q_heads = to_int(q.size(heads_first ? 1 : 2), op, "num_q_heads");
  c.head_dim = to_int(q.size(3), op, "q.size(3)");
  TORCH_CHECK_VALUE(k_cache.size(3) == q.size(3), "kvsift.", op, ": k_cache head_dim ", k_cache.size(3),
                    " must equal q head_dim ", q.size(3));
  switch (c.layout) {
    case KvLayout::kBHSD: c.num_kv_heads = to_int(k_cache.size(1), op, "num_kv_heads"); break;
    case KvLayout::kBSHD: c.num_kv_heads = to_int(k_cache.size(2), op, "num_kv_heads"); break;
    case KvLayout::kNHD: c.num_kv_heads = to_int(k_cache.size(2), op, "num_kv_heads"); break;
    case KvLayout::kHND: c.num_kv_heads = to_int(k_cache.size(1), op, "num_kv_heads"); break;
  }
  if (!is_paged(c.layout)) {
    TORCH_CHECK_VALUE(k_cache.size(0) == q.size(0), "kvsift.", op, ": k_cache batch ", k_cache.size(0),
                      " must equal q batch ", q.size(0));
    TORCH_CHECK_VALUE(!block_table, "kvsift.", op, ": block_table is given but kv_layout = '", kv_layout,
                      "' is contiguous; use 'NHD' or 'HND' for a paged cache");
  } else {
    TORCH_CHECK_VALUE(block_table.has_value(), "kvsift.", op, ": kv_layout = '", kv_layout,
                      "' is paged and needs a block_table");
    check_tensor(*block_table, op, "block_table", 2, device, {at::kInt});
    check_rows_contiguous(*block_table, op, "block_table");
    TORCH_CHECK_VALUE(block_table->size(0) == q.size(0), "kvsift.", op, ": block_table has ", block_table->size(0),
                      " rows but q has batch ", q.size(0));
  }
  check_int_vector(kv_lengths, op, "kv_lengths", c.batch, device);

  c.sm_scale = sm_scale ? float(*sm_scale) : 1.f / std::sqrt(float(c.head_dim));
  c.max_kv_length = to_int(max_kv_length, op, "max_kv_length");
  for (std::int64_t h : sparse_heads) {
    TORCH_CHECK_VALUE(h >= 0 && h < c.num_kv_heads, "kvsift.", op, ": sparse_heads entry ", h,
                      " must be a KV head in [0, ", c.num_kv_heads, ")");
    c.roles.set_sparse(int(h), true);
  }
  if (!sparse_heads.empty()) {
    TORCH_CHECK_VALUE(indices && index_counts, "kvsift.", op,
                      ": sparse_heads is not empty, so indices and index_counts are required");
  }
  if (indices) {
    TORCH_CHECK_VALUE(index_counts.has_value(), "kvsift.", op, ": indices is given without index_counts");
    const std::int64_t rows = std::int64_t(c.batch) * c.num_kv_heads;
    const at::Tensor& idx = *indices;
    TORCH_CHECK_VALUE(idx.dim() == 2 || idx.dim() == 3, "kvsift.", op,
                      ": indices must be [B * H_kv, capacity] or [B, H_kv, capacity] (got shape ", idx.sizes(), ")");
    check_tensor(idx, op, "indices", idx.dim(), device, {at::kInt});
    check_rows_contiguous(idx, op, "indices");
    std::int64_t row_stride = idx.stride(-2);
    if (idx.dim() == 3) {
      TORCH_CHECK_VALUE(idx.size(0) == c.batch && idx.size(1) == c.num_kv_heads, "kvsift.", op, ": indices shape ",
                        idx.sizes(), " must start with [B, H_kv] = [", c.batch, ", ", c.num_kv_heads, "]");
      // kvsift addresses row b * H_kv + h at one row stride, so the batch stride must be H_kv rows.
      TORCH_CHECK_VALUE(idx.size(0) <= 1 || idx.stride(0) == idx.size(1) * idx.stride(1), "kvsift.", op,
                        ": indices rows must be evenly strided (strides ", idx.strides(), ")");
    } else {
      TORCH_CHECK_VALUE(idx.size(0) == rows, "kvsift.", op, ": indices has ", idx.size(0),
                        " rows but B * H_kv = ", rows);
    }
    if (rows <= 1) row_stride = idx.size(-1);
    const at::Tensor& counts = *index_counts;
    check_tensor(counts, op, "index_counts", counts.dim(), device, {at::kInt});
    TORCH_CHECK_VALUE(counts.numel() == rows && counts.is_contiguous(), "kvsift.", op,
                      ": index_counts must be a contiguous [B, H_kv] or [B * H_kv] tensor of ", rows,
                      " entries (got shape ", counts.sizes(), ")");
    kvsift::ConstIndexSet s;
    s.indices = idx.data_ptr<std::int32_t>();
    s.counts = counts.data_ptr<std::int32_t>();
    s.rows = to_int(rows, op, "B * H_kv");
    s.capacity = to_int(idx.size(-1), op, "indices capacity");
    s.row_stride = row_stride;
    const int bs = to_int(index_block_size, op, "index_block_size");
    s.granularity = bs == 1 ? kvsift::Granularity::kToken : kvsift::Granularity::kBlock;
    s.block_size = bs;
    c.index_set = s;
  }

  c.out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  c.lse = at::empty({q.size(0), c.q_len, c.num_q_heads}, q.options().dtype(at::kFloat));
  return c;
}

/// The lse as returned: [B, H_q, S_q] for BHSD (a view of the [B, S_q, H_q] buffer kvsift writes).
inline at::Tensor returned_lse(const DecodeCall& c) {
  return q_heads_first(c.layout) ? c.lse.permute({0, 2, 1}) : c.lse;
}

template <class T>
kvsift::DecodeAttentionParams<T> decode_params(const at::Tensor& q, const DecodeCall& c) {
  kvsift::DecodeAttentionParams<T> p;
  const bool heads_first = q_heads_first(c.layout);
  kvsift::QueryRows<T> rows;
  rows.data = static_cast<const T*>(q.data_ptr());
  rows.num_heads = c.num_q_heads;
  rows.capacity = c.q_len;
  rows.batch_stride = q.stride(0);
  rows.position_stride = q.stride(heads_first ? 2 : 1);
  rows.head_stride = q.stride(heads_first ? 1 : 2);
  p.io.q = rows;
  kvsift::OutputRows<T> out;
  out.data = static_cast<T*>(c.out.data_ptr());
  out.batch_stride = c.out.stride(0);
  out.position_stride = c.out.stride(heads_first ? 2 : 1);
  out.head_stride = c.out.stride(heads_first ? 1 : 2);
  p.io.out = out;
  p.io.lse = c.lse.data_ptr<float>();
  p.num_q_heads = c.num_q_heads;
  p.head_dim = c.head_dim;
  p.q_len = c.q_len;
  p.sm_scale = c.sm_scale;
  p.max_kv_length = c.max_kv_length;
  p.roles = c.roles;
  p.index_set = c.index_set;
  return p;
}

/// A contiguous view of k, v (BHSD or BSHD) with the given lengths, for decode_attention and compress_prompt.
template <class T>
kvsift::ContiguousKV<T> layout_view(const at::Tensor& k, const at::Tensor& v, const at::Tensor& lengths,
                                    KvLayout layout, const char* op) {
  const bool bhsd = layout == KvLayout::kBHSD;
  kvsift::ContiguousKV<T> kv;
  kv.k = static_cast<T*>(k.data_ptr());
  kv.v = static_cast<T*>(v.data_ptr());
  kv.batch = to_int(k.size(0), op, "batch");
  kv.num_kv_heads = to_int(k.size(bhsd ? 1 : 2), op, "heads");
  kv.head_dim = to_int(k.size(3), op, "head_dim");
  kv.capacity = to_int(k.size(bhsd ? 2 : 1), op, "kv capacity");
  kv.k_batch_stride = k.stride(0);
  kv.k_head_stride = k.stride(bhsd ? 1 : 2);
  kv.k_token_stride = k.stride(bhsd ? 2 : 1);
  kv.v_batch_stride = v.stride(0);
  kv.v_head_stride = v.stride(bhsd ? 1 : 2);
  kv.v_token_stride = v.stride(bhsd ? 2 : 1);
  kv.lengths = lengths.data_ptr<std::int32_t>();
  return kv;
}

template <class T>
kvsift::PagedKV<T> paged_view(const at::Tensor& k, const at::Tensor& v, const at::Tensor& block_table,
                              const at::Tensor& lengths, const DecodeCall& c) {
  const char* op = "decode_attention";
  const bool nhd = c.layout == KvLayout::kNHD;
  const std::int64_t page_size = k.size(nhd ? 1 : 2), H = c.num_kv_heads, D = c.head_dim;
  // kvsift's pages are dense inside ([page_size, H, D] or [H, page_size, D]) at one page_stride
  // shared by the K and V pools; only the page dimension may be strided (e.g. K and V interleaved).
  const std::int64_t inner[2] = {nhd ? H * D : page_size * D, D};
  for (const at::Tensor* t : {&k, &v}) {
    const char* name = t == &k ? "k_cache" : "v_cache";
    TORCH_CHECK_VALUE((t->size(1) <= 1 || t->stride(1) == inner[0]) && (t->size(2) <= 1 || t->stride(2) == inner[1]),
                      "kvsift.", op, ": ", name, " must be dense inside a page (strides ", t->strides(),
                      "); only the page dimension may be strided");
  }
  TORCH_CHECK_VALUE(k.size(0) <= 1 || v.stride(0) == k.stride(0), "kvsift.", op, ": k_cache and v_cache page strides ",
                    k.stride(0), " and ", v.stride(0), " must be equal");
  auto kv = kvsift::make_paged<T>(static_cast<T*>(k.data_ptr()), static_cast<T*>(v.data_ptr()),
                                  block_table.data_ptr<std::int32_t>(), c.batch,
                                  to_int(block_table.size(1), op, "block_table.size(1)"),
                                  to_int(k.size(0), op, "number of pages"), c.num_kv_heads,
                                  to_int(page_size, op, "page_size"), c.head_dim,
                                  nhd ? kvsift::PageLayout::kNHD : kvsift::PageLayout::kHND,
                                  lengths.data_ptr<std::int32_t>());
  if (k.size(0) > 1) kv.page_stride = k.stride(0);
  kv.block_table_stride = c.batch <= 1 ? block_table.size(1) : block_table.stride(0);
  return kv;
}

// ---- compress_prompt ----

/// One compress_prompt call: the config and shape, the output tensors and the host/device-independent
/// pieces of the views. The KV cache is contiguous, "BHSD" (k [B, H_kv, S, D], queries [B, H_q, W, D])
/// or "BSHD" (k [B, S, H_kv, D], queries [B, W, H_q, D]); the outputs keep the layout with Cp slots
/// and H_out heads (H_kv, or H_q with heads = "query_head").
struct CompressCall {
  KvLayout layout = KvLayout::kBHSD;
  kvsift::PromptCompressionConfig config;
  kvsift::PromptCompressionShape shape;
  int out_heads = 0, head_dim = 0, q_capacity = 0;
  at::Tensor k_out, v_out;    ///< the compacted cache, zero past each sequence's new length
  at::Tensor new_lengths;     ///< [B] int32
  at::Tensor positions;       ///< [B, H_out, Cp] int32: the original position of each slot, -1 when empty
  at::Tensor dst_lengths;     ///< [B] int32 = Cp: the destination view's lengths (its capacity)
  const float* lse = nullptr;
};

inline kvsift::CompressionPolicy parse_policy(const std::string& s, const char* op) {
  if (s == "ClusterAttn") return kvsift::CompressionPolicy::kClusterAttn;
  if (s == "SnapKV") return kvsift::CompressionPolicy::kSnapKV;
  if (s == "StreamingLLM") return kvsift::CompressionPolicy::kStreamingLLM;
  if (s == "H2O-prefill" || s == "H2O") return kvsift::CompressionPolicy::kH2OPrefill;
  TORCH_CHECK_VALUE(false, "kvsift.", op, ": policy = '", s,
                    "' must be 'ClusterAttn', 'SnapKV', 'StreamingLLM' or 'H2O-prefill'");
}

inline CompressCall prepare_compress(const at::Tensor& k_cache, const at::Tensor& v_cache,
                                     const at::Tensor& kv_lengths, const at::Tensor& queries,
                                     const std::string& policy, std::int64_t capacity, std::int64_t window,
                                     const std::string& kv_layout, c10::optional<double> sm_scale,
                                     const std::string& heads, const c10::optional<at::Tensor>& lse,
                                     std::int64_t num_block, double theta, const std::string& block_rule,
                                     const std::string& radius_rule, std::int64_t fixed_radius,
                                     const std::string& pool, std::int64_t pool_kernel, std::int64_t sinks) {
  const char* op = "compress_prompt";
  CompressCall c;
  c.layout = parse_kv_layout(kv_layout, op);
  TORCH_CHECK_VALUE(!is_paged(c.layout), "kvsift.", op, ": kv_layout = '", kv_layout,
                    "' is paged; compress_prompt takes a contiguous 'BHSD' or 'BSHD' cache");
  kvsift::PromptCompressionConfig& cfg = c.config;
  cfg.policy = parse_policy(policy, op);
  cfg.capacity = to_int(capacity, op, "capacity");
  cfg.window = to_int(window, op, "window");
  cfg.sm_scale = sm_scale ? float(*sm_scale) : 0.f;
  if (heads == "kv_head_mean") cfg.heads = kvsift::ScoreHeads::kKvHeadMean;
  else if (heads == "query_head") cfg.heads = kvsift::ScoreHeads::kQueryHead;
  else TORCH_CHECK_VALUE(false, "kvsift.", op, ": heads = '", heads, "' must be 'kv_head_mean' or 'query_head'");
  cfg.num_block = to_int(num_block, op, "num_block");
  cfg.theta = float(theta);
  if (block_rule == "prefix_split") cfg.block_rule = kvsift::BlockRule::kPrefixSplit;
  else if (block_rule == "budget_split") cfg.block_rule = kvsift::BlockRule::kBudgetSplit;
  else TORCH_CHECK_VALUE(false, "kvsift.", op, ": block_rule = '", block_rule, "' must be 'prefix_split' or 'budget_split'");
  if (radius_rule == "half_block") cfg.radius_rule = kvsift::RadiusRule::kHalfBlock;
  else if (radius_rule == "budget_blocks") cfg.radius_rule = kvsift::RadiusRule::kBudgetBlocks;
  else if (radius_rule == "fixed") cfg.radius_rule = kvsift::RadiusRule::kFixed;
  else TORCH_CHECK_VALUE(false, "kvsift.", op, ": radius_rule = '", radius_rule,
                         "' must be 'half_block', 'budget_blocks' or 'fixed'");
  cfg.fixed_radius = to_int(fixed_radius, op, "fixed_radius");
  if (pool == "max") cfg.pool.kind = kvsift::PoolKind::kMax;
  else if (pool == "avg") cfg.pool.kind = kvsift::PoolKind::kAvg;
  else TORCH_CHECK_VALUE(false, "kvsift.", op, ": pool = '", pool, "' must be 'max' or 'avg'");
  cfg.pool.kernel = to_int(pool_kernel, op, "pool_kernel");
  cfg.sinks = to_int(sinks, op, "sinks");
  throw_if_error(kvsift::validate(cfg), op);

  const c10::Device device = k_cache.device();
  check_tensor(k_cache, op, "k_cache", 4, device, {at::kFloat, at::kHalf, at::kBFloat16});
  check_tensor(v_cache, op, "v_cache", 4, device, {k_cache.scalar_type()});
  check_tensor(queries, op, "queries", 4, device, {k_cache.scalar_type()});
  check_rows_contiguous(k_cache, op, "k_cache");
  check_rows_contiguous(v_cache, op, "v_cache");
  check_rows_contiguous(queries, op, "queries");
  TORCH_CHECK_VALUE(v_cache.sizes() == k_cache.sizes(), "kvsift.", op, ": v_cache shape ", v_cache.sizes(),
                    " must equal k_cache shape ", k_cache.sizes());
  const bool bhsd = c.layout == KvLayout::kBHSD;
  const int batch = to_int(k_cache.size(0), op, "k_cache.size(0)");
  const int kv_heads = to_int(k_cache.size(bhsd ? 1 : 2), op, "num_kv_heads");
  const int prompt = to_int(k_cache.size(bhsd ? 2 : 1), op, "k_cache prompt capacity");
  c.head_dim = to_int(k_cache.size(3), op, "k_cache.size(3)");
  TORCH_CHECK_VALUE(queries.size(0) == batch, "kvsift.", op, ": queries batch ", queries.size(0),
                    " must equal k_cache batch ", batch);
  TORCH_CHECK_VALUE(queries.size(3) == c.head_dim, "kvsift.", op, ": queries head_dim ", queries.size(3),
                    " must equal k_cache head_dim ", c.head_dim);
  const int q_heads = to_int(queries.size(bhsd ? 1 : 2), op, "num_q_heads");
  c.q_capacity = to_int(queries.size(bhsd ? 2 : 1), op, "queries rows");
  check_int_vector(kv_lengths, op, "kv_lengths", batch, device);
  c.shape = kvsift::PromptCompressionShape{batch, kv_heads, q_heads, prompt};
  throw_if_error(kvsift::validate(cfg, c.shape), op);
  if (lse) {
    check_tensor(*lse, op, "lse", 3, device, {at::kFloat});
    TORCH_CHECK_VALUE(lse->size(0) == batch && lse->size(1) == q_heads && lse->size(2) == c.q_capacity &&
                          lse->is_contiguous(),
                      "kvsift.", op, ": lse must be a contiguous float32 [B, H_q, queries rows] = [", batch, ", ",
                      q_heads, ", ", c.q_capacity, "] tensor (got shape ", lse->sizes(), ")");
    c.lse = lse->data_ptr<float>();
  }
  c.out_heads = c.shape.score_heads(cfg);
  const std::int64_t slots = cfg.capacity;
  const auto shape = bhsd ? std::vector<std::int64_t>{batch, c.out_heads, slots, c.head_dim}
                          : std::vector<std::int64_t>{batch, slots, c.out_heads, c.head_dim};
  c.k_out = at::zeros(shape, k_cache.options());
  c.v_out = at::zeros(shape, k_cache.options());
  c.new_lengths = at::empty({batch}, kv_lengths.options());
  c.positions = at::full({batch, c.out_heads, slots}, -1, kv_lengths.options());
  c.dst_lengths = at::full({batch}, slots, kv_lengths.options());
  return c;
}


template <class T>
kvsift::QueryRows<T> compress_queries(const at::Tensor& q, const CompressCall& c) {
  const bool bhsd = c.layout == KvLayout::kBHSD;
  kvsift::QueryRows<T> rows;
  rows.data = static_cast<const T*>(q.data_ptr());
  rows.num_heads = c.shape.num_q_heads;
  rows.capacity = c.q_capacity;
  rows.batch_stride = q.stride(0);
  rows.position_stride = q.stride(bhsd ? 2 : 1);
  rows.head_stride = q.stride(bhsd ? 1 : 2);
  return rows;
}

inline kvsift::CompactOutputs compress_outputs(const CompressCall& c) {
  return kvsift::CompactOutputs{c.new_lengths.data_ptr<std::int32_t>(), c.positions.data_ptr<std::int32_t>(),
                                c.config.capacity};
}

// ---- head roles ----

/// The roles file's text (gates/roles_file.hpp) as a bool [layers, kv_heads] tensor, true = retrieval.
inline at::Tensor parse_head_roles_op(c10::string_view text, std::int64_t expected_layers, std::int64_t expected_kv_heads) {
  const char* op = "parse_head_roles";
  kvsift::HeadRoles roles;
  throw_if_error(kvsift::parse_head_roles(std::string(text), &roles, to_int(expected_layers, op, "expected_layers"),
                                          to_int(expected_kv_heads, op, "expected_kv_heads")),
                 op);
  at::Tensor out = at::empty({roles.layers, roles.kv_heads}, at::TensorOptions().dtype(at::kBool));
  bool* p = out.data_ptr<bool>();
  for (int l = 0; l < roles.layers; ++l)
    for (int h = 0; h < roles.kv_heads; ++h) p[std::int64_t(l) * roles.kv_heads + h] = roles.is_retrieval(l, h);
  return out;
}

/// The roles file's text for a bool [layers, kv_heads] CPU tensor (true = retrieval).
inline std::string format_head_roles_op(const at::Tensor& retrieval) {
  const char* op = "format_head_roles";
  check_tensor(retrieval, op, "retrieval", 2, c10::Device(c10::kCPU), {at::kBool});
  const at::Tensor r = retrieval.contiguous();
  const int layers = to_int(r.size(0), op, "layers"), kv_heads = to_int(r.size(1), op, "kv_heads");
  std::vector<std::uint8_t> bytes(std::size_t(layers) * std::size_t(kv_heads));
  const bool* p = r.data_ptr<bool>();
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = p[i] ? 1 : 0;
  kvsift::HeadRoles roles;
  throw_if_error(kvsift::make_head_roles(layers, kv_heads, bytes.data(), &roles), op);
  return kvsift::format_head_roles(roles);
}

}  // namespace kvsift_torch
