#pragma once
// A Llama-architecture decoder whose attention runs through kvsift, written once for any backend
// (host_backend.hpp: the CPU reference; cuda/cuda_backend.hpp: a CUDA stream and a side stream for work
// that may overlap the step's, same members). This
// is the file an engine author reads: every place where kvsift enters is marked "kvsift:". It is
// compiled once per backend (host_engine.cpp by the host compiler, cuda/cuda_engine.cu by nvcc,
// where kvsift's unqualified calls find the CUDA launchers).
//
//   prefill(prompts)     chunk-major: each chunk of query positions goes through every layer; its
//                        K/V are written to the layer's cache and attention is kvsift's
//                        decode_attention with q_len = chunk (causal inside the chunk). After the
//                        last chunk, a compressing policy calls kvsift::compress_prompt once per
//                        layer and the full prompt caches are freed.
//   decode(tokens)       one token per sequence: append its K/V at slot cache_length[b], RoPE at
//                        position[b] (the original position, also after compression), and attend
//                        with decode_attention (q_len = 1) over the layer's cache, or with
//                        LycheeDecodePolicy's attend_layer (hybrid dense/sparse heads) for --policy
//                        lycheedecode, whose hand_off_layer (the retrieval heads' top-k) runs on the
//                        side stream beside the next kernels.
//                        LycheeDecode's cache correction re-runs the last N positions densely
//                        (correct_layer), overwriting their K/V, every N-th step. On the GPU the
//                        ordinary step and the correction step are each recorded into a CUDA graph
//                        once and replayed.
//   begin_step_parts,    --profile (step_profile.hpp): the ordinary step's parts (weights, attention,
//   run_step_part        LycheeDecode's layer calls, the whole step) launched alone, same inputs.
//
// KV layout (kv_cache.hpp): contiguous, one [batch, kv_heads, capacity, head_dim] tensor each for K
// and V per layer (kvsift::ContiguousKV), or paged, a page pool and a block table per layer
// (kvsift::PagedKV); every kvsift call below is written once for both through LayerKvCache::with_view.
// Ragged batches: every sequence has its own length. KV dtype (--kv-dtype): the backend's own, or
// fp8 E4M3 with per-token scales, written by kvsift::store_kv; kvsift's attention over fp8 takes bf16
// queries, so the float query rows go through bf16 scratch for it (with_query_rows).

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "engine/checkpoint.hpp"
#include "engine/errors.hpp"
#include "engine/kv_cache.hpp"
#include "engine/model_config.hpp"
#include "engine/policy.hpp"
#include "engine/rope_frequencies.hpp"

namespace minimal_decoder {

// The model's weights in the backend's memory and precision.
template <class Backend>
struct BackendWeights {
  using Matrix = typename Backend::Matrix;
  using Vector = typename Backend::template Buffer<float>;
  struct Layer {
    Vector attn_norm, mlp_norm, q_norm, k_norm;
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  Matrix embed, lm_head;
  Vector final_norm;
  std::vector<Layer> layers;

  BackendWeights() = default;  // filled member by member, e.g. by random_device_weights (cuda/cuda_engine.hpp)
  BackendWeights(const Backend& be, const ModelConfig& c, const HostWeights& w) {
    const int H = c.hidden_size, I = c.intermediate_size, Q = int(c.q_dim()), K = int(c.kv_dim());
    auto vec = [&](const std::vector<float>& v) {
      Vector out = be.template alloc<float>(v.size());
      be.upload(out.data(), v.data(), v.size());
      return out;
    };
    embed = be.make_matrix(w.embed, c.vocab_size, H);
    // All vocab_size rows, or a tensor-parallel rank's slice of them (shard_weights).
    lm_head = be.make_matrix(w.lm_head, int(w.lm_head.size() / std::size_t(H)), H);
    final_norm = vec(w.final_norm);
    for (const LayerWeights& lw : w.layers) {
      Layer l;
      l.attn_norm = vec(lw.attn_norm);
      l.mlp_norm = vec(lw.mlp_norm);
      l.q_norm = vec(lw.q_norm);
      l.k_norm = vec(lw.k_norm);
      l.wq = be.make_matrix(lw.wq, Q, H);
      l.wk = be.make_matrix(lw.wk, K, H);
      l.wv = be.make_matrix(lw.wv, K, H);
      l.wo = be.make_matrix(lw.wo, H, Q);
      l.w_gate = be.make_matrix(lw.w_gate, I, H);
      l.w_up = be.make_matrix(lw.w_up, I, H);
      l.w_down = be.make_matrix(lw.w_down, H, I);
      layers.push_back(std::move(l));
    }
  }
};

// Sizes fixed for the life of a Decoder: every buffer is allocated from them up front.
struct DecoderLimits {
  int max_batch = 1;
  int max_prompt_len = 0;
  int max_new_tokens = 0;
  int prefill_chunk = 256;  // query positions per prefill chunk
  // A non-compressing decoder also keeps the post-RoPE queries of each prompt's last N positions, so
  // that compressing decoders can start from its prefill (prefill_from) instead of repeating it.
  int keep_window_queries = 0;
  KvLayout kv_layout = KvLayout::kContiguous;
  int page_size = 16;  // tokens per page of the paged layout
  KvDtype kv_dtype = KvDtype::kNative;
};

// Tensor parallelism (engine/tensor_parallel.hpp, tensor_parallel_decoder.hpp): a decoder that is one
// rank of several runs its shard's ModelConfig and weights, and sums the partial outputs of the
// row-parallel projections (o and down) over the ranks with `all_reduce`, which every rank calls at
// the same points of the same step, in order, on its backend's stream. Its logits are those of its
// LM-head rows (BackendWeights::lm_head.rows of them); the driver concatenates the ranks'.
struct DecoderRank {
  int rank = 0, ranks = 1;
  std::function<void(float* data, std::int64_t n)> all_reduce;  // required when ranks > 1
};

// Where the time of the last call went (wall clock; a GPU backend must synchronise in synchronize() for this to be right).
// all_reduce_ms: a tensor-parallel rank's all-reduces, timed like the attention (with it, and 0 without).
struct StepTiming {
  double total_ms = 0, attention_ms = 0, all_reduce_ms = 0;
};

template <class Backend>
class Decoder {
 public:
  using KV = typename Backend::KvType;
  template <class T>
  using Buffer = typename Backend::template Buffer<T>;
  using LayerCache = LayerKvCache<Backend>;
  // Called with (tokens done, tokens total) after each prefill chunk.
  using Progress = std::function<void(long long, long long)>;
  // Sees every layer's post-RoPE queries, rows [n, q_heads * head_dim] in backend memory (prefill
  // chunks and decode steps alike); offline tools (calibration, head probes) read them.
  using QueryTap = std::function<void(int layer, const float* q, int rows)>;

