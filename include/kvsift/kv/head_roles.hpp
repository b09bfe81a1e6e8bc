#pragma once
/// \file
/// \brief Head roles: which KV heads attend to every token and which only to their index-set row.
///
///   retrieval head  dense attention over the whole sequence; in LycheeDecode it also selects the
///                   entries of its index-set row, which the sparse heads of the same KV-head index
///                   read in later layers
///   sparse head     attention over the entries of its index-set row only
///
/// HeadRoleMask is one layer's roles, a bit per KV head, SET = SPARSE: the empty mask is plain dense
/// attention, the natural default of an attention op. HeadRoles is a model's table, one mask per
/// layer, in the model's original KV-head order. The same type serves the op (decode_attention reads
/// one layer's mask), the policy (LycheeDecode holds the table) and the roles file (gates/roles_file.hpp).
/// A host value: the launcher needs roles to balance work before launch.

#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"

namespace kvsift {

/// Largest number of KV heads per layer a role mask (and so an attention call) can describe.
inline constexpr int kMaxKvHeads = 256;

/// One layer's roles: a bit per KV head (up to kMaxKvHeads), set bit = sparse head. Default-constructed,
/// every head is a retrieval head (plain dense attention). A host value, compared bit for bit.
class HeadRoleMask {
 public:
  /// Every head a retrieval head: the empty mask.
  static HeadRoleMask all_retrieval() { return HeadRoleMask(); }
  /// Heads [0, num_kv_heads) sparse (clamped to kMaxKvHeads); any further head a retrieval head.
  static HeadRoleMask all_sparse(int num_kv_heads) {
    HeadRoleMask m;
    for (int h = 0; h < num_kv_heads && h < kMaxKvHeads; ++h) m.set_sparse(h, true);
    return m;
  }
  /// Makes head `h` (in [0, kMaxKvHeads), unchecked) a sparse head (`sparse`) or a retrieval head.
  void set_sparse(int h, bool sparse) {
    const std::uint64_t bit = std::uint64_t(1) << (h % 64);
    bits_[h / 64] = sparse ? (bits_[h / 64] | bit) : (bits_[h / 64] & ~bit);
  }
  /// Whether head `h` (in [0, kMaxKvHeads), unchecked) is a sparse head.
  KVSIFT_HD bool is_sparse(int h) const {
    // The word is chosen by selects on constant indices, never by a computed index: a mask inside a
    // kernel parameter then stays in registers / the parameter bank instead of forcing the whole
    // parameter into addressable memory.
    static_assert(kMaxKvHeads == 256, "four 64-bit words");
    std::uint64_t word = bits_[0];
    word = h >= 64 ? bits_[1] : word;
    word = h >= 128 ? bits_[2] : word;
    word = h >= 192 ? bits_[3] : word;
    return (word >> (h & 63)) & 1u;
  }
  /// Whether head `h` is a retrieval head (the complement of is_sparse).
  KVSIFT_HD bool is_retrieval(int h) const { return !is_sparse(h); }
  /// Sparse heads among [0, num_kv_heads): the heads that need an index-set row.
  KVSIFT_HD int count_sparse(int num_kv_heads) const {
    return num_kv_heads > 0 ? num_kv_heads - count_retrieval(num_kv_heads) : 0;
  }
  /// Retrieval heads among [0, num_kv_heads), num_kv_heads in [0, kMaxKvHeads].
  KVSIFT_HD int count_retrieval(int num_kv_heads) const {
    int n = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int w = 0; w < kMaxKvHeads / 64; ++w) n += popcount64(retrieval_word(w, num_kv_heads));
    return n;
  }
  /// The `n`-th retrieval head (counting from 0) among [0, num_kv_heads), for n in
  /// [0, count_retrieval(num_kv_heads)); -1 past the last. A few popcounts, no loop over the heads:
  /// top-k's row filter maps each CTA group to its row with it.
  KVSIFT_HD int nth_retrieval(int n, int num_kv_heads) const {
    int head = -1;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int w = 0; w < kMaxKvHeads / 64; ++w) {
      std::uint64_t word = retrieval_word(w, num_kv_heads);
      const int c = popcount64(word);
      if (head < 0 && n >= 0 && n < c) head = 64 * w + nth_set_bit64(word, n);
      n -= c;
    }
    return head;
  }
  /// Same role for every head slot, including slots beyond the layer's head count.
  bool operator==(const HeadRoleMask& o) const {
    for (int i = 0; i < kMaxKvHeads / 64; ++i)
      if (bits_[i] != o.bits_[i]) return false;
    return true;
  }
  /// !(*this == o).
  bool operator!=(const HeadRoleMask& o) const { return !(*this == o); }

 private:
  KVSIFT_HD static int popcount64(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
    return __popcll(x);
#else
    return __builtin_popcountll(x);
#endif
  }
  /// Index of the n-th set bit (from 0) of an x with more than n of them: a binary search over the
  /// popcounts of lower halves, six steps for any n. (Dropping the n lowest bits one by one compiled
  /// to ~500 unrolled instructions in every top-k kernel's prologue.)
  KVSIFT_HD static int nth_set_bit64(std::uint64_t x, int n) {
    int pos = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int width = 32; width > 0; width /= 2) {
      const std::uint64_t low = x & ((std::uint64_t(1) << width) - 1);
      const int c = popcount64(low);
      if (n >= c) {
        n -= c;
        x >>= width;
        pos += width;
      } else {
        x = low;
      }
    }
    return pos;
  }
  /// Word w's retrieval bits (clear = retrieval), limited to the heads below num_kv_heads. Callers
  /// pass a constant w (unrolled loops), which keeps a kernel-parameter mask out of local memory.
  KVSIFT_HD std::uint64_t retrieval_word(int w, int num_kv_heads) const {
    const int below = num_kv_heads - 64 * w;
    if (below <= 0) return 0;
    const std::uint64_t valid = below >= 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << below) - 1;
    return ~bits_[w] & valid;
  }

  std::uint64_t bits_[kMaxKvHeads / 64] = {};
};

