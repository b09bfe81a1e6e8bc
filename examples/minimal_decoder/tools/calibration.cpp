// The calibration's per-length table (calibration.hpp).

#include "tools/calibration.hpp"

namespace minimal_decoder {

void print_calibration_table(const PasskeyToolOptions& o, int length, int prompts, const std::vector<double>& cosine,
                             const std::vector<int>& correct) {
  const int T = int(o.thetas.size()), N = int(o.num_blocks.size());
  std::printf("\nL = %d (%d prompts of %s): cosine / accuracy\n%-8s", length, prompts, o.prompt_file.c_str(), "theta");
  for (int nb : o.num_blocks) std::printf(" %20s", ("num_block " + std::to_string(nb)).c_str());
  std::printf("\n");
  int best = 0;
  for (int t = 0; t < T; ++t) {
    std::printf("%-8g", double(o.thetas[std::size_t(t)]));
    for (int n = 0; n < N; ++n) {
      const int i = t * N + n;
      if (cosine[std::size_t(i)] > cosine[std::size_t(best)]) best = i;
      char cell[48];
      std::snprintf(cell, sizeof cell, "%.5f / %.3f", cosine[std::size_t(i)] / prompts, double(correct[std::size_t(i)]) / prompts);
      std::printf(" %20s", cell);
    }
    std::printf("\n");
  }
  std::printf("best mean cosine at L = %d: theta %g, num_block %d (%.5f, accuracy %.3f)\n", length,
              double(o.thetas[std::size_t(best / N)]), o.num_blocks[std::size_t(best % N)], cosine[std::size_t(best)] / prompts,
              double(correct[std::size_t(best)]) / prompts);
  std::fflush(stdout);  // one table per length, visible while the next length runs
}

}  // namespace minimal_decoder
