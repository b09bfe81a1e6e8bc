#pragma once
/// \file
/// \brief Query rows in, attention rows out: the tensors an attention op reads its queries from and writes its
/// outputs to, as the engine lays them out. One row is head_dim contiguous elements; rows are addressed
/// by (sequence b, position i, head h) through element strides, so [B, S, H, D], [B, H, S, D], a
/// slice of a fused QKV buffer or padded rows all describe themselves without a copy.
///
///   QueryRows<T>   const rows (queries): window scoring, decode attention, attention similarity
///   OutputRows<T>  writable rows (attention outputs)
///   QueryIO<T>     the queries, the outputs and an optional log-sum-exp of one attention call;
///                  shared by decode_attention and the LycheeDecode policy, passed down unchanged.

#include <cstdint>

#include "kvsift/core/config.hpp"

namespace kvsift {

/// Const query rows `[batch, positions, heads, head_dim]` through element strides, `head_dim`
/// contiguous; the memory space is the Exec's. A trivially copyable view, passed to kernels by value.
template <class T>
struct QueryRows {
  const T* data = nullptr;  ///< element (0, 0, 0, 0)
  int num_heads = 0;        ///< query heads per position
  int capacity = 0;  ///< positions per sequence the tensor holds
  /// \var position_stride
  /// Elements between consecutive positions of a sequence.

  /// Elements between consecutive sequences. The three strides may describe any layout: [B, S, H, D],
  /// [B, H, S, D], a slice of a fused QKV buffer, padded rows.
  std::int64_t batch_stride = 0, position_stride = 0, head_stride = 0;  ///< head_stride: between heads

  /// The head_dim elements of sequence `b`, position `i`, head `h`; no bounds check.
  KVSIFT_HD const T* row(int b, int i, int h) const {
    return data + b * batch_stride + i * position_stride + h * head_stride;
  }
};

/// Writable rows of the same shape as QueryRows (attention outputs); the shape comes from the op's
/// parameters, so only the pointer and the strides are stored.
template <class T>
struct OutputRows {
  T* data = nullptr;  ///< element (0, 0, 0, 0)
  /// \var position_stride
  /// Elements between consecutive positions of a sequence.

  /// Elements between consecutive sequences.
  std::int64_t batch_stride = 0, position_stride = 0, head_stride = 0;  ///< head_stride: between heads

  /// The head_dim elements of sequence `b`, position `i`, head `h`; no bounds check.
  KVSIFT_HD T* row(int b, int i, int h) const { return data + b * batch_stride + i * position_stride + h * head_stride; }
};

/// Rows of a dense [batch, positions, num_heads, head_dim] tensor (a Q projection's layout).
template <class T>
QueryRows<T> make_query_rows(const T* data, int positions, int num_heads, int head_dim) {
  QueryRows<T> q;
  q.data = data;
  q.num_heads = num_heads;
  q.capacity = positions;
  q.head_stride = head_dim;
  q.position_stride = std::int64_t(num_heads) * head_dim;
  q.batch_stride = std::int64_t(positions) * num_heads * head_dim;
  return q;
}

/// Rows of a dense, writable [batch, positions, num_heads, head_dim] tensor.
template <class T>
OutputRows<T> make_output_rows(T* data, int positions, int num_heads, int head_dim) {
  const QueryRows<T> dense = make_query_rows<T>(data, positions, num_heads, head_dim);
  return OutputRows<T>{data, dense.batch_stride, dense.position_stride, dense.head_stride};
}

/// The query rows, output rows and optional log-sum-exp of one attention call: the engine builds one
/// per layer call, the policy hands it to the op unchanged, and the op to its kernel.
template <class T>
struct QueryIO {
  QueryRows<T> q;        ///< [batch, q_len, num_q_heads, head_dim] queries
  OutputRows<T> out;     ///< same shape as q
  float* lse = nullptr;  ///< optional [batch, q_len, num_q_heads] (dense), natural log of the softmax sum
};

/// q and out dense [batch, q_len, num_q_heads, head_dim]; lse optional.
template <class T>
QueryIO<T> make_query_io(const T* q, T* out, int q_len, int num_q_heads, int head_dim, float* lse = nullptr) {
  return QueryIO<T>{make_query_rows(q, q_len, num_q_heads, head_dim), make_output_rows(out, q_len, num_q_heads, head_dim),
                    lse};
}

}  // namespace kvsift
