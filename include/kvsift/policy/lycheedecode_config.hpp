#pragma once
/// \file
/// \brief LycheeDecode configuration: the model's shape, the head-roles table, the selection mode and its
/// budget, cache correction, and the checks that reject a bad configuration before anything runs.
/// Semantics: docs/ops/lycheedecode.md; the method: docs/algorithms/lycheedecode.md §2 (roles), §5-§6
/// (selection, forced sink/recent), §8 (cache correction).
///
/// Selection modes (one index row per (sequence, KV head), chosen by the retrieval head of that KV-head
/// index):
///
///   kToken  `budget` tokens; the first `sink` and the last `recent` tokens are always kept and count
///           inside the budget; the rest goes to the highest raw group-mean-query scores qbar . k.
///   kRatio  as kToken with budget floor((1 - rho) * L), re-evaluated from each sequence's length L at
///           every step. While that is below sink + recent the forced tokens are still all kept (the
///           reference's behaviour), so a short sequence keeps min(L, sink + recent) tokens.
///   kBlock  `num_blocks` blocks of `block_size` tokens scored by the max of qbar . k over the block;
///           the first `sink_blocks` blocks and every block holding one of the last `recent` tokens
///           are always kept and count inside num_blocks.
///
/// Budget smaller than what is forced: rejected (kToken: budget < sink + recent; kBlock: num_blocks <
/// sink_blocks + the most blocks `recent` tokens can touch). Scaling the forced ranges down instead
/// would silently change what "sink" and "recent" mean; a caller who wants a tiny budget sets them.

#include <cstdint>
#include <string>
#include <vector>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/check.hpp"
#include "kvsift/kv/head_roles.hpp"
#include "kvsift/kv/index_set.hpp"

namespace kvsift {

/// How a retrieval head selects its index row's entries: a token budget, a ratio of the length, or
/// blocks (see the file comment).
enum class LycheeDecodeSelection : int { kToken, kRatio, kBlock };

/// "token", "ratio" or "block" ("unknown" outside the enumeration).
inline const char* to_string(LycheeDecodeSelection s) {
  switch (s) {
    case LycheeDecodeSelection::kToken: return "token";
    case LycheeDecodeSelection::kRatio: return "ratio";
    case LycheeDecodeSelection::kBlock: return "block";
  }
  return "unknown";
}

/// The paper's cache-correction interval ("dense attention once every 32 tokens").
inline constexpr int kLycheeDecodeCorrectionInterval = 32;

/// Everything LycheeDecodePolicy is built from: the model's shape and roles, the capacities every
/// launch is sized from, the selection and cache correction. validate_lycheedecode_config checks it.
struct LycheeDecodeConfig {
  /// Model shape: transformer layers, > 0.
  int num_layers = 0;
  int num_q_heads = 0;   ///< query heads, a positive multiple of num_kv_heads
  int num_kv_heads = 0;  ///< KV heads per layer, > 0
  int head_dim = 0;  ///< 64, 128 or 256
  /// Roles [num_layers, num_kv_heads] in the model's original KV-head order: from a roles file
  /// (read_head_roles_file), from trained HardKuma gates (lycheedecode_roles_from_hardkuma) or built
  /// directly (make_head_roles). Layer 0 must be all retrieval: it seeds every index row.
  HeadRoles roles;

  /// Capacities, fixed for the life of the state and workspace: every launch is sized from them,
  /// never from the lengths in memory, so a captured step replays for any lengths up to these.
  /// max_batch: the most sequences a step may have, > 0.
  int max_batch = 0;
  int max_kv_length = 0;   ///< longest sequence (tokens) a call may see; longer ones are clamped to it
  int index_capacity = 0;  ///< entries per index row; 0 = exactly what the selection needs

  /// Selection: how each retrieval head picks its index row's entries.
  LycheeDecodeSelection selection = LycheeDecodeSelection::kToken;
  int budget = 4096;  ///< kToken: tokens per row, sink and recent included
  double rho = 0.7;   ///< kRatio: fraction of tokens dropped, in [0, 1)
  int sink = 128;     ///< kToken, kRatio: first tokens always kept
  int recent = 256;   ///< every mode: last tokens always kept (kBlock: the blocks holding them)
  int block_size = 64;   ///< kBlock: tokens per block, a power of two >= 16
  int num_blocks = 64;   ///< kBlock: blocks per row, forced ones included
  int sink_blocks = 1;   ///< kBlock: first blocks always kept