/// A model's role table: one HeadRoleMask per layer, in the model's original KV-head order. What the
/// roles file stores and LycheeDecodeConfig::roles holds; build it with make_head_roles or by hand.
struct HeadRoles {
  int layers = 0;    ///< transformer layers (masks.size())
  int kv_heads = 0;  ///< KV heads per layer, in [1, kMaxKvHeads]
  std::vector<HeadRoleMask> masks;  ///< [layers]

  /// Layer `l`'s mask (l in [0, layers), unchecked).
  const HeadRoleMask& layer(int l) const { return masks[std::size_t(l)]; }
  /// Whether KV head `h` of layer `l` is a retrieval head.
  bool is_retrieval(int l, int h) const { return layer(l).is_retrieval(h); }
  /// Retrieval heads over all layers (each layer's first kv_heads heads).
  int retrieval_count() const {
    int c = 0;
    for (const HeadRoleMask& m : masks) c += m.count_retrieval(kv_heads);
    return c;
  }
  /// Same shape and the same masks.
  bool operator==(const HeadRoles& o) const { return layers == o.layers && kv_heads == o.kv_heads && masks == o.masks; }
};

/// A table from one byte per (layer, KV head), layer-major, nonzero = retrieval (the layout gate
/// training produces).
inline Status make_head_roles(int layers, int kv_heads, const std::uint8_t* retrieval, HeadRoles* out) {
  KVSIFT_REQUIRE(layers > 0, kInvalidArgument, "layers = ", layers, " must be > 0");
  KVSIFT_REQUIRE(kv_heads > 0 && kv_heads <= kMaxKvHeads, kInvalidArgument, "kv_heads = ", kv_heads,
                 " must be in [1, ", kMaxKvHeads, "]");
  KVSIFT_REQUIRE_NOT_NULL(retrieval, "retrieval");
  KVSIFT_REQUIRE_NOT_NULL(out, "out");
  HeadRoles r;
  r.layers = layers;
  r.kv_heads = kv_heads;
  r.masks.assign(std::size_t(layers), HeadRoleMask());
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h) r.masks[std::size_t(l)].set_sparse(h, retrieval[std::size_t(l) * kv_heads + h] == 0);
  *out = std::move(r);
  return Status();
}

/// The roles of KV heads [first, first + count) of every layer, renumbered from 0: what one rank of a
/// tensor-parallel engine passes to LycheeDecodeConfig::roles when it owns those heads. A sparse head
/// reuses the selection of the same head index from an earlier layer, so a rank that owns a head in
/// every layer owns its whole chain and the policy needs nothing from other ranks.
inline Status shard_head_roles(const HeadRoles& roles, int first, int count, HeadRoles* out) {
  KVSIFT_REQUIRE_NOT_NULL(out, "out");
  KVSIFT_REQUIRE(roles.layers > 0 && int(roles.masks.size()) == roles.layers, kInvalidArgument,
                 "roles: layers = ", roles.layers, " with ", roles.masks.size(), " masks");
  KVSIFT_REQUIRE(count > 0 && first >= 0 && first + count <= roles.kv_heads, kInvalidArgument, "KV heads [", first, ", ",
                 first + count, ") are not inside the roles' [0, ", roles.kv_heads, ")");
  HeadRoles r;
  r.layers = roles.layers;
  r.kv_heads = count;
  r.masks.assign(std::size_t(roles.layers), HeadRoleMask());
  for (int l = 0; l < roles.layers; ++l)
    for (int h = 0; h < count; ++h) r.masks[std::size_t(l)].set_sparse(h, roles.layer(l).is_sparse(first + h));
  *out = std::move(r);
  return Status();
}

}  // namespace kvsift
