#!/usr/bin/env python3
"""Patches a kvsift tree (argv[1]) so every split block of the tensor-core decode kernel writes
%globaltimer marks to kvsift::detail::g_kvsift_tl[kTlSlots * linear block id]:
  0 work bounded (its length or count read; after the early stage's issue)   1 first stage landed   2 loop's end   3 exit
  4 the SM                                     5 entry                6 epilogue: the block's own rows merged and stored
  7 cluster merge: every rank's partial visible (cluster splits only)
  8, 9 clock64() at entry and at exit (the SM clock the block ran at)
  10, 11 finish_split: past its first barrier (the warps' states in shared memory), past its second
         (the rows' weights and LSEs computed)
A measurement build for timeline.cu beside it: the patched tree is never committed; the patterns below
fail loudly when the kernel's text moves."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'timeline_support'))
from tl_patch import patch, prelude_patch  # noqa: E402

root = sys.argv[1] + '/include/kvsift/ops/detail/'
patch(root + 'decode_attention_common.cuh', [
    prelude_patch(),
    ('  cluster.sync();  // every split\'s partial is written and visible to the cluster\n',
     '  cluster.sync();  // every split\'s partial is written and visible to the cluster\n  tl_mark(7, tl_now());\n'),
    ('  __shared__ float lse2[R];\n  __syncthreads();\n',
     '  __shared__ float lse2[R];\n  __syncthreads();\n  tl_mark(10, tl_now());\n'),
    ('    lse2[r] = l > 0.f ? m + log2f(l) : -INFINITY;\n  }\n  __syncthreads();\n',
     '    lse2[r] = l > 0.f ? m + log2f(l) : -INFINITY;\n  }\n  __syncthreads();\n  tl_mark(11, tl_now());\n'),
    ('  if (in_cluster) {\n    merge_in_cluster<D>(',
     '  tl_mark(6, tl_now());\n  if (in_cluster) {\n    merge_in_cluster<D>('),
])
patch(root + 'decode_attention_mma.cuh', [
    [('  DecodeWork w = locate_split(a);\n',
      '  tl_mark(5, tl_now());\n  tl_mark(8, clock64());\n  DecodeWork w = locate_split(a);\n'),
     ('  const DecodeWork w = locate_work(a);\n',
      '  tl_mark(5, tl_now());\n  tl_mark(8, clock64());\n  const DecodeWork w = locate_work(a);\n  tl_mark(0, tl_now());\n')],
    [('  bound_work(a, w, bounds);\n  const int steps',
      '  bound_work(a, w, bounds);\n  tl_mark(0, tl_now());\n  const int steps'),
     ('  const int d_lo = ', '  const int d_lo = ')],
    ('      __syncthreads();  // stage st landed for every thread; slot (st - 1) % kStages is free again\n',
     '      __syncthreads();  // stage st landed for every thread; slot (st - 1) % kStages is free again\n'
     '      if (st == 0) tl_mark(1, tl_now());\n'),
    ('  cp_async_wait<0>();\n  __syncthreads();  // the ring becomes the epilogue\'s SplitSmem\n',
     '  cp_async_wait<0>();\n  __syncthreads();  // the ring becomes the epilogue\'s SplitSmem\n  tl_mark(2, tl_now());\n'),
    ('  if (score_tile) finish_scores(a, w, scratch);\n}\n',
     '  if (score_tile) finish_scores(a, w, scratch);\n'
     '  unsigned smid;\n  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));\n'
     '  tl_mark(4, smid);\n  tl_mark(9, clock64());\n  tl_mark(3, tl_now());\n}\n'),
])
