"""What the timeline tools' instrument.py scripts share (scripts/decode_timeline, scripts/topk_timeline):
the text patcher and the device-side marks they insert into a copy of the tree.

PRELUDE declares, inside namespace kvsift::detail, kTlSlots marks per block in the device array
g_kvsift_tl (thread 0 of block b writes slot s at g_kvsift_tl[kTlSlots * b + s], b the linear block id),
tl_now() (%globaltimer), tl_now_after(dep) (the same read, issued only once `dep` is computed) and
tl_mark(slot, value)."""

PRELUDE = (
    'constexpr int kTlSlots = 12;\n'
    '__device__ unsigned long long* g_kvsift_tl = nullptr;\n'
    '__device__ __forceinline__ unsigned long long tl_now() { unsigned long long t; '
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n'
    '// The timer read after `dep` is computed (an input of the asm: it cannot be hoisted above it).\n'
    '__device__ __forceinline__ unsigned long long tl_now_after(unsigned dep) { unsigned long long t; '
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(dep)); return t; }\n'
    '__device__ __forceinline__ void tl_mark(int slot, unsigned long long t) {\n'
    '  if (threadIdx.x != 0 || g_kvsift_tl == nullptr) return;\n'
    '  const unsigned linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n'
    '  g_kvsift_tl[(unsigned long long)kTlSlots * linear + slot] = t;\n}\n')

NAMESPACE = 'namespace kvsift {\nnamespace detail {\n'


def patch(path, subs):
    """subs: (old, new) pairs, or lists of such pairs of which the first whose old text the file holds
    once applies (a kernel before and after a change). Fails loudly when no alternative matches."""
    s = open(path).read()
    for sub in subs:
        alts = sub if isinstance(sub, list) else [sub]
        for old, new in alts:
            if s.count(old) == 1:
                s = s.replace(old, new)
                break
        else:
            raise AssertionError((path, alts[0][0]))
    open(path, 'w').write(s)
    print('instrumented', path)


def prelude_patch():
    """The (old, new) pair that puts PRELUDE at the top of a header's kvsift::detail namespace."""
    return (NAMESPACE, NAMESPACE + PRELUDE)
