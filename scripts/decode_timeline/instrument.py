#!/usr/bin/env python3
"""Patches a kvsift tree (argv[1]) so every split block of the tensor-core decode kernel writes
%globaltimer at its start, when its first stage has landed, at its loop's end and at its exit, and its
SM, to kvsift::detail::g_kvsift_tl[5 * linear block id]. A measurement build for timeline.cu beside it:
the patched tree is never committed; the patterns below fail loudly when the kernel's text moves."""
import sys
p = sys.argv[1] + '/include/kvsift/ops/detail/decode_attention_mma.cuh'
s = open(p).read()
def sub(old, new):
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)
sub('namespace kvsift {\nnamespace detail {\n',
    'namespace kvsift {\nnamespace detail {\n__device__ unsigned long long* g_kvsift_tl = nullptr;\n'
    '__device__ __forceinline__ unsigned long long tl_now() { unsigned long long t; '
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
sub('  const DecodeWork w = locate_work(a);\n',
    '  const DecodeWork w = locate_work(a);\n  const unsigned long long tl0 = tl_now();\n  unsigned long long tl1 = 0;\n')
sub('      __syncthreads();  // stage st landed for every thread; slot (st - 1) % kStages is free again\n',
    '      __syncthreads();  // stage st landed for every thread; slot (st - 1) % kStages is free again\n      if (st == 0) tl1 = tl_now();\n')
sub('  cp_async_wait<0>();\n  __syncthreads();  // the ring becomes the epilogue\'s SplitSmem\n',
    '  cp_async_wait<0>();\n  __syncthreads();  // the ring becomes the epilogue\'s SplitSmem\n  const unsigned long long tl2 = tl_now();\n')
sub('  if (score_tile) finish_scores(a, w, scratch);\n}\n',
    '  if (score_tile) finish_scores(a, w, scratch);\n'
    '  if (threadIdx.x == 0 && g_kvsift_tl != nullptr) {\n'
    '    const unsigned linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n'
    '    unsigned smid;\n    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));\n'
    '    unsigned long long* r = g_kvsift_tl + 5ull * linear;\n'
    '    r[0] = tl0; r[1] = tl1; r[2] = tl2; r[3] = tl_now(); r[4] = smid;\n  }\n}\n')
open(p, 'w').write(s)
print('instrumented', p)
