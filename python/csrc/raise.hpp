#pragma once
// How the extension raises its Python exceptions: c10 exception types (so torch maps them to
// ValueError / NotImplementedError / RuntimeError), built from the message alone, with no C++
// backtrace.
//
// Why not TORCH_CHECK_VALUE and friends: they construct c10::Error from a SourceLocation, which
// captures a backtrace with the libgcc unwinder at the throw. On the H200 machine (torch
// 2.11.0+cu130, Ubuntu 24.04, GCC 13) every error raised from this extension killed the process with
// SIGSEGV inside that call, for CPU tensors as well as CUDA ones and whichever g++ built the
// extension, while the same code raised cleanly on a Debian machine with GCC 12 (the libgcc frame
// search crash of pytorch#117645 looks the same). The message names the op and the argument; a trace
// of kvsift's own frames adds nothing a Python user can act on.

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

/// Throws ErrorType(c10::str(args...)) unless `cond` holds.
#define KVSIFT_PY_RAISE_UNLESS(ErrorType, cond, ...)             \
  do {                                                           \
    if (C10_UNLIKELY(!(cond))) throw ErrorType(::c10::str(__VA_ARGS__)); \
  } while (0)

/// An argument problem: ValueError in Python.
#define KVSIFT_PY_CHECK_VALUE(cond, ...) KVSIFT_PY_RAISE_UNLESS(::c10::ValueError, cond, __VA_ARGS__)