  Decoder(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights, const PolicyOptions& policy,
          const DecoderLimits& limits, DecoderRank rank = {})
      : be_(be), c_(config), w_(weights), policy_(policy), lim_(limits), rank_(std::move(rank)), lm_rows_(weights.lm_head.rows) {
    if (rank_.ranks > 1 && !rank_.all_reduce) throw DecoderError("a tensor-parallel rank needs an all-reduce");
    const long long context = (long long)lim_.max_prompt_len + lim_.max_new_tokens;
    if (context > c_.max_positions)
      throw DecoderError("context of " + std::to_string(context) + " tokens (prompt " + std::to_string(lim_.max_prompt_len) +
                         " + " + std::to_string(lim_.max_new_tokens) + " new) exceeds max_position_embeddings = " +
                         std::to_string(c_.max_positions));
    if (lim_.max_batch < 1 || lim_.max_prompt_len < 1 || lim_.prefill_chunk < 1)
      throw DecoderError("batch, prompt length and prefill chunk must be >= 1");
    validate_policy(policy_, c_.num_layers, c_.num_q_heads, c_.num_kv_heads, c_.head_dim, lim_.max_prompt_len);
    // The backend says whether its attention reads fp8 caches (the CUDA one does not yet).
    if (lim_.kv_dtype == KvDtype::kFp8 && !Backend::template attends_kv<kvsift::fp8_e4m3_t>())
      throw DecoderError(Backend::kFp8AttentionMissing);
    window_ = policy_.compresses_prompt() ? policy_.compression.window : std::max(0, lim_.keep_window_queries);
    const int B = lim_.max_batch;
    // Dense decodes in the prompt cache itself; a compressing policy decodes in a cache of Cp slots
    // (plus the new tokens) and holds the full prompt cache only until compression.
    decode_capacity_ = policy_.compresses_prompt() ? policy_.compression.capacity + lim_.max_new_tokens
                                                   : lim_.max_prompt_len + lim_.max_new_tokens;
    decode_caches_.resize(std::size_t(c_.num_layers));
    for (auto& cache : decode_caches_) cache = allocate_cache(decode_capacity_);
    if (policy_.kind == PolicyKind::kLycheeDecode) {
      // kvsift: the LycheeDecode policy object, its index-table state and its workspace, sized once
      // from the capacities; the decode loop below never allocates.
      check(kvsift::LycheeDecodePolicy::create(lycheedecode_config(policy_.lycheedecode, c_.num_layers, c_.num_q_heads, c_.num_kv_heads,
                                                        c_.head_dim, B, decode_capacity_),
                                          &lycheedecode_),
            "--policy lycheedecode");
      lycheedecode_state_mem_ = be_.template alloc<unsigned char>(lycheedecode_.state_bytes());
      check(lycheedecode_.make_state(lycheedecode_state_mem_.data(), lycheedecode_state_mem_.size(), &lycheedecode_state_), "LycheeDecode state");
      std::size_t lycheedecode_bytes = 0;
      if (lim_.kv_dtype == KvDtype::kFp8)
        check(lycheedecode_.template workspace_bytes<kvsift::fp8_e4m3_t>(be_.exec(), &lycheedecode_bytes), "LycheeDecode workspace");
      else
        check(lycheedecode_.template workspace_bytes<KV>(be_.exec(), &lycheedecode_bytes), "LycheeDecode workspace");
      lycheedecode_ws_ = be_.template alloc<unsigned char>(lycheedecode_bytes);
    }
    const int correction_rows = B * std::max(0, policy_.kind == PolicyKind::kLycheeDecode ? policy_.lycheedecode.correction_interval : 0);
    const int rows = std::max({lim_.prefill_chunk * B, B, correction_rows});
    const std::int64_t H = c_.hidden_size;
    // Every projection's input is at most rows x max(hidden, q_dim, intermediate) floats: reserved now,
    // so that no step (a captured one least of all) allocates.
    be_.reserve_linear_input(std::int64_t(rows) * std::max({H, std::int64_t(c_.q_dim()), std::int64_t(c_.intermediate_size)}));
    x_ = be_.template alloc<float>(std::size_t(rows * H));
    x_mid_ = be_.template alloc<float>(std::size_t(rows * H));
    h_ = be_.template alloc<float>(std::size_t(rows * H));
    q_ = be_.template alloc<float>(std::size_t(rows * c_.q_dim()));
    k_ = be_.template alloc<float>(std::size_t(rows * c_.kv_dim()));
    v_ = be_.template alloc<float>(std::size_t(rows * c_.kv_dim()));
    attn_ = be_.template alloc<float>(std::size_t(rows * c_.q_dim()));
    gate_ = be_.template alloc<float>(std::size_t(rows) * c_.intermediate_size);
    up_ = be_.template alloc<float>(std::size_t(rows) * c_.intermediate_size);
    logits_ = be_.template alloc<float>(std::size_t(B) * lm_rows_);
    tokens_ = be_.template alloc<std::int32_t>(std::size_t(rows));
    positions_ = be_.template alloc<std::int32_t>(std::size_t(rows));
    seq_ = be_.template alloc<std::int32_t>(std::size_t(rows));
    slots_ = be_.template alloc<std::int32_t>(std::size_t(rows));
    window_rows_ = be_.template alloc<std::int32_t>(std::size_t(rows));
    lengths_ = be_.template alloc<std::int32_t>(std::size_t(B));
    // RoPE's inverse frequencies, for kvsift::store_kv's rotary (layer_forward).
    rope_inv_freq_ = be_.template alloc<float>(std::size_t(std::max(1, c_.head_dim / 2)));
    std::vector<float> inv_freq(std::size_t(c_.head_dim / 2));
    for (int j = 0; j < c_.head_dim / 2; ++j) inv_freq[std::size_t(j)] = rope_inv_freq(j, c_.head_dim, c_.rope_theta);
    be_.upload(rope_inv_freq_.data(), inv_freq.data(), inv_freq.size());
    if (lim_.kv_dtype == KvDtype::kFp8) {
      q16_ = be_.template alloc<kvsift::bfloat16_t>(std::size_t(rows * c_.q_dim()));
      out16_ = be_.template alloc<kvsift::bfloat16_t>(std::size_t(rows * c_.q_dim()));
    }
    // kvsift: the decode steps' attention workspace, sized now from host values only (the whole
    // batch, q_len 1, the cache capacity), so that no decode step allocates; prefill's launches
    // (one sequence, q_len = chunk) grow it if they need more.
    std::size_t attn_bytes = 0;
    decode_caches_[0].with_view(B, lengths_.data(), [&](const auto& kv) {
      using QT = query_type<std::decay_t<decltype(kv)>>;  // the query type does not change the size
      auto p = kvsift::make_decode_attention_params<QT>(nullptr, nullptr, 1, c_.num_q_heads, c_.head_dim);
      check(kvsift::decode_attention_workspace_bytes(be_.exec(), kv, p, &attn_bytes), "decode attention workspace");
    });
    attn_ws_ = be_.template alloc<unsigned char>(attn_bytes);
  }

  // Dense prefill of a ragged batch; returns the logits of each prompt's last token, [B, vocab].
  std::vector<float> prefill(const std::vector<std::vector<std::int32_t>>& prompts, const Progress& progress = {}) {
    const int B = int(prompts.size());
    if (B < 1 || B > lim_.max_batch) throw DecoderError("batch of " + std::to_string(B) + " prompts exceeds the decoder's " + std::to_string(lim_.max_batch));
    batch_ = B;
    prompts_ = &prompts;
    prompt_len_.assign(std::size_t(B), 0);
    long long total = 0;
    int longest = 0;
    for (int b = 0; b < B; ++b) {
      const int L = int(prompts[std::size_t(b)].size());
      if (L < 1 || L > lim_.max_prompt_len)
        throw DecoderError("prompt " + std::to_string(b) + " has " + std::to_string(L) + " tokens (allowed: 1.." +
                           std::to_string(lim_.max_prompt_len) + ")");
      for (std::int32_t t : prompts[std::size_t(b)])
        if (t < 0 || t >= c_.vocab_size)
          throw DecoderError("prompt " + std::to_string(b) + ": token id " + std::to_string(t) + " outside the vocabulary [0, " +
                             std::to_string(c_.vocab_size) + ")");
      prompt_len_[std::size_t(b)] = L;
      total += L;
      longest = std::max(longest, L);
    }
    timing_ = StepTiming();
    const double t0 = be_.now_ms();
    const bool compress = policy_.compresses_prompt();
    std::vector<LayerCache> prompt_caches = allocate_prefill_buffers();
    std::vector<LayerCache>& target = compress ? prompt_caches : decode_caches_;

    std::vector<float> logits(std::size_t(B) * lm_rows_);
    const int C = lim_.prefill_chunk;
    long long done = 0;
    for (int start = 0; start < longest; start += C) {
      ChunkPlan plan = plan_chunk(start, C);
      const int n = int(plan.tokens.size());
      upload_rows(plan.tokens, plan.positions, plan.seq, plan.slots);
      be_.upload(window_rows_.data(), plan.window_rows.data(), std::size_t(n));
      be_.upload(lengths_.data(), plan.ends.data(), std::size_t(B));
      be_.embed(tokens_.data(), n, w_.embed, x_.data());
      for (int l = 0; l < c_.num_layers; ++l) {
        LayerCache& cache = target[std::size_t(l)];
        layer_forward(l, n, cache, [&](const float* q, float* out) {
          if (window_ > 0)  // keep the window's post-RoPE queries: compression scores with them
            be_.scatter_rows(q, n, c_.q_dim(), window_rows_.data(), window_q_[std::size_t(l)].data());
          for (int b = 0; b < B; ++b) {
            if (plan.count[std::size_t(b)] == 0) continue;
            // kvsift: causal multi-query attention of this chunk's q_len queries over tokens
            // [0, end) of sequence b, through a one-sequence view of the batch cache.
            const std::int64_t row = plan.offset[std::size_t(b)] * c_.q_dim();
            cache.with_sequence_view(b, lengths_.data() + b, [&](const auto& one) {
              attend(l, one, q + row, out + row, plan.count[std::size_t(b)]);
            });
          }
        });
      }
      // Logits of the rows that hold a prompt's last token.
      for (int b = 0; b < B; ++b)
        if (plan.last_row[std::size_t(b)] >= 0)
          lm_head(x_.data() + std::int64_t(plan.last_row[std::size_t(b)]) * c_.hidden_size, 1,
                  logits.data() + std::int64_t(b) * lm_rows_);
      done += n;
      if (progress) progress(done, total);
    }

    history_ = prompts;
    prompts_ = nullptr;
    finish_prefill(prompt_caches, compress, t0);
    return logits;
  }