  /// Cache correction: every correction_interval-th decode step re-runs the last correction_interval
  /// positions densely (correct_layer). 0 = off (default); kLycheeDecodeCorrectionInterval when on.
  int correction_interval = 0;

  float sm_scale = 0.f;  ///< <= 0: 1 / sqrt(head_dim)

  /// kToken, kRatio on the GPU: the retrieval heads' score pass also lists the positions at or above
  /// the threshold the last step's top-k left (ops/score_candidates.hpp), and the top-k selects from
  /// that list when it holds the budget: the same selection, from a few thousand positions instead
  /// of the whole row. Used where the top-k takes its register select (a few long rows: up to 14
  /// retrieval rows a layer of 16K-128K positions on an H100 or H200). Off by default: measured in a
  /// layer it gains 1-3 us at 128K and loses 2 us at B=1, 32K (docs/ops/lycheedecode.md).
  bool score_candidates = false;
};

namespace detail {

/// Most blocks of `block_size` tokens that `recent` consecutive tokens can touch.
inline int max_blocks_touched(int recent, int block_size) {
  return recent <= 0 ? 0 : (recent - 1 + block_size - 1) / block_size + 1;
}

}  // namespace detail

/// Tokens per index entry: 1, or block_size in block mode.
inline int lycheedecode_entry_tokens(const LycheeDecodeConfig& c) {
  return c.selection == LycheeDecodeSelection::kBlock ? c.block_size : 1;
}

/// Granularity of the index table: kBlock in block mode, kToken otherwise.
inline Granularity lycheedecode_granularity(const LycheeDecodeConfig& c) {
  return c.selection == LycheeDecodeSelection::kBlock ? Granularity::kBlock : Granularity::kToken;
}

/// Fraction of tokens kept in ratio mode; the same double on every backend, so floor(keep * L) agrees.
inline double lycheedecode_keep_fraction(const LycheeDecodeConfig& c) { return 1.0 - c.rho; }

/// Entries an index row must hold for this selection (before index_capacity overrides it).
inline int lycheedecode_required_capacity(const LycheeDecodeConfig& c) {
  switch (c.selection) {
    case LycheeDecodeSelection::kToken: return c.budget;
    case LycheeDecodeSelection::kRatio: {
      const int grown = int(lycheedecode_keep_fraction(c) * double(c.max_kv_length));
      const int forced = c.sink + c.recent;
      return grown > forced ? grown : forced;
    }
    case LycheeDecodeSelection::kBlock: return c.num_blocks;
  }
  return 0;
}

/// Entries per index row of the state's table: index_capacity when set, else what the selection needs.
inline int lycheedecode_index_capacity(const LycheeDecodeConfig& c) {
  return c.index_capacity > 0 ? c.index_capacity : lycheedecode_required_capacity(c);
}

/// True when decode step `step` (0-based, counting every decode step since the prompt) is a
/// cache-correction step: steps interval-1, 2*interval-1, ... re-run the last `interval` positions
/// (the interval-1 sparsely decoded tokens and the new one).
inline bool correction_due(const LycheeDecodeConfig& c, std::int64_t step) {
  return c.correction_interval > 0 && step >= 0 && (step + 1) % c.correction_interval == 0;
}

/// kInvalidArgument unless the roles table has the model's layers and KV heads, one mask per layer,
/// and layer 0 all retrieval heads.
inline Status validate_lycheedecode_roles(const LycheeDecodeConfig& c) {
  const HeadRoles& r = c.roles;
  KVSIFT_REQUIRE(r.layers == c.num_layers && r.kv_heads == c.num_kv_heads, kInvalidArgument, "roles is ", r.layers,
                 " layers x ", r.kv_heads, " KV heads but the model has num_layers = ", c.num_layers,
                 ", num_kv_heads = ", c.num_kv_heads);
  KVSIFT_REQUIRE(r.masks.size() == std::size_t(r.layers), kInvalidArgument, "roles.masks has ", r.masks.size(),
                 " layer masks, expected layers = ", r.layers);
  for (int h = 0; h < c.num_kv_heads; ++h)
    KVSIFT_REQUIRE(r.is_retrieval(0, h), kInvalidArgument, "roles: layer 0, KV head ", h,
                   " is sparse; layer 0 must be all retrieval (it seeds every index row)");
  return Status();
}

/// The whole configuration: shape (kUnsupported for a head_dim other than 64, 128, 256), roles,
/// capacities, the selection's parameters (budget not below what is forced; kBlock: block_size a power
/// of two >= 16), index_capacity and correction_interval. kInvalidArgument naming the field otherwise.
inline Status validate_lycheedecode_config(const LycheeDecodeConfig& c) {
  KVSIFT_REQUIRE(c.num_layers > 0, kInvalidArgument, "num_layers = ", c.num_layers, " must be > 0");
  KVSIFT_REQUIRE(c.num_kv_heads > 0, kInvalidArgument, "num_kv_heads = ", c.num_kv_heads, " must be > 0");
  KVSIFT_REQUIRE(c.num_q_heads > 0 && c.num_q_heads % c.num_kv_heads == 0, kInvalidArgument, "num_q_heads = ",
                 c.num_q_heads, " must be a positive multiple of num_kv_heads = ", c.num_kv_heads);
  KVSIFT_REQUIRE(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256, kUnsupported, "head_dim = ",
                 c.head_dim, " is not supported (64, 128 or 256)");
  KVSIFT_TRY(validate_lycheedecode_roles(c));
  KVSIFT_REQUIRE(c.max_batch > 0, kInvalidArgument, "max_batch = ", c.max_batch, " must be > 0");
  KVSIFT_REQUIRE(c.max_kv_length > 0, kInvalidArgument, "max_kv_length = ", c.max_kv_length, " must be > 0");
  KVSIFT_REQUIRE(c.index_capacity >= 0, kInvalidArgument, "index_capacity = ", c.index_capacity, " must be >= 0");
  KVSIFT_REQUIRE(c.recent >= 0, kInvalidArgument, "recent = ", c.recent, " must be >= 0");
  switch (c.selection) {
    case LycheeDecodeSelection::kToken:
    case LycheeDecodeSelection::kRatio:
      KVSIFT_REQUIRE(c.sink >= 0, kInvalidArgument, "sink = ", c.sink, " must be >= 0");
      if (c.selection == LycheeDecodeSelection::kToken) {
        KVSIFT_REQUIRE(c.budget >= 1, kInvalidArgument, "budget = ", c.budget, " must be >= 1");
        KVSIFT_REQUIRE(std::int64_t(c.budget) >= std::int64_t(c.sink) + c.recent, kInvalidArgument, "budget = ",
                       c.budget, " is smaller than sink + recent = ", std::int64_t(c.sink) + c.recent,
                       " (the forced tokens count inside the budget; lower sink or recent)");
      } else {
        KVSIFT_REQUIRE(c.rho >= 0.0 && c.rho < 1.0, kInvalidArgument, "rho = ", c.rho,
                       " must be in [0, 1) (the fraction of tokens dropped)");
      }
      break;
    case LycheeDecodeSelection::kBlock: {
      KVSIFT_REQUIRE(detail::is_power_of_two(c.block_size), kInvalidArgument, "block_size = ", c.block_size,
                     " must be a power of two");
      KVSIFT_REQUIRE(c.block_size >= 16, kUnsupported, "block_size = ", c.block_size,
                     " must be >= 16 (the attention kernel's smallest index block)");
      KVSIFT_REQUIRE(c.sink_blocks >= 0, kInvalidArgument, "sink_blocks = ", c.sink_blocks, " must be >= 0");
      const int forced = c.sink_blocks + detail::max_blocks_touched(c.recent, c.block_size);
      KVSIFT_REQUIRE(c.num_blocks >= 1, kInvalidArgument, "num_blocks = ", c.num_blocks, " must be >= 1");
      KVSIFT_REQUIRE(c.num_blocks >= forced, kInvalidArgument, "num_blocks = ", c.num_blocks,
                     " is smaller than the forced blocks sink_blocks + blocks holding the last recent = ", c.recent,
                     " tokens = ", forced, " (they count inside the budget)");
      break;
    }
    default:
      return invalid_argument("selection = ", static_cast<int>(c.selection), " is not a LycheeDecodeSelection");
  }
  KVSIFT_REQUIRE(c.index_capacity == 0 || c.index_capacity >= lycheedecode_required_capacity(c), kInvalidArgument,
                 "index_capacity = ", c.index_capacity, " is smaller than the ", to_string(c.selection),
                 "-mode budget of ", lycheedecode_required_capacity(c), " entries per row");
  KVSIFT_REQUIRE(c.correction_interval >= 0, kInvalidArgument, "correction_interval = ", c.correction_interval,
                 " must be >= 0 (0 = off)");
  return Status();
}

}  // namespace kvsift
