#pragma once
/// \file
/// \brief What a CUDA kernel does with engine data it cannot use (a block-table entry outside the page
/// pool, an index entry outside the sequence, a count outside the index set's capacity): it ignores the
/// item in a defined way (docs/integration.md, "What kvsift does with bad engine data") and, when the
/// engine asked for it, records the first such item in a `DataError` in device memory. The record is
/// written by the kernels without any host round trip; the engine reads it whenever it likes (after a
/// step, once per second, in debug builds only) and `data_error_status` turns it into a `Status`.
///
/// The host backend needs none of this: its ops check the same data before they read it and return the
/// `Status` directly.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/status.hpp"

namespace kvsift {

/// The op whose kernel found the item.
enum class DataErrorOp : std::int32_t {
  kNone = 0,             ///< nothing recorded
  kDecodeAttention = 1,  ///< decode_attention (dense, gathered and mixed heads)
  kStoreKv = 2,          ///< store_kv
  kCopyKvToDense = 3,    ///< copy_kv_to_dense
  kCompactKv = 4,        ///< compact_kv
  kWindowScores = 5,     ///< window_scores (prompt compression's observation-window scores)
  kAttentionCosine = 6,  ///< attention_cosine (prompt compression's fidelity measure)
};

/// What was wrong with it.
enum class DataErrorKind : std::int32_t {
  kNone = 0,             ///< nothing recorded
  kPageOutOfPool = 1,    ///< a block-table entry outside [0, num_pages): the token is skipped
  kIndexOutOfRange = 2,  ///< an index-set entry outside the sequence (or negative): the entry is skipped
  kCountOutOfRange = 3,  ///< an index-set count outside [0, capacity]: clamped into it
};

/// The first bad item a kernel met since the engine last zeroed the record (state 0). Device memory;
/// zero it once (cudaMemsetAsync, or kvsift::cuda::zero_memory) and hand its address to the ops
/// through `cuda::Exec::data_error`. Later items leave it as it is, so it always describes the first.
struct DataError {
  std::int32_t state = 0;  ///< 0 nothing recorded; 1 a kernel is writing it; 2 recorded
  DataErrorOp op = DataErrorOp::kNone;        ///< the op whose kernel met the item
  DataErrorKind kind = DataErrorKind::kNone;  ///< what was wrong with it
  std::int32_t batch = -1;     ///< the sequence
  std::int32_t row = -1;       ///< the KV head (decode attention: of the index row b * num_kv_heads + h)
  std::int32_t position = -1;  ///< the token position, index entry or page slot the item was met at
  std::int64_t value = 0;      ///< the bad page id, index entry or count
};

/// The op's name as the messages of data_error_status write it ("decode_attention", ...).
inline const char* data_error_op_name(DataErrorOp op) {
  switch (op) {
    case DataErrorOp::kDecodeAttention: return "decode_attention";
    case DataErrorOp::kStoreKv: return "store_kv";
    case DataErrorOp::kCopyKvToDense: return "copy_kv_to_dense";
    case DataErrorOp::kCompactKv: return "compact_kv";
    case DataErrorOp::kWindowScores: return "window_scores";
    case DataErrorOp::kAttentionCosine: return "attention_cosine";
    default: return "an op";
  }
}

/// A host copy of the record as a Status: ok when nothing was recorded, otherwise kInvalidArgument
/// naming the op, the item and what the kernel did with it.
inline Status data_error_status(const DataError& e) {
  if (e.state == 0) return Status();
  const char* op = data_error_op_name(e.op);
  switch (e.kind) {
    case DataErrorKind::kPageOutOfPool:
      return invalid_argument(op, ": kv.block_table entry ", e.value, " of sequence ", e.batch, " (token ",
                              e.position, ", KV head ", e.row,
                              ") is outside the page pool; its tokens were skipped");
    case DataErrorKind::kIndexOutOfRange:
      return invalid_argument(op, ": index_set entry ", e.position, " of sequence ", e.batch, ", KV head ",
                              e.row, " = ", e.value, " is outside the sequence; it was skipped");
    case DataErrorKind::kCountOutOfRange:
      return invalid_argument(op, ": index_set count of sequence ", e.batch, ", KV head ", e.row, " = ",
                              e.value, " is outside [0, capacity]; it was clamped");
    default:
      return invalid_argument(op, ": a data error of unknown kind ", std::int32_t(e.kind), " (state ",
                              e.state, ")");
  }
}

}  // namespace kvsift
