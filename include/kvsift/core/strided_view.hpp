#pragma once
/// \file
/// \brief A 2-D strided view: `rows` rows of `cols` elements, row r starting at data + r * row_stride.
/// Used for batched score matrices and other row-major inputs whose rows may be padded.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"

namespace kvsift {

/// `rows` x `cols` elements, row r at data + r * row_stride, in the Exec's memory space; a view,
/// passed by value. validate() is the host-side check.
template <class T>
struct StridedView2D {
  T* data = nullptr;      ///< element (0, 0); may be null when the view is empty
  std::int64_t rows = 0;  ///< number of rows, >= 0
  std::int64_t cols = 0;  ///< elements per row, >= 0
  std::int64_t row_stride = 0;  ///< in elements

  /// The first element of row `r`; no bounds check.
  KVSIFT_HD T* row(std::int64_t r) const { return data + r * row_stride; }
  /// Element (r, c); no bounds check.
  KVSIFT_HD T& operator()(std::int64_t r, std::int64_t c) const { return data[r * row_stride + c]; }

  /// Host-side check; `name` prefixes each message ("scores.row_stride = 3 ...").
  Status validate(const char* name) const {
    KVSIFT_REQUIRE(rows >= 0, kInvalidArgument, name, ".rows = ", rows, " must be >= 0");
    KVSIFT_REQUIRE(cols >= 0, kInvalidArgument, name, ".cols = ", cols, " must be >= 0");
    KVSIFT_REQUIRE(rows <= 1 || row_stride >= cols, kInvalidArgument, name, ".row_stride = ", row_stride,
                   " must be >= cols = ", cols);
    KVSIFT_REQUIRE(rows * cols == 0 || data != nullptr, kNullPointer, name, ".data is null");
    return Status();
  }
};

/// A view of `rows` x `cols` elements; `row_stride` < 0 (the default) means densely packed rows (cols).
template <class T>
StridedView2D<T> make_strided_view(T* data, std::int64_t rows, std::int64_t cols, std::int64_t row_stride = -1) {
  return StridedView2D<T>{data, rows, cols, row_stride < 0 ? cols : row_stride};
}

}  // namespace kvsift
