#include <doctest/doctest.h>

#include <vector>

#include "kvsift/kv/index_set.hpp"

TEST_CASE("IndexSet rows, clamped counts and validation") {
  std::vector<std::int32_t> idx(3 * 8), counts = {2, -1, 50};
  auto s = kvsift::make_index_set(idx.data(), counts.data(), 3, 8);
  REQUIRE(s.validate().ok());
  CHECK(s.row(2) == idx.data() + 16);
  CHECK(s.count(0) == 2);
  CHECK(s.count(1) == 0);
  CHECK(s.count(2) == 8);
  const kvsift::ConstIndexSet c = kvsift::as_const(s);
  CHECK(c.row(1) == idx.data() + 8);

  auto blocks = kvsift::make_index_set(idx.data(), counts.data(), 3, 8, kvsift::Granularity::kBlock, 64);
  CHECK(blocks.validate().ok());
  blocks.block_size = 48;
  CHECK(blocks.validate("sel").message() == "sel.block_size = 48 must be a power of two");
  auto bad = s;
  bad.row_stride = 4;
  CHECK(bad.validate().message() == "index_set.row_stride = 4 must be >= capacity = 8");
  bad = s;
  bad.counts = nullptr;
  CHECK(bad.validate().message() == "index_set.counts is null");
  bad = s;
  bad.block_size = 2;
  CHECK(bad.validate().message() == "index_set.block_size = 2 must be 1 for token granularity");
}
