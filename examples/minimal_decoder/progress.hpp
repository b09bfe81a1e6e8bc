#pragma once
// A one-line progress bar on stderr for long prefills and generations; silent when stderr is not a
// terminal (logs and CI stay clean) or when disabled.

#include <cstdio>
#include <string>

#include <unistd.h>

namespace minimal_decoder {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled && isatty(fileno(stderr))) {}
  ~ProgressBar() { finish(); }

  void update(long long done, long long total) {
    if (!enabled_ || total <= 0) return;
    const int width = 30, filled = int(width * done / total);
    std::fprintf(stderr, "\r%-8s [%s%s] %lld/%lld", label_.c_str(), std::string(std::size_t(filled), '#').c_str(),
                 std::string(std::size_t(width - filled), ' ').c_str(), done, total);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fprintf(stderr, "\r%80s\r", "");
    drawn_ = false;
  }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace minimal_decoder
