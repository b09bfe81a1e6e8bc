// The op schemas: TORCH_LIBRARY(kvsift) defines each op once; ops_cpu.cpp and ops_cuda.cpp register
// the backends, kvsift/_ops.py the fake (meta) kernels torch.compile traces with.
//
// Schema conventions: host values that size the launch (k, sink, recent, max_kv_length, the sparse
// heads) are ints, never tensors, so a call's grid depends on nothing in device memory (no host
// sync; a CUDA graph replays it for any lengths up to the bounds). Outputs are fresh tensors; no op
// mutates its inputs.
#include <torch/library.h>

#include "lycheedecode_args.hpp"
#include "op_args.hpp"

TORCH_LIBRARY(kvsift, m) {
  // Per row of scores [rows, cols]: the `k` best positions of [0, lengths[r]) (the first `sink` and last
  // `recent` always in), ascending. Returns (indices [rows, max(k, sink + recent)] int32, -1 past the
  // row's count; counts [rows] int32).
  m.def("topk(Tensor scores, int k, Tensor? lengths=None, Tensor? per_row_k=None, int sink=0, int recent=0)"
        " -> (Tensor indices, Tensor counts)");
  // Decode attention of q's S_q newest positions over a KV cache (see kvsift/ops.py for the layouts).
  // Heads listed in sparse_heads attend to the entries of their row of (indices, index_counts) instead
  // of the whole sequence. Returns (out, like q; lse float32, q's shape without head_dim).
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor kv_lengths, str kv_layout=\"BHSD\", "
        "Tensor? block_table=None, float? sm_scale=None, int max_kv_length=0, int[] sparse_heads=[], "
        "Tensor? indices=None, Tensor? index_counts=None, int index_block_size=1) -> (Tensor out, Tensor lse)");
  // Prompt KV-cache compression of one layer (kvsift::compress_prompt: ClusterAttn, SnapKV, StreamingLLM,
  // H2O-prefill) of a contiguous cache k/v ("BHSD" [B, H_kv, S, D] or "BSHD" [B, S, H_kv, D]) with
  // lengths kv_lengths, scored by `queries` (the last window queries; all prompt queries for H2O) in the
  // same layout. Returns the compacted cache (k_out, v_out: [B, H_out, capacity, D] or [B, capacity,
  // H_out, D]; H_out = H_kv, or H_q with heads="query_head"; zero past each new length), new_lengths [B]
  // int32 and positions [B, H_out, capacity] int32 (each slot's original position, -1 when empty).
  m.def("compress_prompt(Tensor k_cache, Tensor v_cache, Tensor kv_lengths, Tensor queries, str policy=\"ClusterAttn\", "
        "int capacity=1024, int window=32, str kv_layout=\"BHSD\", float? sm_scale=None, str heads=\"kv_head_mean\", "
        "Tensor? lse=None, int num_block=128, float theta=0.002, str block_rule=\"prefix_split\", "
        "str radius_rule=\"half_block\", int fixed_radius=0, str pool=\"max\", int pool_kernel=7, int sinks=4)"
        " -> (Tensor k_out, Tensor v_out, Tensor new_lengths, Tensor positions)");
  // HardKuma gates (gates/hardkuma.hpp), one per element of a and b (a model's [layers, kv_heads]), float32
  // or float64; (l, r) the stretched support, clamp_shape / clamp_prob_zero the reference numerics.
  // hardkuma_sample: h = clip(l + (r - l) F_K^-1(u; a, b), 0, 1) for the caller's uniforms u (a's shape);
  // its backward gives dL/da, dL/db from dL/dh at the same u (kvsift's closed form; 0 where h is clipped).
  m.def("hardkuma_sample(Tensor a, Tensor b, Tensor u, float l=-0.1, float r=1.1, bool clamp_shape=True) -> Tensor");
  m.def("hardkuma_sample_backward(Tensor grad_h, Tensor a, Tensor b, Tensor u, float l=-0.1, float r=1.1, "
        "bool clamp_shape=True) -> (Tensor grad_a, Tensor grad_b)");
  // The closed-form expected L0: sum and density (mean) of P(h != 0) over all gates, 0-dim tensors. The
  // backward gives grad_scale * d density / d (a, b), grad_scale a 0-dim tensor on the gates' device.
  m.def("hardkuma_expected_l0(Tensor a, Tensor b, float l=-0.1, float r=1.1, bool clamp_shape=True, "
        "bool clamp_prob_zero=True) -> (Tensor sum, Tensor density)");
  m.def("hardkuma_expected_l0_backward(Tensor grad_scale, Tensor a, Tensor b, float l=-0.1, float r=1.1, "
        "bool clamp_shape=True, bool clamp_prob_zero=True) -> (Tensor grad_a, Tensor grad_b)");
  // Per gate: P(h=0), P(h=1), P(0<h<1), P(h!=0), E[K], E[h], dP(h=0)/da, dP(h=0)/db (hardkuma_stats).
  m.def("hardkuma_stats(Tensor a, Tensor b, float l=-0.1, float r=1.1, bool clamp_shape=True, "
        "bool clamp_prob_zero=True) -> (Tensor prob_zero, Tensor prob_one, Tensor prob_interior, "
        "Tensor expected_l0, Tensor kuma_mean, Tensor mean, Tensor d_prob_zero_da, Tensor d_prob_zero_db)");
  // The deterministic roles of trained gates a, b [layers, kv_heads] (gates/roles_from_gates.hpp): retrieval
  // iff E[K] > threshold, or the top total_retrieval_heads; returns (retrieval bool, E[K]) [layers, kv_heads].
  m.def("extract_head_roles(Tensor a, Tensor b, str selection=\"threshold\", float threshold=0.5, "
        "int total_retrieval_heads=0, bool force_layer0=True, bool clamp_shape=True) -> (Tensor retrieval, Tensor scores)");
  // LycheeDecode (policy/lycheedecode.hpp): the configuration's fields, roles flattened layer-major (1 =
  // retrieval). lycheedecode_table_shape validates a configuration and returns the index table's
  // [rows, capacity] and the tokens per entry (host only). lycheedecode_layer runs one layer of a decode
  // step (or, with correction=True, of a cache-correction step) and writes the retrieval heads' selections
  // into (table_indices, table_counts) in place; layer / next_layer / step_batch are the caller's layer
  // cursor. Returns (out, like q; lse float32) as decode_attention does.
