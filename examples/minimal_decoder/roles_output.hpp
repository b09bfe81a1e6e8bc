#pragma once
// What the decoder's role tools (--probe-roles, --train-roles) output: the per-head table on stdout,
// and the roles file: comment lines saying how the roles were made, then kvsift's roles format
// (kvsift/gates/roles_file.hpp). Written to FILE.tmp and renamed into place, so an interrupted run
// never leaves a half-written roles file behind.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "errors.hpp"

namespace minimal_decoder {

// "4.1, 5.0": the retrieval heads beyond layer 0 as layer.head, or "nothing".
inline std::string retrieval_heads_beyond_layer0(const std::vector<std::uint8_t>& roles, int kv_heads) {
  std::string s;
  const std::size_t kv = std::size_t(kv_heads);
  for (std::size_t i = kv; i < roles.size(); ++i)
    if (roles[i]) s += (s.empty() ? "" : ", ") + std::to_string(i / kv) + "." + std::to_string(i % kv);
  return s.empty() ? "nothing" : s;
}

// A (layer x KV head) table on stdout, one row per layer, each cell `cell(layer, head)` right-aligned
// in `width` columns: how the tools report a per-head quantity next to the roles it leads to.
template <class Cell>
void print_head_table(int layers, int kv_heads, int width, Cell&& cell) {
  std::printf("%-6s", "layer");
  for (int h = 0; h < kv_heads; ++h) std::printf(" %*s", width, ("KV head " + std::to_string(h)).c_str());
  std::printf("\n");
  for (int l = 0; l < layers; ++l) {
    std::printf("%-6d", l);
    for (int h = 0; h < kv_heads; ++h) std::printf(" %*s", width, std::string(cell(l, h)).c_str());
    std::printf("\n");
  }
}

// roles[layers * kv_heads], 1 = retrieval; each comment line is written as "# line".
inline void write_roles_file(const std::string& path, const std::vector<std::string>& comment,
                             const std::vector<std::uint8_t>& roles, int layers, int kv_heads) {
  kvsift::HeadRoles hr;
  check(kvsift::make_head_roles(layers, kv_heads, roles.data(), &hr), "roles");
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  for (const std::string& line : comment) out << "# " << line << "\n";
  out << kvsift::format_head_roles(hr);
  if (!out.good() || (out.close(), std::rename(tmp.c_str(), path.c_str())) != 0)
    throw DecoderError("--roles-out " + path + ": cannot write");
}

}  // namespace minimal_decoder