  // --synthetic-prefill, for speed benchmarks with random weights: the caches are filled with random
  // K/V (N(0, 1); in an fp8 cache, codes of N(0, kSyntheticFp8Spread^2) with every scale
  // 1 / kSyntheticFp8Spread) as if lengths[b] prompt tokens had been prefilled, without running the
  // model; a compressing policy then compresses them, scoring with random window queries. The decode
  // steps that follow cost what they cost after a real prefill. Returns all-zero logits [B, vocab].
  static constexpr float kSyntheticFp8Spread = 64.f;
  std::vector<float> synthetic_prefill(const std::vector<int>& lengths, std::uint64_t seed) {
    const int B = int(lengths.size());
    if (B < 1 || B > lim_.max_batch)
      throw DecoderError("batch of " + std::to_string(B) + " prompts exceeds the decoder's " + std::to_string(lim_.max_batch));
    for (int L : lengths)
      if (L < 1 || L > lim_.max_prompt_len)
        throw DecoderError("synthetic prompt length " + std::to_string(L) + " outside 1.." + std::to_string(lim_.max_prompt_len));
    timing_ = StepTiming();
    const double t0 = be_.now_ms();
    batch_ = B;
    prompts_ = nullptr;
    prompt_len_ = lengths;
    const bool compress = policy_.compresses_prompt();
    std::vector<LayerCache> prompt_caches = allocate_prefill_buffers();
    std::uint64_t stream = seed;
    for (LayerCache& cache : compress ? prompt_caches : decode_caches_) {
      const std::int64_t n = std::int64_t(cache.storage_elements());
      if (cache.is_fp8()) {
        // N(0, 1) values as store_kv would keep them: codes drawn wide enough to use E4M3's range
        // (the rare draw past its 448, 7 sigma, saturates), each row's scale 1/64.
        be_.fill_normal(cache.k_codes(), n, ++stream, kSyntheticFp8Spread);
        be_.fill_normal(cache.v_codes(), n, ++stream, kSyntheticFp8Spread);
        be_.fill_value(cache.k_scales(), std::int64_t(cache.scale_elements()), 1.f / kSyntheticFp8Spread);
        be_.fill_value(cache.v_scales(), std::int64_t(cache.scale_elements()), 1.f / kSyntheticFp8Spread);
      } else {
        be_.fill_normal(cache.k_storage(), n, ++stream, 1.f);
        be_.fill_normal(cache.v_storage(), n, ++stream, 1.f);
      }
    }
    for (auto& q : window_q_) be_.fill_normal(q.data(), std::int64_t(q.size()), ++stream, 1.f);
    history_.assign(std::size_t(B), {});
    for (int b = 0; b < B; ++b) history_[std::size_t(b)].assign(std::size_t(lengths[std::size_t(b)]), 0);  // token 0 stands in
    finish_prefill(prompt_caches, compress, t0);
    return std::vector<float>(std::size_t(B) * lm_rows_, 0.f);
  }

  // One decode step for every sequence of the batch; returns logits [B, vocab].
  std::vector<float> decode(const std::vector<std::int32_t>& next) {
    const int B = batch_;
    check_step_room(next);
    timing_ = StepTiming();
    const double t0 = be_.now_ms();
    for (int b = 0; b < B; ++b) history_[std::size_t(b)].push_back(next[std::size_t(b)]);
    std::vector<float> logits;
    // The engine counts its decode steps; LycheeDecode asks it which ones are correction steps.
    if (policy_.kind == PolicyKind::kLycheeDecode && lycheedecode_.correction_due(decode_steps_))
      logits = correction_step();
    else
      logits = single_token_step(next);
    ++decode_steps_;
    for (int b = 0; b < B; ++b) ++position_[std::size_t(b)];
    be_.synchronize();
    timing_.total_ms = be_.now_ms() - t0;
    return logits;
  }

  // Starts this decoder from `src`'s finished dense prefill of the same prompts instead of running
  // the prefill again (evaluating several policies on one prefill): a non-compressing policy copies
  // the prompt caches, a compressing one runs kvsift::compress_prompt on them with the window queries
  // `src` kept (DecoderLimits::keep_window_queries >= this policy's W). The prefill logits are src's.
  void prefill_from(const Decoder& src) {
    if (src.policy_.kind != PolicyKind::kDense || src.history_.empty() || src.cache_len_ != src.prompt_len_)
      throw DecoderError("prefill_from: the source must be a dense decoder right after its prefill");
    const int B = src.batch_;
    if (B > lim_.max_batch) throw DecoderError("prefill_from: batch of " + std::to_string(B) + " exceeds the decoder's " + std::to_string(lim_.max_batch));
    for (int L : src.prompt_len_)
      if (L > lim_.max_prompt_len) throw DecoderError("prefill_from: a prompt of " + std::to_string(L) + " tokens exceeds the decoder's limit");
    batch_ = B;
    reset_step_graphs();
    decode_steps_ = 0;
    lycheedecode_state_.restart_step();  // a step that threw may have left the cursor mid-way
    prompt_len_ = src.prompt_len_;
    history_ = src.history_;
    cache_len_ = prompt_len_;
    position_ = prompt_len_;
    timing_ = StepTiming();
    if (policy_.compresses_prompt()) {
      const int W = policy_.compression.window;
      if (src.window_ < W) throw DecoderError("prefill_from: the source kept " + std::to_string(src.window_) + " window queries, this policy needs " + std::to_string(W));
      for (int L : prompt_len_)
        if (L < src.window_) throw DecoderError("prefill_from: a prompt shorter than the kept window");
      window_q_.clear();
      for (int l = 0; l < c_.num_layers; ++l) {  // the last W of the source's kept rows
        std::vector<float> rows(std::size_t(B) * src.window_ * c_.q_dim());
        be_.download(rows.data(), src.window_q_[std::size_t(l)].data(), rows.size());
        std::vector<float> mine;
        for (int b = 0; b < B; ++b) {
          const auto first = rows.begin() + (std::int64_t(b) * src.window_ + (src.window_ - W)) * c_.q_dim();
          mine.insert(mine.end(), first, first + std::int64_t(W) * c_.q_dim());
        }
        window_q_.push_back(be_.template alloc<float>(mine.size()));
        be_.upload(window_q_.back().data(), mine.data(), mine.size());
      }
      std::vector<LayerCache> none;
      compress_prompt_caches(none, &src.decode_caches_);  // reads src's caches, frees nothing of them
      window_q_.clear();
      return;
    }
    // Copy slots [0, L_b) of every (sequence, KV head) row through the host: generic over backends
    // and cheap next to a prefill. Both decoders are contiguous (the evaluation tools' layout) and of
    // one KV dtype; fp8 rows take their per-token scales along.
    if (src.lim_.kv_dtype != lim_.kv_dtype) throw DecoderError("prefill_from: the source has another KV dtype");
    if (lim_.kv_dtype == KvDtype::kFp8)
      copy_prompt_caches<kvsift::fp8_e4m3_t>(src, B);
    else
      copy_prompt_caches<KV>(src, B);
  }

