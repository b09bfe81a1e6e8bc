#pragma once
// Progress on stderr: a one-line bar for long prefills and generations, silent when stderr is not a
// terminal (logs and CI stay clean) or when disabled.

#include <string>

namespace minimal_decoder {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Draws "<phase> [####    ] done/total"; a new phase replaces the previous one's line.
  void update(const char* phase, long long done, long long total);
  // Clears the line.
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::string phase_;
};

}  // namespace minimal_decoder
