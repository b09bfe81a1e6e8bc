#include <doctest/doctest.h>

#include "kvsift/core/check.hpp"

namespace {
kvsift::Status needs_positive(int k) {
  KVSIFT_REQUIRE(k > 0, kInvalidArgument, "k = ", k, " must be > 0");
  return kvsift::Status();
}
kvsift::Status chained(int k) {
  KVSIFT_TRY(needs_positive(k));
  return kvsift::make_status(kvsift::StatusCode::kInternal, "reached");
}
}  // namespace

TEST_CASE("Status: ok by default, readable when not") {
  kvsift::Status ok;
  CHECK(ok.ok());
  CHECK(static_cast<bool>(ok));
  CHECK(ok.to_string() == "ok");

  const kvsift::Status bad = needs_positive(-3);
  CHECK_FALSE(bad.ok());
  CHECK(bad.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(bad.message() == "k = -3 must be > 0");
  CHECK(bad.to_string() == "invalid argument: k = -3 must be > 0");
}

TEST_CASE("KVSIFT_TRY propagates the first error and continues on success") {
  CHECK(chained(-1).code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(chained(2).code() == kvsift::StatusCode::kInternal);
}

TEST_CASE("every status code has a name") {
  for (int c = 0; c <= static_cast<int>(kvsift::StatusCode::kInternal); ++c)
    CHECK(std::string(kvsift::to_string(static_cast<kvsift::StatusCode>(c))) != "unknown");
}
