#pragma once
// What the decoder's role tools (--probe-roles, --train-roles) output: the per-head table on stdout,
// and the roles file: comment lines saying how the roles were made, then kvsift's roles format
// (kvsift/gates/roles_file.hpp), written whole or not at all (output_file.hpp).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace minimal_decoder {

// "4.1, 5.0": the retrieval heads beyond layer 0 as layer.head, or "nothing".
std::string retrieval_heads_beyond_layer0(const std::vector<std::uint8_t>& roles, int kv_heads);

// A (layer x KV head) table on stdout, one row per layer, each cell `cell(layer, head)` right-aligned
// in `width` columns: how the tools report a per-head quantity next to the roles it leads to.
void print_head_table(int layers, int kv_heads, int width, const std::function<std::string(int, int)>& cell);

// roles[layers * kv_heads], 1 = retrieval; each comment line is written as "# line".
void write_roles_file(const std::string& path, const std::vector<std::string>& comment,
                      const std::vector<std::uint8_t>& roles, int layers, int kv_heads);

}  // namespace minimal_decoder
