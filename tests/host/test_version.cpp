// The version has one source, include/kvsift/version.hpp; CMake parses it before project(). This test
// gets CMake's PROJECT_VERSION as compile definitions (tests/CMakeLists.txt) and checks that the header,
// the umbrella's constants and CMake all say the same thing.
#include "kvsift/kvsift.hpp"   // kvsift::kVersionMajor/Minor/Patch (version.hpp, through the umbrella)
#include "kvsift/version.hpp"  // included second: a differing value would redefine the macros below

#include <doctest/doctest.h>

#include <cstring>
#include <string>

#ifndef KVSIFT_CMAKE_VERSION
#error "tests/CMakeLists.txt passes KVSIFT_CMAKE_VERSION (and _MAJOR/_MINOR/_PATCH) from PROJECT_VERSION"
#endif

static_assert(KVSIFT_VERSION_MAJOR == KVSIFT_CMAKE_VERSION_MAJOR, "version.hpp major != CMake PROJECT_VERSION_MAJOR");
static_assert(KVSIFT_VERSION_MINOR == KVSIFT_CMAKE_VERSION_MINOR, "version.hpp minor != CMake PROJECT_VERSION_MINOR");
static_assert(KVSIFT_VERSION_PATCH == KVSIFT_CMAKE_VERSION_PATCH, "version.hpp patch != CMake PROJECT_VERSION_PATCH");

TEST_CASE("version.hpp agrees with the CMake project version") {
  CHECK(std::string(KVSIFT_VERSION_STRING) == KVSIFT_CMAKE_VERSION);
  CHECK(std::string(kvsift::kVersionString) == KVSIFT_CMAKE_VERSION);
  CHECK(KVSIFT_VERSION == KVSIFT_CMAKE_VERSION_MAJOR * 10000 + KVSIFT_CMAKE_VERSION_MINOR * 100 + KVSIFT_CMAKE_VERSION_PATCH);
}

TEST_CASE("the umbrella's version constants agree with version.hpp") {
  CHECK(kvsift::kVersionMajor == KVSIFT_VERSION_MAJOR);
  CHECK(kvsift::kVersionMinor == KVSIFT_VERSION_MINOR);
  CHECK(kvsift::kVersionPatch == KVSIFT_VERSION_PATCH);
  const std::string from_constants = std::to_string(kvsift::kVersionMajor) + "." +
                                     std::to_string(kvsift::kVersionMinor) + "." +
                                     std::to_string(kvsift::kVersionPatch);
  CHECK(from_constants == KVSIFT_VERSION_STRING);
}