  void set_query_tap(QueryTap tap) { query_tap_ = std::move(tap); }
  KvDtype kv_dtype() const { return lim_.kv_dtype; }
  // Layer l's decode cache, seen with the caller's lengths (backend memory, one per sequence); the
  // offline tools that read it need the contiguous layout (the default).
  kvsift::ContiguousKV<KV> cache_view(int layer, const std::int32_t* lengths) const {
    return decode_caches_[std::size_t(layer)].contiguous(batch_, lengths);
  }
  // The last W kept window queries of layer l (DecoderLimits::keep_window_queries >= W), as kvsift QueryRows.
  kvsift::QueryRows<float> window_queries(int layer, int W) const {
    if (W > window_ || window_q_.empty()) throw DecoderError("window_queries: this decoder kept " + std::to_string(window_) + " window queries");
    kvsift::QueryRows<float> q = kvsift::make_query_rows<float>(window_q_[std::size_t(layer)].data(), window_, c_.num_q_heads, c_.head_dim);
    q.data += std::int64_t(window_ - W) * q.position_stride;
    q.capacity = W;
    return q;
  }
  const StepTiming& timing() const { return timing_; }
  // On: with the attention timing off and no query tap, decode steps (and LycheeDecode's correction
  // steps, into a graph of their own) are recorded into a CUDA graph once per prefill and replayed
  // (CUDA backend; no effect on the host).
  void set_graph_steps(bool on) { graph_steps_ = on; }
  // Off: no synchronisation around kvsift's calls (or a rank's all-reduces) and an attention share of
  // 0 (speed benchmarks).
  void set_attention_timing(bool on) { time_attention_ = on; }
  const std::vector<int>& cache_lengths() const { return cache_len_; }
  int batch() const { return batch_; }

  // --profile (engine/step_profile.hpp times these): the device work of an ordinary decode step in
  // parts that launch alone. kStep: the whole step; kWeights: the step with every attention slot
  // empty (embedding, norms, projections, RoPE, store_kv, MLP, LM head); kAttention: kvsift's
  // attention launches of every layer (for LycheeDecode without the top-k handoff); kLayerCalls:
  // the policy's call of every layer (LycheeDecode's decode_layer: attention and handoff; for the
  // other policies the same as kAttention).
  enum class StepPart { kStep, kWeights, kAttention, kLayerCalls };
  // Sets up the step decode(next) would run (its rows and lengths), runs it once and keeps each
  // layer's queries, so that run_step_part launches the parts with that step's inputs. Every part
  // rewrites the same buffers and the same cache slot, so every repetition sees the same lengths and
  // queries (the K/V in the step's own slot are whichever part wrote them last; no cost depends on
  // one token's values). The attention timing is switched off (the parts are timed whole). The
  // decoder is left inside the step: prefill again before decoding.
  void begin_step_parts(const std::vector<std::int32_t>& next) {
    if (batch_ == 0) throw DecoderError("begin_step_parts: prefill first");
    check_step_room(next);
    const int B = batch_;
    time_attention_ = false;
    upload_step_rows(next);
    profile_q_.clear();
    for (int l = 0; l < c_.num_layers; ++l) profile_q_.push_back(be_.template alloc<float>(std::size_t(B) * c_.q_dim()));
    if (policy_.kind == PolicyKind::kLycheeDecode)
      profile_scores_ = be_.template alloc<float>(std::size_t(lycheedecode_.config().max_batch) * c_.num_kv_heads *
                                                  std::size_t(lycheedecode_score_stride()));
    abandon_on_throw([&] {
      single_token_forward([&](int l, const float* q, float* out) {
        // A decode step's seq_ rows are 0 .. B-1, so scattering to them copies the B query rows.
        be_.scatter_rows(q, B, c_.q_dim(), seq_.data(), profile_q_[std::size_t(l)].data());
        step_attention(l, q, out, false);
      });
    });
    be_.synchronize();
  }
  // Launches one part (after begin_step_parts): with graph steps on, from a CUDA graph of its own
  // recorded on the first call (the whole step replays the decode step's graph), else directly.
  void run_step_part(StepPart part) {
    if (profile_q_.empty()) throw DecoderError("run_step_part: call begin_step_parts first");
    const auto launch = [&] {
      abandon_on_throw([&] {
        switch (part) {
          case StepPart::kStep:
            single_token_forward();
            break;
          case StepPart::kWeights:
            single_token_forward([](int, const float*, float*) {});
            break;
          case StepPart::kAttention:
          case StepPart::kLayerCalls:
            for (int l = 0; l < c_.num_layers; ++l)
              step_attention(l, profile_q_[std::size_t(l)].data(), attn_.data(), part == StepPart::kAttention);
            join_side_work();
            break;
        }
      });
    };
    if (graph_steps_ && !query_tap_)
      be_.replay(part == StepPart::kStep ? step_graph_ : part_graphs_[int(part)], launch);
    else
      launch();
  }
  // Whether the policy's layer calls select (kLayerCalls differs from kAttention): LycheeDecode.
  bool step_selects() const { return policy_.kind == PolicyKind::kLycheeDecode; }
  bool graph_steps() const { return graph_steps_; }
  // Bytes of K and V the decode caches hold now, and the bytes allocated for them.
  std::int64_t kv_bytes_used() const {
    std::int64_t tokens = 0;
    for (int n : cache_len_) tokens += n;
    return tokens * kv_bytes_per_token();
  }
  std::int64_t kv_bytes_allocated() const { return std::int64_t(lim_.max_batch) * decode_capacity_ * kv_bytes_per_token(); }
  // The HBM bytes the last decode step had to read at the least, for the roofline: every projection
  // matrix and the LM head once (the batch shares them), plus the K/V the policy attends to: the whole
  // (possibly compressed) cache for dense and prompt compression; for LycheeDecode, the whole cache of
  // retrieval heads and min(length, budget) tokens of sparse heads (ratio mode: the kept fraction).
  // Norm weights, embedding rows, activations and index tables are left out (< 0.1% at 8B).
  std::int64_t step_bytes() const { return weight_bytes() + attended_kv_bytes(); }
  // The first part of step_bytes: every projection matrix and the LM head, once.
  std::int64_t weight_bytes() const {
    const std::int64_t H = c_.hidden_size, I = c_.intermediate_size;
    const std::int64_t weights = c_.num_layers * (H * (c_.q_dim() + 2 * c_.kv_dim()) + c_.q_dim() * H + 3 * H * I) +
                                 std::int64_t(lm_rows_) * H;
    return weights * std::int64_t(sizeof(*w_.lm_head.data.data()));
  }
  // The second part: the K/V the policy attends to.
  std::int64_t attended_kv_bytes() const {
    const std::int64_t row_bytes = 2 * kv_row_bytes();  // one token of one KV head, K and V
    std::int64_t kv_rows = 0;  // (token, layer, KV head) triples read
    for (int n : cache_len_) {
      if (policy_.kind != PolicyKind::kLycheeDecode) {
        kv_rows += std::int64_t(n) * c_.num_layers * c_.num_kv_heads;
        continue;
      }
      const kvsift::LycheeDecodeConfig& lc = lycheedecode_.config();
      const LycheeDecodeOptions& o = policy_.lycheedecode;
      const std::int64_t kept = o.mode == "ratio"   ? std::int64_t(double(n) * (1.0 - o.rho))
                                : o.mode == "block" ? std::int64_t(o.budget) * o.block_size
                                                    : std::int64_t(o.budget);
      for (int l = 0; l < c_.num_layers; ++l)
        for (int h = 0; h < c_.num_kv_heads; ++h) kv_rows += lc.roles.is_retrieval(l, h) ? n : std::min<std::int64_t>(n, kept);
    }
    return kv_rows * row_bytes;
  }

