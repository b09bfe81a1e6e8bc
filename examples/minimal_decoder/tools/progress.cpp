// The progress bar (progress.hpp).

#include "tools/progress.hpp"

#include <cstdio>

#include <unistd.h>

namespace minimal_decoder {

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled && isatty(fileno(stderr))) {}

void ProgressBar::update(const char* phase, long long done, long long total) {
  if (!enabled_ || total <= 0) return;
  if (phase_ != phase) finish();  // a shorter line must not keep the previous one's tail
  phase_ = phase;
  const int width = 30, filled = int(width * done / total);
  std::fprintf(stderr, "\r%-8s [%s%s] %lld/%lld", phase, std::string(std::size_t(filled), '#').c_str(),
               std::string(std::size_t(width - filled), ' ').c_str(), done, total);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) std::fprintf(stderr, "\r%80s\r", "");
  drawn_ = false;
}

}  // namespace minimal_decoder
