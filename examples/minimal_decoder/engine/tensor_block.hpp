#pragma once
// A rectangular block of a row-major matrix, as the flat indices of the full matrix it covers. A
// tensor-parallel rank's slice of a weight (tensor_parallel.hpp) is one: whole rows for the
// column-parallel matrices, a range of columns of every row for the row-parallel ones. The device
// random generator (random_device_layout.hpp) draws element i of a block from the full matrix's index
// global_index(i), so a rank generates exactly the values of its slice of the unsharded tensor; the
// index arithmetic runs on both sides (the kernel, and the host test that checks it against
// shard_weights).

#include <cstdint>

#include <kvsift/core/config.hpp>

namespace minimal_decoder {

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a matrix whose rows are full_cols long;
// the block itself is stored row-major, [rows, cols].
struct TensorBlock {
  std::int64_t row0 = 0, rows = 0;
  std::int64_t col0 = 0, cols = 0;
  std::int64_t full_cols = 0;

  // The whole [rows, cols] matrix: global_index(i) == i.
  static TensorBlock whole(std::int64_t rows, std::int64_t cols) { return {0, rows, 0, cols, cols}; }
  // Rows [first, first + count) of a matrix of `cols` columns.
  static TensorBlock row_range(std::int64_t first, std::int64_t count, std::int64_t cols) {
    return {first, count, 0, cols, cols};
  }
  // Columns [first, first + count) of every row of a [rows, full_cols] matrix.
  static TensorBlock col_range(std::int64_t rows, std::int64_t full_cols, std::int64_t first, std::int64_t count) {
    return {0, rows, first, count, full_cols};
  }

  KVSIFT_HD std::int64_t elements() const { return rows * cols; }
  // The full matrix's flat index of the block's element i (0 <= i < elements()).
  KVSIFT_HD std::int64_t global_index(std::int64_t i) const { return (row0 + i / cols) * full_cols + col0 + i % cols; }
};

}  // namespace minimal_decoder
