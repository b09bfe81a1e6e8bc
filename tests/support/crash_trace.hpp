// A stack trace on stderr when a test process dies of a signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGABRT), then the default action. Why: a host-side crash under compute-sanitizer (the decoder
// test's graph case under racecheck) leaves only "Segmentation fault" and no core on the GPU machine;
// the frames ("binary(+0xoffset)") say whether the fault is in the test, in kvsift or in the tool's
// injected library, and `addr2line -C -f -e binary 0xoffset` names them.
//
// doctest installs its own handlers when the run starts, reports the test case, restores the handler it
// found (this one) and raises the signal again, so install this before doctest::Context::run().
#pragma once

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

namespace kvsift_test {

inline void crash_trace_handler(int sig) {
  static const char kHead[] = "\n==== kvsift test: fatal signal, stack (addr2line -C -f -e BINARY OFFSET):\n";
  (void)!write(STDERR_FILENO, kHead, sizeof(kHead) - 1);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);  // async-signal-safe: writes, no malloc
  signal(sig, SIG_DFL);
  raise(sig);
}

inline void install_crash_trace() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now: the first call may allocate, which a handler must not
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, crash_trace_handler);
}

}  // namespace kvsift_test
