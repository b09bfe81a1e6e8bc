#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "kvsift/core/workspace.hpp"

namespace {
// One description used for both the sizing and the carving pass, as launchers do.
struct Carved {
  float* a;
  int* b;
  double* c;
};
Carved describe(kvsift::WorkspaceCarver& ws, std::size_t n) {
  return Carved{ws.take<float>(n), ws.take<int>(3), ws.take<double>(n * 2)};
}
}  // namespace

TEST_CASE("workspace: sizing pass needs no memory and matches the carving pass") {
  for (std::size_t n : {0u, 1u, 63u, 64u, 65u, 1000u}) {
    kvsift::WorkspaceCarver sizing(nullptr, 0);
    const Carved none = describe(sizing, n);
    CHECK(none.a == nullptr);
    CHECK(sizing.status().ok());
    const std::size_t bytes = sizing.required_bytes();
    CHECK(bytes % kvsift::kWorkspaceAlignment == 0);
    CHECK(bytes >= n * 4 + 12 + n * 16);

    // Aligned base inside a larger host buffer.
    std::vector<unsigned char> storage(bytes + 2 * kvsift::kWorkspaceAlignment);
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    auto* base = reinterpret_cast<void*>(kvsift::align_up(addr));
    kvsift::WorkspaceCarver carve(base, bytes);
    const Carved got = describe(carve, n);
    REQUIRE(carve.status().ok());
    CHECK(carve.required_bytes() == bytes);
    for (const void* p : {static_cast<const void*>(got.a), static_cast<const void*>(got.b),
                          static_cast<const void*>(got.c)})
      CHECK(reinterpret_cast<std::uintptr_t>(p) % kvsift::kWorkspaceAlignment == 0);
    // Sub-buffers do not overlap and stay inside the buffer.
    const auto* lo = static_cast<unsigned char*>(base);
    CHECK(reinterpret_cast<unsigned char*>(got.a) >= lo);
    CHECK(reinterpret_cast<unsigned char*>(got.b) >= reinterpret_cast<unsigned char*>(got.a + n));
    CHECK(reinterpret_cast<unsigned char*>(got.c) >= reinterpret_cast<unsigned char*>(got.b + 3));
    CHECK(reinterpret_cast<unsigned char*>(got.c + 2 * n) <= lo + bytes);
  }
}

TEST_CASE("workspace: too small or misaligned buffers are reported") {
  kvsift::WorkspaceCarver sizing(nullptr, 0);
  describe(sizing, 100);
  const std::size_t bytes = sizing.required_bytes();
  std::vector<unsigned char> storage(bytes + 2 * kvsift::kWorkspaceAlignment);
  auto* base = reinterpret_cast<unsigned char*>(kvsift::align_up(reinterpret_cast<std::uintptr_t>(storage.data())));

  kvsift::WorkspaceCarver small(base, bytes - 1);
  describe(small, 100);
  CHECK(small.status().code() == kvsift::StatusCode::kInsufficientSpace);
  CHECK(small.status().message().find("workspace.bytes") != std::string::npos);

  kvsift::WorkspaceCarver shifted(base + 4, bytes);
  describe(shifted, 100);
  CHECK(shifted.status().code() == kvsift::StatusCode::kMisaligned);
}