#define KVSIFT_LYCHEEDECODE_CONFIG                                                                               \
  "int num_layers, int num_q_heads, int num_kv_heads, int head_dim, int[] roles, int max_batch, "              \
  "int max_kv_length, str selection=\"token\", int budget=4096, float rho=0.7, int sink=128, int recent=256, " \
  "int block_size=64, int num_blocks=64, int sink_blocks=1, int index_capacity=0, int correction_interval=0, "  \
  "float? sm_scale=None"
  m.def("lycheedecode_table_shape(" KVSIFT_LYCHEEDECODE_CONFIG ") -> int[]", &kvsift_torch::lycheedecode_table_shape_op);
  m.def("lycheedecode_layer(Tensor q, Tensor k_cache, Tensor v_cache, Tensor kv_lengths, Tensor(a!) table_indices, "
        "Tensor(b!) table_counts, int layer, int next_layer, int step_batch, " KVSIFT_LYCHEEDECODE_CONFIG
        ", str kv_layout=\"BHSD\", Tensor? block_table=None, bool correction=False) -> (Tensor out, Tensor lse)");
#undef KVSIFT_LYCHEEDECODE_CONFIG
  // The head-roles file (gates/roles_file.hpp): its text parsed into a bool [layers, kv_heads] CPU tensor
  // (true = retrieval head), and back. Host only, not traceable (the output shape is the file's).
  m.def("parse_head_roles(str text, int expected_layers=-1, int expected_kv_heads=-1) -> Tensor",
        &kvsift_torch::parse_head_roles_op);
  m.def("format_head_roles(Tensor retrieval) -> str", &kvsift_torch::format_head_roles_op);
  // The version of the kvsift headers this library was compiled from (include/kvsift/version.hpp).
  m.def("version() -> str", []() -> std::string { return KVSIFT_PYTHON_VERSION; });
  // Whether the CUDA implementations were compiled in.
  m.def("built_with_cuda() -> bool", []() -> bool {
#ifdef KVSIFT_PYTHON_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
