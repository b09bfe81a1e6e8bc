#pragma once
/// \file
/// \brief The kvsift version: the one place it is written.
///
/// The three numbers below are the single source of the version. The top-level CMakeLists.txt reads
/// them with `file(STRINGS)` before `project()`, so `PROJECT_VERSION`, the installed
/// `kvsiftConfigVersion.cmake` (what `find_package(kvsift 0.1)` checks) and this header cannot
/// disagree; a plain `#include <kvsift/version.hpp>` from the source tree needs no configure step.
/// To release, change the numbers here and add a section to CHANGELOG.md.
///
/// Keep each `#define KVSIFT_VERSION_{MAJOR,MINOR,PATCH} <number>` on a line of its own, exactly in
/// that form: CMake parses these lines.

/// Major version: incremented on incompatible API changes.
#define KVSIFT_VERSION_MAJOR 0
/// Minor version: incremented on backwards-compatible additions.
#define KVSIFT_VERSION_MINOR 1
/// Patch version: incremented on backwards-compatible fixes.
#define KVSIFT_VERSION_PATCH 0

/// \cond KVSIFT_INTERNAL
#define KVSIFT_VERSION_STRINGIFY_IMPL(x) #x
#define KVSIFT_VERSION_STRINGIFY(x) KVSIFT_VERSION_STRINGIFY_IMPL(x)
/// \endcond

/// The version as a string literal, "MAJOR.MINOR.PATCH" (e.g. "0.1.0"), built from the three numbers.
#define KVSIFT_VERSION_STRING                                                                   \
  KVSIFT_VERSION_STRINGIFY(KVSIFT_VERSION_MAJOR)                                                \
  "." KVSIFT_VERSION_STRINGIFY(KVSIFT_VERSION_MINOR) "." KVSIFT_VERSION_STRINGIFY(KVSIFT_VERSION_PATCH)

/// The version as one number for preprocessor comparisons: MAJOR * 10000 + MINOR * 100 + PATCH
/// (0.1.0 is 100), e.g. `#if KVSIFT_VERSION >= 200` for "0.2.0 or later".
#define KVSIFT_VERSION (KVSIFT_VERSION_MAJOR * 10000 + KVSIFT_VERSION_MINOR * 100 + KVSIFT_VERSION_PATCH)

namespace kvsift {
/// KVSIFT_VERSION_MAJOR as a constant.
inline constexpr int kVersionMajor = KVSIFT_VERSION_MAJOR;
/// KVSIFT_VERSION_MINOR as a constant.
inline constexpr int kVersionMinor = KVSIFT_VERSION_MINOR;
/// KVSIFT_VERSION_PATCH as a constant.
inline constexpr int kVersionPatch = KVSIFT_VERSION_PATCH;
/// The version string, KVSIFT_VERSION_STRING, as a constant for code that prefers one to a macro.
inline constexpr char kVersionString[] = KVSIFT_VERSION_STRING;
}  // namespace kvsift
