#include <doctest/doctest.h>

#include <vector>

#include "kvsift/core/strided_view.hpp"

TEST_CASE("StridedView2D addresses padded rows and validates its shape") {
  std::vector<int> data(5 * 7);
  for (int i = 0; i < 35; ++i) data[i] = i;
  auto v = kvsift::make_strided_view(data.data(), 5, 4, 7);
  CHECK(v(0, 0) == 0);
  CHECK(v(3, 2) == 23);
  CHECK(v.row(4)[3] == 31);
  CHECK(v.validate("scores").ok());

  auto bad = v;
  bad.row_stride = 3;
  CHECK(bad.validate("scores").message() == "scores.row_stride = 3 must be >= cols = 4");
  bad = v;
  bad.data = nullptr;
  CHECK(bad.validate("scores").code() == kvsift::StatusCode::kNullPointer);
  bad = v;
  bad.cols = -1;
  CHECK(bad.validate("scores").code() == kvsift::StatusCode::kInvalidArgument);
}
