#!/usr/bin/env python3
"""Patches a kvsift tree (argv[1]) so every CTA of top-k's register select writes %globaltimer marks
to kvsift::detail::g_kvsift_tl[kTlSlots * blockIdx.x] (thread 0):
  0 entry                 1 keys in registers (the slice and the sample landed, keys computed)
  2 bracket found         3 own list written (past the barrier after it)   4 past the group barrier
  5 copy of the group's lists done (ordinary rows) / exact search done (the other path)
  6 k-th key found in the copy   7 lower ranks' counts (past their scan)   8 exit (ordered output written)
  9 the SM                10, 11 clock64() at entry and at exit (the SM clock the CTA ran at)
A measurement build for timeline.cu beside it: the patched tree is never committed; the patterns below
fail loudly when the kernel's text moves."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'timeline_support'))
from tl_patch import patch, prelude_patch  # noqa: E402

root = sys.argv[1] + '/include/kvsift/ops/detail/'
mark = lambda slot, what='tl_now()': f'tl_mark({slot}, {what});\n'
patch(root + 'topk_register_common.cuh', [prelude_patch()])
patch(root + 'topk_register_select.cuh', [
    ('  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};\n  namespace cg',
     '  ' + mark(0) + '  ' + mark(10, 'clock64()') +
     '  const TopkLaunch<T, Key> a{scores, params, out, values, key, launch_plan};\n  namespace cg'),
    ('  const Mask valid = topk_reg_keys<kKeys, T>(a.key, row, plan, raw, run_lo, keys);\n',
     '  const Mask valid = topk_reg_keys<kKeys, T>(a.key, row, plan, raw, run_lo, keys);\n'
     '  if (threadIdx.x == 0) {  // thread 0\'s keys (its loads) land before mark 1\n  unsigned dep = valid;\n#pragma unroll\n'
     '  for (int i = 0; i < kKeys; ++i) dep ^= unsigned(keys[i]);\n  ' + mark(1, 'tl_now_after(dep)') + '  }\n'),
    ('  if (top < bottom) top = bottom;  // cannot happen for ranks above < below; keeps the list well formed\n',
     '  if (top < bottom) top = bottom;  // cannot happen for ranks above < below; keeps the list well formed\n  ' + mark(2)),
    ('  // The finish\'s histograms start zeroed: the bracket\'s rounds are done with them (after a barrier).\n  __syncthreads();\n',
     '  // The finish\'s histograms start zeroed: the bracket\'s rounds are done with them (after a barrier).\n  __syncthreads();\n  ' + mark(3)),
    ('  group.sync();  // the group barrier: every CTA\'s counts and list are published\n',
     '  group.sync();  // the group barrier: every CTA\'s counts and list are published\n  ' + mark(4)),
    ('    __cluster_barrier_arrive();  // done reading the peers\' shared memory\n    __syncthreads();\n',
     '    __cluster_barrier_arrive();  // done reading the peers\' shared memory\n    __syncthreads();\n    ' + mark(5)),
    ('    kth = bottom + prefix;\n', '    kth = bottom + prefix;\n    ' + mark(6)),
    ('    eq_lower = packed >> 16;\n', '    eq_lower = packed >> 16;\n    ' + mark(7)),
    ('    kth = prefix;\n', '    kth = prefix;\n    ' + mark(5)),
    ('  __cluster_barrier_wait();  // no CTA leaves while a peer may still read its shared memory\n',
     '  __cluster_barrier_wait();  // no CTA leaves while a peer may still read its shared memory\n'
     '  { unsigned smid;\n  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));\n  ' + mark(9, 'smid') +
     '  ' + mark(11, 'clock64()') + '  ' + mark(8) + '  }\n'),
])