 private:
  // The packed rows of one prefill chunk: positions [start, start + C) of every sequence that has them.
  struct ChunkPlan {
    std::vector<std::int32_t> tokens, positions, seq, slots, window_rows;
    std::vector<std::int32_t> offset, count, ends, last_row;  // per sequence
  };

  // The ordinary decode step: the new token's K/V appended at slot cache_len[b], one query per sequence.
  std::vector<float> single_token_step(const std::vector<std::int32_t>& next) {
    upload_step_rows(next);
    return run_step(step_graph_, [&] { single_token_forward(); });
  }
  // The device part of a step (`forward`, which reads only device buffers filled before it), then its
  // logits to the host. On the GPU `forward` is captured into `graph` once and replayed (kvsift's
  // launchers never allocate or synchronise and size their grids from capacities, never from device
  // lengths: that is what makes this legal); not with the attention timing on (it synchronises) or a
  // query tap (it reads on the host).
  template <class F>
  std::vector<float> run_step(typename Backend::StepGraph& graph, F&& forward) {
    const auto guarded = [&] { abandon_on_throw(forward); };
    if (graph_steps_ && !time_attention_ && !query_tap_)
      be_.replay(graph, guarded);
    else
      guarded();
    std::vector<float> logits(std::size_t(batch_) * lm_rows_);
    be_.download(logits.data(), logits_.data(), logits.size());
    return logits;
  }

