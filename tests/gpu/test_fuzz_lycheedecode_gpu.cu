// GPU fuzz, LycheeDecode: random multi-layer decode steps through the policy on both backends, compared
// after every layer by the shared harness of the LycheeDecode GPU tests (gpu/lycheedecode_gpu_cases.cuh:
// outputs to the dtype's tolerance, the whole index table exactly; device outputs poisoned before
// every layer, state and workspace once). Drawn per case: 2-4 layers of random roles (layer 0 all
// retrieval, as the policy requires), 1-4 KV heads, GQA group 1-8, head_dim 64/128/256, BSHD or paged
// NHD (page 16 or 32), ragged lengths with empty slots, token / ratio / block selection with random
// budgets, sinks, recents and block counts, 1-2 steps, and num_sms varied (other split plans).
//
// Family weight 0.05 of test_fuzz_gpu's cases, 0.22 of its seconds (a case is several layers).

#include "gpu/lycheedecode_gpu_cases.cuh"
#include "support/fuzz.hpp"

namespace {

namespace fz = kvsift_test::fuzz;
using fz::chance;
using fz::pick;

lycheedecode_test::Case draw_case(std::mt19937_64& rng) {
  lycheedecode_test::Case c;
  const int layers = pick(rng, 2, 4), hkv = pick(rng, 1, 4);
  c.roles.clear();
  for (int l = 0; l < layers; ++l) {
    if (l) c.roles += '/';
    for (int h = 0; h < hkv; ++h) c.roles += l == 0 ? 'R' : (chance(rng, 55) ? 'S' : 'R');
  }
  c.group = pick(rng, 1, 8);
  c.d = fz::one_of(rng, {64, 128, 256});
  c.cap = pick(rng, 16, 300);
  c.layout = chance(rng, 50) ? lycheedecode_test::Layout::kBSHD : lycheedecode_test::Layout::kPagedNHD;
  c.page_size = chance(rng, 50) ? 16 : 32;
  if (c.layout == lycheedecode_test::Layout::kPagedNHD) c.cap = (c.cap + c.page_size - 1) / c.page_size * c.page_size;
  c.lengths.assign(std::size_t(pick(rng, 1, 4)), 0);
  for (auto& l : c.lengths) {
    const int u = pick(rng, 0, 5);
    l = u == 0 ? 0 : u == 1 ? c.cap : u == 2 ? 1 : pick(rng, 1, c.cap);
  }
  c.steps = pick(rng, 1, 2);
  c.selection = kvsift::LycheeDecodeSelection(pick(rng, 0, 2));
  c.budget = pick(rng, 1, c.cap);
  c.sink = pick(rng, 0, std::min(8, c.budget));
  c.recent = pick(rng, 0, c.budget - c.sink);
  c.rho = std::uniform_real_distribution<double>(0.0, 0.95)(rng);
  c.block_size = fz::one_of(rng, {16, 32, 64});
  c.sink_blocks = pick(rng, 0, 1);
  if (c.selection == kvsift::LycheeDecodeSelection::kBlock) c.recent = pick(rng, 0, c.block_size);
  c.num_blocks = c.sink_blocks + (c.recent + c.block_size - 1) / c.block_size + 1 + pick(rng, 0, 4);
  c.num_sms = fz::one_of(rng, {0, 0, 1, 3, 1000});
  return c;
}

}  // namespace

TEST_CASE("fuzz gpu: LycheeDecode decode steps over several layers against the host") {
  for (fz::Family f("gpu lycheedecode", 0.05, "fuzz gpu: LycheeDecode decode steps over several layers against the host",
                    0.22);
       f.next();) {
    auto rng = f.rng();
    const auto c = draw_case(rng);
    INFO(f.replay());
    INFO(c.describe() << " group=" << c.group << " cap=" << c.cap << " budget=" << c.budget << " sink=" << c.sink
                      << " recent=" << c.recent << " rho=" << c.rho << " block=" << c.block_size << "x" << c.num_blocks
                      << " sink_blocks=" << c.sink_blocks << " steps=" << c.steps << " num_sms=" << c.num_sms);
    const std::uint64_t salt = rng();  // run_case draws from make_rng(salt), i.e. the run's seed and this case
    if (f.index() % 2 == 0)
      lycheedecode_test::run_case<kvsift::bfloat16_t>(c, salt);
    else
      lycheedecode_test::run_case<kvsift::half_t>(c, salt);
  }
}
