#pragma once
/// \file
/// \brief LycheeDecode's state between the layers of a decode step: the index table, the score
/// candidates' thresholds and the layer cursor.
///
/// The table holds one row per (sequence b, KV head h), row b * num_kv_heads + h, addressed by the
/// model's ORIGINAL KV-head index (no weight reordering needed). A retrieval head h writes its row; a
/// sparse head h at a later layer reads it, so the row carries the set of the most recent retrieval
/// layer of head h. Layer 0 is all retrieval and rewrites every row at every step, so the table needs
/// no initialisation and nothing in it outlives a step. The thresholds (one float per layer and row,
/// ops/score_candidates.hpp) do outlive a step: each is the last step's selection threshold of that
/// retrieval head, which the next step's score pass lists candidates at. They need no initialisation
/// either: any value, garbage included, selects the same entries (a poor one costs time for a step).
///
/// The table lives in caller memory of the backend's space (device memory for cuda::Exec), sized by
/// lycheedecode_state_bytes, and has one writer: the retrieval heads' top-k, in place. The cursor is
/// host data: it checks that layers come in order, once per step; a captured step leaves it where it
/// found it (back at layer 0), so replaying the graph needs no host bookkeeping. The decode step count
/// (which decides cache-correction steps) is the engine's: it already counts the tokens it generates,
/// and a count kept here would stand still while a graph replays.

#include <cstddef>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/policy/lycheedecode_config.hpp"

namespace kvsift {

/// The state of one decode step's layer calls: the index table (in caller memory, see the file comment)
/// and the host-side layer cursor (the next layer, and a handoff still due after attend_layer). Made
/// by make_lycheedecode_state; no step counter (the engine's).
struct LycheeDecodeState {
  IndexSet table;          ///< rows max_batch * num_kv_heads, capacity lycheedecode_index_capacity(config)
  float* thresholds = nullptr;  ///< [num_layers, max_batch * num_kv_heads]: the score candidates' thresholds
  int num_layers = 0;      ///< layers per step (config.num_layers)
  int next_layer = 0;      ///< the layer the next call must be for
  int step_batch = 0;      ///< kv.batch of the step in progress, fixed by its layer 0
  int handoff_layer = -1;  ///< a layer attend_layer ran whose hand_off_layer has not (-1: none)
  const float* handoff_scores = nullptr;  ///< where that attend_layer wrote its scores (its workspace)

  /// Abandon a step half way (an engine error): the next call must be layer 0 again.
  void restart_step() {
    next_layer = 0;
    handoff_layer = -1;
    handoff_scores = nullptr;
  }
};

namespace detail {

inline IndexSet carve_lycheedecode_table(WorkspaceCarver& ws, const LycheeDecodeConfig& c, float** thresholds) {
  const int rows = c.max_batch * c.num_kv_heads;
  const int capacity = lycheedecode_index_capacity(c);
  std::int32_t* indices = ws.take<std::int32_t>(std::size_t(rows) * capacity);
  std::int32_t* counts = ws.take<std::int32_t>(std::size_t(rows));
  *thresholds = ws.take<float>(std::size_t(c.num_layers) * std::size_t(rows));
  return make_index_set(indices, counts, rows, capacity, lycheedecode_granularity(c), lycheedecode_entry_tokens(c));
}

}  // namespace detail

/// Bytes of state memory for this configuration (needs no memory; the config must be valid).
inline std::size_t lycheedecode_state_bytes(const LycheeDecodeConfig& config) {
  WorkspaceCarver ws(nullptr, 0);
  float* thresholds = nullptr;
  detail::carve_lycheedecode_table(ws, config, &thresholds);
  return ws.required_bytes();
}

/// Lays the state out in `memory` (256-byte aligned, at least lycheedecode_state_bytes). Nothing is
/// written to the memory itself.
inline Status make_lycheedecode_state(const LycheeDecodeConfig& config, void* memory, std::size_t bytes,
                                      LycheeDecodeState* state) {
  KVSIFT_TRY(validate_lycheedecode_config(config));
  KVSIFT_REQUIRE_NOT_NULL(memory, "memory");
  KVSIFT_REQUIRE_NOT_NULL(state, "state");
  WorkspaceCarver ws(memory, bytes);
  float* thresholds = nullptr;
  const IndexSet table = detail::carve_lycheedecode_table(ws, config, &thresholds);
  if (!ws.status().ok())
    return Status(ws.status().code(), "state memory: " + ws.status().message() + " (ask lycheedecode_state_bytes)");
  *state = LycheeDecodeState();
  state->table = table;
  state->thresholds = thresholds;
  state->num_layers = config.num_layers;
  return Status();
}

}  // namespace kvsift