  // A step can take `next`: one token per sequence, and a free cache slot for each.
  void check_step_room(const std::vector<std::int32_t>& next) const {
    if (int(next.size()) != batch_) throw DecoderError("decode needs one token per sequence");
    for (int b = 0; b < batch_; ++b)
      if (next[std::size_t(b)] < 0 || next[std::size_t(b)] >= c_.vocab_size)
        throw DecoderError("sequence " + std::to_string(b) + ": token id " + std::to_string(next[std::size_t(b)]) +
                           " outside the vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
    for (int b = 0; b < batch_; ++b)
      if (cache_len_[std::size_t(b)] >= decode_capacity_)
        throw DecoderError("sequence " + std::to_string(b) + " would exceed the KV cache of " + std::to_string(decode_capacity_) + " tokens");
  }

  // The inputs of an ordinary step in the device buffers: row b is sequence b's new token at
  // position position_[b], stored at slot cache_len[b]; the lengths then count it.
  void upload_step_rows(const std::vector<std::int32_t>& next) {
    const int B = batch_;
    std::vector<std::int32_t> seq(static_cast<std::size_t>(B)), slots(cache_len_);
    for (int b = 0; b < B; ++b) seq[std::size_t(b)] = b;
    upload_rows(next, position_, seq, slots);
    for (int b = 0; b < B; ++b) ++cache_len_[std::size_t(b)];  // the new token attends to itself
    be_.upload(lengths_.data(), cache_len_.data(), std::size_t(B));
  }

  // The device part of single_token_step: embedding, every layer, final norm and LM head into logits_.
  // `attention(l, q, out)` fills the attention slot of layer l: the policy's call (step_attention) in
  // a real step; --profile also runs the step with an empty slot (its weights part).
  template <class Attention>
  void single_token_forward(Attention&& attention) {
    const int B = batch_;
    be_.embed(tokens_.data(), B, w_.embed, x_.data());
    for (int l = 0; l < c_.num_layers; ++l)
      layer_forward(l, B, decode_caches_[std::size_t(l)], [&](const float* q, float* out) { attention(l, q, out); });
    lm_head_to_device(x_.data(), B);
    join_side_work();  // the last selecting layer's handoff ran beside the layers after it and the LM head
  }
  // Runs `f` (device work of a step); if it throws, abandon_step first.
  template <class F>
  void abandon_on_throw(F&& f) {
    try {
      f();
    } catch (...) {
      abandon_step();
      throw;
    }
  }
  // A step that threw half way: join what it left on the side stream (inside a capture, so that the
  // capture can end; launched, so that the next step's writes wait for it) and restart LycheeDecode's
  // layer cursor, so that the decoder can prefill and decode again.
  void abandon_step() noexcept {
    try {
      join_side_work();
    } catch (...) {  // the step's own error is the one to report
    }
    side_pending_ = false;
    lycheedecode_state_.restart_step();
  }
  // Work step_attention queued on the backend's side stream (LycheeDecode's handoff), if still
  // unjoined: the step's stream waits for it (an event; a graph edge when captured).
  void join_side_work() {
    if (!side_pending_) return;
    side_pending_ = false;
    be_.join_side();
  }
  void single_token_forward() {
    single_token_forward([&](int l, const float* q, float* out) { step_attention(l, q, out, false); });
  }

  // The attention slot of decode-step layer l over its cache, one query per sequence. The policy's
  // call: for LycheeDecode attend_layer, then its retrieval heads' top-k handoff (hand_off_layer) on
  // the side stream (decode_layer on one stream while the attention is timed), else dense
  // decode_attention. With `attention_only` (--profile) LycheeDecode runs the attention launch alone,
  // without the handoff, so that the selection's cost is the difference.
  void step_attention(int l, const float* q, float* out, bool attention_only) {
    const int B = batch_;
    join_side_work();  // the previous layer's handoff wrote the index rows this attention reads
    decode_caches_[std::size_t(l)].with_view(B, lengths_.data(), [&](const auto& kv) {
      if (policy_.kind != PolicyKind::kLycheeDecode) {
        // kvsift: one query per sequence over the layer's (possibly compressed) cache, ragged lengths.
        attend(l, kv, q, out, 1);
        return;
      }
      // kvsift: retrieval heads attend densely and refresh the index table; sparse heads attend
      // to the table rows of the latest retrieval head with their index.
      with_query_rows(kv, q, out, std::int64_t(B) * c_.q_dim(), [&](const auto* qq, auto* oo) {
        const auto io = kvsift::make_query_io(qq, oo, 1, c_.num_q_heads, c_.head_dim);
        if (attention_only) {
          lycheedecode_attention_only(l, kv, io);
          return;
        }
        const kvsift::Workspace ws{lycheedecode_ws_.data(), lycheedecode_ws_.size()};
        if (time_attention_) {  // the attention share times both halves, on one stream
          timed([&] {
            check(lycheedecode_.decode_layer(be_.exec(), lycheedecode_state_, l, kv, io, ws),
                  "LycheeDecode decode_layer (layer " + std::to_string(l) + ")");
          });
          return;
        }
        // The handoff (the retrieval heads' top-k into the index table) is read only by later
        // layers' attention: it runs on the backend's side stream beside this layer's o-projection
        // and MLP and the next layer's projections, and is joined before the next attention.
        check(lycheedecode_.attend_layer(be_.exec(), lycheedecode_state_, l, kv, io, ws),
              "LycheeDecode attend_layer (layer " + std::to_string(l) + ")");
        if (lycheedecode_.retrieval_heads(l) == 0) return;
        be_.fork_side();
        side_pending_ = true;
        check(lycheedecode_.hand_off_layer(be_.side_exec(), lycheedecode_state_, l, kv, ws),
              "LycheeDecode hand_off_layer (layer " + std::to_string(l) + ")");
      });
    });
  }

  // --profile: the decode_attention launch LycheeDecode's decode_layer makes for layer l (the same
  // parameters, built by kvsift's own function; retrieval heads' scores included), into a score
  // buffer of the profile's. The top-k handoff (hand_off_layer) only runs after its own attend_layer,
  // whose scores it ranks, so the selection is timed as decode_layer minus this launch.
  template <class View, class T>
  void lycheedecode_attention_only(int l, const View& kv, const kvsift::QueryIO<T>& io) {
    const bool selects = lycheedecode_.retrieval_heads(l) > 0;
    const auto p = kvsift::detail::lycheedecode_attention_params(
        lycheedecode_.config(), io, 1, lycheedecode_.roles(l), kvsift::as_const(lycheedecode_state_.table),
        selects ? profile_scores_.data() : nullptr, lycheedecode_score_stride());
    check(decode_attention(be_.exec(), kv, p, kvsift::Workspace{lycheedecode_ws_.data(), lycheedecode_ws_.size()}),
          "LycheeDecode attention (layer " + std::to_string(l) + ")");
  }

  // Floats per score row of a LycheeDecode layer: one per entry (token or block) of the longest
  // sequence, rounded up to 16 bytes as decode_layer's own score rows are.
  std::int64_t lycheedecode_score_stride() const {
    const kvsift::LycheeDecodeConfig& lc = lycheedecode_.config();
    const int entry = kvsift::lycheedecode_entry_tokens(lc);
    return (std::int64_t(lc.max_kv_length + entry - 1) / entry + 3) / 4 * 4;
  }

  // LycheeDecode cache correction: the last N positions (the new token included) run through every
  // layer again with dense causal attention (correct_layer, q_len = N), overwriting their K/V, which
  // sparse steps computed from approximate attention. The next token comes from the last row of each
  // sequence. The rows are position-major, row i * B + b holding position last - N + 1 + i of sequence
  // b (kvsift's query rows take any strides), so the new tokens' rows are the last B, contiguous: the
  // LM head runs once for the batch into logits_, as in the ordinary step, and everything after the
  // uploads reads only device buffers, so with graph steps on it is recorded into a graph of its own at
  // the first correction after a prefill and replayed at the later ones.
  std::vector<float> correction_step() {
    const int B = batch_, N = policy_.lycheedecode.correction_interval;
    std::vector<std::int32_t> tokens(std::size_t(B) * N), positions(tokens.size()), seq(tokens.size()), slots(tokens.size());
    // The schedule (decode_steps_, restarted by every prefill) puts a correction at least N - 1 steps
    // after the prompt, so the window never starts before position 0; checked before any state moves.
    for (int b = 0; b < B; ++b)
      if (position_[std::size_t(b)] - N + 1 < 0)
        throw DecoderError("correction step: the window of " + std::to_string(N) + " positions starts before the prompt");
    for (int i = 0; i < N; ++i)
      for (int b = 0; b < B; ++b) {
        // The new token's position is position_[b] (== its slot: no compression under LycheeDecode).
        const int pos = position_[std::size_t(b)] - N + 1 + i;
        const std::size_t r = std::size_t(i) * B + std::size_t(b);
        tokens[r] = history_[std::size_t(b)][std::size_t(pos)];
        positions[r] = pos;
        seq[r] = b;
        slots[r] = pos;
      }
    for (int b = 0; b < B; ++b) ++cache_len_[std::size_t(b)];
    upload_rows(tokens, positions, seq, slots);
    be_.upload(lengths_.data(), cache_len_.data(), std::size_t(B));
    return run_step(correction_graph_, [&] { correction_forward(); });
  }

  // The device part of correction_step: embedding, every layer (correct_layer over the position-major
  // rows), final norm and LM head of the last B rows into logits_.
  void correction_forward() {
    const int B = batch_, N = policy_.lycheedecode.correction_interval;
    be_.embed(tokens_.data(), B * N, w_.embed, x_.data());
    for (int l = 0; l < c_.num_layers; ++l) {
      LayerCache& cache = decode_caches_[std::size_t(l)];
      layer_forward(l, B * N, cache, [&](const float* q, float* out) {
        cache.with_view(B, lengths_.data(), [&](const auto& kv) {
          with_query_rows(kv, q, out, std::int64_t(B) * N * c_.q_dim(), [&](const auto* qq, auto* oo) {
            // [position, batch, heads, head_dim]: sequence b's position i at row i * B + b.
            auto io = kvsift::make_query_io(qq, oo, N, c_.num_q_heads, c_.head_dim);
            io.q.batch_stride = io.out.batch_stride = c_.q_dim();
            io.q.position_stride = io.out.position_stride = std::int64_t(B) * c_.q_dim();
            timed([&] {
              check(lycheedecode_.correct_layer(be_.exec(), lycheedecode_state_, l, kv, io,
                                                kvsift::Workspace{lycheedecode_ws_.data(), lycheedecode_ws_.size()}),
                    "LycheeDecode correct_layer (layer " + std::to_string(l) + ")");
            });
          });
        });
      });
    }
    lm_head_to_device(x_.data() + std::int64_t(N - 1) * B * c_.hidden_size, B);
  }

  // Runs `f` and adds its wall time to the step's attention share (or to `*into`). The
  // synchronisations around it keep a GPU from running ahead of the host, so speed runs turn the
  // measurement off.
  template <class F>
  void timed(F&& f, double* into = nullptr) {
    if (!time_attention_) {
      f();
      return;
    }
    be_.synchronize();
    const double t0 = be_.now_ms();
    f();
    be_.synchronize();
    *(into ? into : &timing_.attention_ms) += be_.now_ms() - t0;
  }

  // A tensor-parallel rank's sum of the ranks' partial outputs, timed with the attention (the time
  // includes the wait for the slowest rank).
  void all_reduce(float* data, std::int64_t n) {
    if (rank_.ranks > 1) timed([&] { rank_.all_reduce(data, n); }, &timing_.all_reduce_ms);
  }

  // One token of one KV head, K or V: head_dim elements, and for fp8 its float scale.
  std::int64_t kv_row_bytes() const {
    return lim_.kv_dtype == KvDtype::kFp8 ? std::int64_t(c_.head_dim) + std::int64_t(sizeof(float))
                                          : std::int64_t(c_.head_dim) * std::int64_t(sizeof(KV));
  }
  std::int64_t kv_bytes_per_token() const { return 2 * std::int64_t(c_.num_kv_heads) * c_.num_layers * kv_row_bytes(); }

  // The query type kvsift's attention takes over a view: bf16 over fp8 KV, the decoder's float otherwise.
  template <class View>
  using query_type = std::conditional_t<kvsift::is_fp8_view_v<View>, kvsift::bfloat16_t, float>;

  // f(q, out) with the layer's query and output rows ([rows, q_heads * head_dim], `elems` elements) in
  // the type attention over `kv` takes: the float rows themselves, or for an fp8 cache bf16 copies
  // (kvsift: fp8 KV needs bf16 or fp16 queries), the bf16 output widened back into `out` afterwards.
  template <class View, class F>
  void with_query_rows(const View&, const float* q, float* out, std::int64_t elems, F&& f) {
    if constexpr (!kvsift::is_fp8_view_v<View>) {
      f(q, out);
    } else if constexpr (!Backend::template attends_kv<typename View::value_type>()) {
      throw DecoderError(Backend::kFp8AttentionMissing);  // f is never instantiated for this backend
    } else {
      be_.narrow_to_bf16(q, elems, q16_.data());
      f(static_cast<const kvsift::bfloat16_t*>(q16_.data()), out16_.data());
      be_.widen_from_bf16(out16_.data(), elems, out);
    }
  }

  template <class T>
  void copy_prompt_caches(const Decoder& src, int B) {
    const int D = c_.head_dim, H = c_.num_kv_heads;
    for (int l = 0; l < c_.num_layers; ++l) {
      const auto from = src.decode_caches_[std::size_t(l)].template contiguous_as<T>(B, nullptr);
      const auto to = decode_caches_[std::size_t(l)].template contiguous_as<T>(B, nullptr);
      for (int b = 0; b < B; ++b) {
        const int L = prompt_len_[std::size_t(b)];
        for (int h = 0; h < H; ++h) {
          const std::size_t n = std::size_t(L) * D;
          std::vector<T> tmp(n);
          be_.download(tmp.data(), from.k_row(b, h, 0), n);
          be_.upload(to.k_row(b, h, 0), tmp.data(), n);
          be_.download(tmp.data(), from.v_row(b, h, 0), n);
          be_.upload(to.v_row(b, h, 0), tmp.data(), n);
          if constexpr (kvsift::is_fp8_dtype<T>::value) {
            // [batch, heads, capacity] scales (kv_cache.hpp): tokens [0, L) of head h are L consecutive floats.
            std::vector<float> s(static_cast<std::size_t>(L));
            be_.download(s.data(), from.scales.k + from.scale_offset(b, h, 0), s.size());
            be_.upload(to.scales.k + to.scale_offset(b, h, 0), s.data(), s.size());
            be_.download(s.data(), from.scales.v + from.scale_offset(b, h, 0), s.size());
            be_.upload(to.scales.v + to.scale_offset(b, h, 0), s.data(), s.size());
          }
        }
      }
    }
  }

  // What a prefill of batch_ sequences writes besides the decode caches: the kept window queries of
  // every layer, and for a compressing policy full-length prompt caches (returned; compression reads
  // them once and frees them). A dense prefill writes the decode caches directly and gets none.
  std::vector<LayerCache> allocate_prefill_buffers() {
    window_q_.clear();
    if (window_ > 0)
      for (int l = 0; l < c_.num_layers; ++l)
        window_q_.push_back(be_.template alloc<float>(std::size_t(batch_) * window_ * c_.q_dim()));
    std::vector<LayerCache> prompt_caches;
    if (policy_.compresses_prompt())
      for (int l = 0; l < c_.num_layers; ++l) prompt_caches.push_back(allocate_cache(lim_.max_prompt_len));
    return prompt_caches;
  }

  LayerCache allocate_cache(int capacity) {
    KvCacheShape shape;
    shape.layout = lim_.kv_layout;
    shape.max_batch = lim_.max_batch;
    shape.capacity = capacity;
    shape.num_kv_heads = c_.num_kv_heads;
    shape.head_dim = c_.head_dim;
    shape.page_size = lim_.page_size;
    shape.dtype = lim_.kv_dtype;
    return LayerCache(be_, shape);
  }

  ChunkPlan plan_chunk(int start, int C) const {
    ChunkPlan p;
    const int B = batch_, W = window_;
    for (int b = 0; b < B; ++b) {
      const int L = prompt_len_[std::size_t(b)], end = std::min(L, start + C);
      p.offset.push_back(std::int32_t(p.tokens.size()));
      p.count.push_back(std::max(0, end - start));
      p.ends.push_back(std::max(0, end));
      p.last_row.push_back(-1);
      // Window row i of sequence b holds position L - min(W, L) + i (kvsift::QueryRows layout).
      const int first_window_pos = L - std::min(W, L);
      for (int pos = start; pos < end; ++pos) {
        if (pos == L - 1) p.last_row.back() = std::int32_t(p.tokens.size());
        p.tokens.push_back(prompt_tokens_at(b, pos));
        p.positions.push_back(pos);
        p.seq.push_back(b);
        p.slots.push_back(pos);
        p.window_rows.push_back(pos >= first_window_pos ? b * W + (pos - first_window_pos) : -1);
      }
    }
    return p;
  }

  std::int32_t prompt_tokens_at(int b, int pos) const { return (*prompts_)[std::size_t(b)][std::size_t(pos)]; }

  void upload_rows(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& positions,
                   const std::vector<std::int32_t>& seq, const std::vector<std::int32_t>& slots) {
    const std::size_t n = tokens.size();
    be_.upload(tokens_.data(), tokens.data(), n);
    be_.upload(positions_.data(), positions.data(), n);
    be_.upload(seq_.data(), seq.data(), n);
    be_.upload(slots_.data(), slots.data(), n);
  }

  // One transformer block over the n rows in x_, pre-norm residual:
  //   x += o_proj(attention(rope(q), rope(k), v));  x += down(silu(gate(x)) * up(x))
  // `attention(q, out)` is the policy's part; K/V of the rows are stored before it runs.
  // Each residual add is fused into the norm that follows it, and each norm into the projections
  // after it (norm_linear_shared_input): the MLP's output (h_) reaches the residual at the start of
  // the next layer (x_ -> x_mid_), the attention's before the MLP (x_mid_ -> x_); the last layer adds
  // the MLP's itself.
  template <class Attention>
  void layer_forward(int l, int n, LayerCache& cache, Attention&& attention) {
    const auto& lw = w_.layers[std::size_t(l)];
    const int H = c_.hidden_size, D = c_.head_dim;
    be_.norm_linear_shared_input(x_.data(), l == 0 ? nullptr : h_.data(), x_mid_.data(), n, H, lw.attn_norm.data(),
                                 c_.rms_norm_eps, h_.data(), {{&lw.wq, q_.data()}, {&lw.wk, k_.data()}, {&lw.wv, v_.data()}});
    if (c_.qk_norm) {
      be_.rms_norm(q_.data(), std::int64_t(n) * c_.num_q_heads, D, lw.q_norm.data(), c_.rms_norm_eps, q_.data());
      be_.rms_norm(k_.data(), std::int64_t(n) * c_.num_kv_heads, D, lw.k_norm.data(), c_.rms_norm_eps, k_.data());
    }
    // RoPE by kvsift's store_kv where its GPU kernel takes the head (head_dim <= 256, which every
    // head_dim the decoder serves is; the same rule on both backends, so they run the same
    // arithmetic), else rope() first.
    const bool rope_in_store = be_.rope_in_store() && D <= 256;
    if (!rope_in_store) be_.rope(q_.data(), c_.num_q_heads, k_.data(), c_.num_kv_heads, positions_.data(), n, D, c_.rope_theta);
    // kvsift: store_kv appends the rows (token i at slot slots_[i] of sequence seq_[i]), rounding to
    // the cache's type; into an fp8 cache it quantizes each row and writes its per-token scale. With the
    // rotary it first turns each K row by RoPE at positions_[i] (the original position, also after
    // compression) and Q in place: one launch for the rotation and the append.
    cache.with_view(lim_.max_batch, lengths_.data(), [&](const auto& kv) {
      auto rows = kvsift::make_store_kv_params(static_cast<const float*>(k_.data()), static_cast<const float*>(v_.data()), n,
                                               c_.num_kv_heads, c_.head_dim, seq_.data(), slots_.data());
      if (rope_in_store) rows = kvsift::with_rotary(rows, rope_inv_freq_.data(), positions_.data(), D, q_.data(), c_.num_q_heads, D);
      check(store_kv(be_.exec(), kv, rows), "store_kv");
    });
    if (query_tap_) query_tap_(l, q_.data(), n);
    attention(q_.data(), attn_.data());
    be_.linear(attn_.data(), n, lw.wo, h_.data());
    all_reduce(h_.data(), std::int64_t(n) * H);  // row-parallel o: sum the ranks' parts
    be_.norm_swiglu_mlp(x_mid_.data(), h_.data(), x_.data(), n, H, lw.mlp_norm.data(), c_.rms_norm_eps, h_.data(), lw.w_gate,
                        lw.w_up, lw.w_down, gate_.data(), up_.data(), h_.data());
    all_reduce(h_.data(), std::int64_t(n) * H);  // row-parallel down
    if (l + 1 == c_.num_layers) be_.add(x_.data(), h_.data(), std::int64_t(n) * H);
  }

  // kvsift: decode_attention (dense heads, causal for q_len > 1), timed as the step's attention share.
  template <class View>
  void attend(int /*layer*/, const View& kv, const float* q, float* out, int q_len) {
    const std::int64_t elems = std::int64_t(kv.batch) * q_len * c_.q_dim();
    with_query_rows(kv, q, out, elems, [&](const auto* qq, auto* oo) {
      auto p = kvsift::make_decode_attention_params(qq, oo, q_len, c_.num_q_heads, c_.head_dim);
      std::size_t bytes = 0;
      check(kvsift::decode_attention_workspace_bytes(be_.exec(), kv, p, &bytes), "decode attention workspace");
      if (bytes > attn_ws_.size()) attn_ws_ = be_.template alloc<unsigned char>(bytes);  // grows during prefill only
      timed([&] { check(decode_attention(be_.exec(), kv, p, kvsift::Workspace{attn_ws_.data(), attn_ws_.size()}), "decode attention"); });
    });
  }

  // x [n, hidden] -> final norm -> LM head -> logits_ [n, vocab] (backend memory)
  void lm_head_to_device(const float* x, int n) {
    be_.rms_norm(x, n, c_.hidden_size, w_.final_norm.data(), c_.rms_norm_eps, h_.data());
    be_.linear(h_.data(), n, w_.lm_head, logits_.data());
  }
  // ... and on to host logits [n, vocab]
  void lm_head(const float* x, int n, float* host_logits) {
    lm_head_to_device(x, n);
    be_.download(host_logits, logits_.data(), std::size_t(n) * lm_rows_);
  }

  // The end of every prefill: the cache now holds the prompt; a compressing policy shrinks it (kvsift's
  // compress_prompt per layer) and decode positions continue at the prompt length either way.
  void finish_prefill(std::vector<LayerCache>& prompt_caches, bool compress, double t0) {
    reset_step_graphs();  // a recorded step is for the previous batch
    decode_steps_ = 0;    // LycheeDecode's correction schedule counts from the prompt
    lycheedecode_state_.restart_step();  // a step that threw may have left its layer cursor mid-way
    cache_len_ = prompt_len_;
    position_ = prompt_len_;
    if (compress) {
      compress_prompt_caches(prompt_caches);  // frees them when it returns
      window_q_.clear();
    }
    be_.synchronize();
    timing_.total_ms = be_.now_ms() - t0;
  }

  void reset_step_graphs() {
    step_graph_.reset();
    correction_graph_.reset();
    for (auto& g : part_graphs_) g.reset();
  }

  // kvsift: compress_prompt once per layer, from the full prompt cache into the decode cache.
  // Every KV head of a sequence keeps the same number of tokens, so the result is an ordinary cache
  // whose lengths replace the prompt lengths; positions keep counting from the prompt length.
  // `borrowed`, when given, replaces the decoder's own prompt caches as the source (prefill_from).
  void compress_prompt_caches(std::vector<LayerCache>& prompt_caches, const std::vector<LayerCache>* borrowed = nullptr) {
    const int B = batch_;
    const kvsift::PromptCompressionConfig config = policy_.compression_config();
    const kvsift::PromptCompressionShape shape{B, c_.num_kv_heads, c_.num_q_heads, lim_.max_prompt_len};
    std::size_t ws_bytes = 0;
    check(kvsift::compress_prompt_workspace_bytes(be_.exec(), config, shape, &ws_bytes), "compress_prompt workspace");
    Buffer<unsigned char> ws = be_.template alloc<unsigned char>(ws_bytes);
    Buffer<std::int32_t> new_lengths = be_.template alloc<std::int32_t>(std::size_t(B));
    be_.upload(lengths_.data(), prompt_len_.data(), std::size_t(B));
    for (int l = 0; l < c_.num_layers; ++l) {
      const LayerCache& from = borrowed ? (*borrowed)[std::size_t(l)] : prompt_caches[std::size_t(l)];
      const auto window = kvsift::make_query_rows<float>(window_q_[std::size_t(l)].data(), config.window,
                                                         c_.num_q_heads, c_.head_dim);
      kvsift::CompactOutputs out;
      out.new_lengths = new_lengths.data();
      from.with_view(B, lengths_.data(), [&](const auto& src) {
        decode_caches_[std::size_t(l)].with_view(B, new_lengths.data(), [&](const auto& dst) {
          // Prompt and decode caches share the KV dtype (with_view instantiates every pairing).
          using SrcT = typename std::decay_t<decltype(src)>::value_type;
          using DstT = typename std::decay_t<decltype(dst)>::value_type;
          if constexpr (std::is_same_v<SrcT, DstT>) {
            check(kvsift::compress_prompt(be_.exec(), config, shape, src, window, nullptr, dst, out,
                                          kvsift::Workspace{ws.data(), ws.size()}),
                  "compress_prompt (layer " + std::to_string(l) + ")");
          } else {
            throw DecoderError("compress_prompt: the prompt and decode caches differ in KV dtype");
          }
        });
      });
      if (!borrowed) prompt_caches[std::size_t(l)] = LayerCache();  // free the full prompt cache of this layer
    }
    be_.download(cache_len_.data(), new_lengths.data(), std::size_t(B));
  }

  Backend& be_;
  const ModelConfig& c_;
  const BackendWeights<Backend>& w_;
  PolicyOptions policy_;
  DecoderLimits lim_;
  DecoderRank rank_;
  int lm_rows_ = 0;  // LM-head rows: vocab_size, or this tensor-parallel rank's slice
  int decode_capacity_ = 0;
  int batch_ = 0;
  const std::vector<std::vector<std::int32_t>>* prompts_ = nullptr;
  std::vector<int> prompt_len_, cache_len_, position_;
  std::vector<std::vector<std::int32_t>> history_;  // every sequence's tokens so far (cache correction)
  kvsift::LycheeDecodePolicy lycheedecode_;
  kvsift::LycheeDecodeState lycheedecode_state_;
  bool side_pending_ = false;  // work on the side stream not joined yet (step_attention)
  std::int64_t decode_steps_ = 0;  // decode steps since the last prefill: decides correction steps
  Buffer<unsigned char> lycheedecode_state_mem_, lycheedecode_ws_;
  std::vector<LayerCache> decode_caches_;
  std::vector<Buffer<float>> window_q_;
  int window_ = 0;  // window queries kept per sequence: the policy's W, or keep_window_queries
  QueryTap query_tap_;
  // x_: the residual stream between layers; x_mid_: inside a layer, between its two norms (each norm
  // writes the updated residual to the other buffer, so its GEMV can read the old one meanwhile).
  Buffer<float> x_, x_mid_, h_, q_, k_, v_, attn_, gate_, up_, logits_;
  Buffer<float> rope_inv_freq_;  // [head_dim / 2]
  Buffer<std::int32_t> tokens_, positions_, seq_, slots_, window_rows_, lengths_;
  Buffer<unsigned char> attn_ws_;
  Buffer<kvsift::bfloat16_t> q16_, out16_;  // --kv-dtype fp8: the query and output rows in bf16
  StepTiming timing_;
  bool time_attention_ = true;
  bool graph_steps_ = false;
  typename Backend::StepGraph step_graph_;
  typename Backend::StepGraph correction_graph_;  // LycheeDecode's correction step, recorded the same way
  // --profile: a graph per step part (StepPart's order; the whole step replays step_graph_), each
  // layer's queries of the profiled step, and LycheeDecode's score rows of its attention-only launches.
  typename Backend::StepGraph part_graphs_[4];
  std::vector<Buffer<float>> profile_q_;
  Buffer<float> profile_scores_;
};

}  // namespace minimal_decoder
