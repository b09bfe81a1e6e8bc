// The role tools' table and roles file (roles_output.hpp).

#include "tools/roles_output.hpp"

#include <cstdio>

#include <kvsift/gates/roles_file.hpp>

#include "engine/errors.hpp"
#include "tools/output_file.hpp"

namespace minimal_decoder {

std::string retrieval_heads_beyond_layer0(const std::vector<std::uint8_t>& roles, int kv_heads) {
  std::string s;
  const std::size_t kv = std::size_t(kv_heads);
  for (std::size_t i = kv; i < roles.size(); ++i)
    if (roles[i]) s += (s.empty() ? "" : ", ") + std::to_string(i / kv) + "." + std::to_string(i % kv);
  return s.empty() ? "nothing" : s;
}

void print_head_table(int layers, int kv_heads, int width, const std::function<std::string(int, int)>& cell) {
  std::printf("%-6s", "layer");
  for (int h = 0; h < kv_heads; ++h) std::printf(" %*s", width, ("KV head " + std::to_string(h)).c_str());
  std::printf("\n");
  for (int l = 0; l < layers; ++l) {
    std::printf("%-6d", l);
    for (int h = 0; h < kv_heads; ++h) std::printf(" %*s", width, cell(l, h).c_str());
    std::printf("\n");
  }
}

void write_roles_file(const std::string& path, const std::vector<std::string>& comment,
                      const std::vector<std::uint8_t>& roles, int layers, int kv_heads) {
  kvsift::HeadRoles hr;
  check(kvsift::make_head_roles(layers, kv_heads, roles.data(), &hr), "roles");
  std::string text;
  for (const std::string& line : comment) text += "# " + line + "\n";
  write_file_replacing(path, text + kvsift::format_head_roles(hr), "--roles-out");
}

}  // namespace minimal_decoder
