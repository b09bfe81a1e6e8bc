// The host-only umbrella must compile with a plain C++17 compiler and no CUDA headers on the path.
#include "kvsift/kvsift.hpp"

#include <doctest/doctest.h>

#if defined(__CUDACC__) || defined(CUDART_VERSION)
#error "kvsift.hpp pulled in CUDA: the host-only umbrella must not"
#endif

TEST_CASE("kvsift.hpp is usable without the CUDA toolkit") {
  CHECK(kvsift::kVersionMajor == KVSIFT_VERSION_MAJOR);
  kvsift::host::Exec exec;
  (void)exec;
  CHECK(kvsift::is_host_exec<kvsift::host::Exec>::value);
}
