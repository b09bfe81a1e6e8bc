#pragma once
/// \file
/// \brief The head-roles file: what gate training hands to the LycheeDecode policy. Plain text, one row per
/// layer, one character per KV head in the model's original head order:
///
///   # anything after '#' at the start of a line is a comment; blank lines are ignored
///   kvsift-head-roles v1 layers=32 kv_heads=8
///   RRRRRRRR
///   SSRSSSSS
///   ...
///
/// 'R' = retrieval head (dense attention, selects its index row's entries), 'S' = sparse head. The
/// header must come before the rows; exactly `layers` rows of exactly `kv_heads` characters follow.
/// Trailing spaces, tabs and '\r' are ignored; anything else is an error that names the line and
/// column. Host only.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/kv/head_roles.hpp"

namespace kvsift {

/// The first word of a roles file's header line (followed by " v1 layers=<n> kv_heads=<n>").
inline constexpr const char* kHeadRolesMagic = "kvsift-head-roles";

/// The roles file text for `roles`: two '#' comment lines (with the retrieval-head count), the header
/// line, then one R/S row per layer. parse_head_roles reads it back unchanged.
inline std::string format_head_roles(const HeadRoles& roles) {
  std::ostringstream os;
  os << "# LycheeDecode head roles: one row per layer, one character per KV head (original order).\n"
     << "# R = retrieval head (dense attention + token selection), S = sparse head. " << roles.retrieval_count()
     << " of " << std::int64_t(roles.layers) * roles.kv_heads << " heads are retrieval heads.\n"
     << kHeadRolesMagic << " v1 layers=" << roles.layers << " kv_heads=" << roles.kv_heads << "\n";
  for (int l = 0; l < roles.layers; ++l) {
    for (int h = 0; h < roles.kv_heads; ++h) os << (roles.is_retrieval(l, h) ? 'R' : 'S');
    os << '\n';
  }
  return os.str();
}

namespace detail {

inline std::string strip_trailing_blanks(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

/// Parses "layers=<int>" style fields; false on anything else.
inline bool parse_roles_field(const std::string& token, const char* key, int* value) {
  const std::string prefix = std::string(key) + "=";
  if (token.compare(0, prefix.size(), prefix) != 0 || token.size() == prefix.size()) return false;
  long long v = 0;
  for (std::size_t i = prefix.size(); i < token.size(); ++i) {
    if (token[i] < '0' || token[i] > '9') return false;
    v = v * 10 + (token[i] - '0');
    if (v > 1000000) return false;
  }
  *value = int(v);
  return true;
}

}  // namespace detail

/// Parses a roles file's text. expected_layers / expected_kv_heads (-1: accept any) are the model's,
/// so a file made for another model is rejected with both numbers in the message.
inline Status parse_head_roles(const std::string& text, HeadRoles* out, int expected_layers = -1,
                               int expected_kv_heads = -1) {
  KVSIFT_REQUIRE_NOT_NULL(out, "out");
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  bool have_header = false;
  HeadRoles roles;
  int rows = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = detail::strip_trailing_blanks(raw);
    if (line.empty() || line[0] == '#') continue;
    if (!have_header) {
      std::istringstream fields(line);
      std::string magic, version, layers_field, heads_field, extra;
      fields >> magic >> version >> layers_field >> heads_field;
      const bool ok = magic == kHeadRolesMagic && version == "v1" &&
                      detail::parse_roles_field(layers_field, "layers", &roles.layers) &&
                      detail::parse_roles_field(heads_field, "kv_heads", &roles.kv_heads) && !(fields >> extra);
      KVSIFT_REQUIRE(ok, kInvalidArgument, "roles file line ", line_no, ": expected the header '", kHeadRolesMagic,
                     " v1 layers=<n> kv_heads=<n>', got '", line, "'");
      KVSIFT_REQUIRE(roles.layers > 0 && roles.kv_heads > 0, kInvalidArgument, "roles file line ", line_no,
                     ": layers = ", roles.layers, " and kv_heads = ", roles.kv_heads, " must be > 0");
      KVSIFT_REQUIRE(expected_layers < 0 || roles.layers == expected_layers, kInvalidArgument,
                     "roles file has layers = ", roles.layers, " but the model has ", expected_layers, " layers");
      KVSIFT_REQUIRE(expected_kv_heads < 0 || roles.kv_heads == expected_kv_heads, kInvalidArgument,
                     "roles file has kv_heads = ", roles.kv_heads, " but the model has ", expected_kv_heads,
                     " KV heads per layer");
      KVSIFT_REQUIRE(roles.kv_heads <= kMaxKvHeads, kUnsupported, "roles file line ", line_no, ": kv_heads = ",
                     roles.kv_heads, " exceeds ", kMaxKvHeads);
      have_header = true;
      continue;
    }
    KVSIFT_REQUIRE(rows < roles.layers, kInvalidArgument, "roles file line ", line_no, ": more than layers = ",
                   roles.layers, " rows");
    for (std::size_t c = 0; c < line.size(); ++c)
      KVSIFT_REQUIRE(line[c] == 'R' || line[c] == 'S', kInvalidArgument, "roles file line ", line_no, ", column ",
                     c + 1, ": illegal character '", line[c], "' (expected 'R' for retrieval or 'S' for sparse)");
    KVSIFT_REQUIRE(int(line.size()) == roles.kv_heads, kInvalidArgument, "roles file line ", line_no, ": row has ",
                   line.size(), " heads, expected kv_heads = ", roles.kv_heads);
    HeadRoleMask mask;
    for (int h = 0; h < roles.kv_heads; ++h) mask.set_sparse(h, line[std::size_t(h)] == 'S');
    roles.masks.push_back(mask);
    ++rows;
  }
  KVSIFT_REQUIRE(have_header, kInvalidArgument, "roles file has no '", kHeadRolesMagic, "' header line");
  KVSIFT_REQUIRE(rows == roles.layers, kInvalidArgument, "roles file has ", rows, " layer rows, but its header says layers = ",
                 roles.layers);
  *out = std::move(roles);
  return Status();
}

/// Writes format_head_roles(roles) to `path`, replacing the file. kInvalidArgument when the table's
/// shape is inconsistent or the file cannot be opened or written.
inline Status write_head_roles_file(const std::string& path, const HeadRoles& roles) {
  KVSIFT_REQUIRE(roles.layers > 0 && roles.kv_heads > 0 && roles.masks.size() == std::size_t(roles.layers),
                 kInvalidArgument, "roles: layers = ", roles.layers, ", kv_heads = ", roles.kv_heads, " and ",
                 roles.masks.size(), " layer masks are inconsistent");
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KVSIFT_REQUIRE(f.good(), kInvalidArgument, "path = '", path, "' cannot be opened for writing");
  f << format_head_roles(roles);
  f.close();
  KVSIFT_REQUIRE(!f.fail(), kInvalidArgument, "path = '", path, "': writing the roles file failed");
  return Status();
}

/// Reads and parses the roles file at `path` (see parse_head_roles for the expected_* checks);
/// kInvalidArgument when it cannot be opened or does not parse, the message prefixed with the path.
inline Status read_head_roles_file(const std::string& path, HeadRoles* out, int expected_layers = -1,
                                   int expected_kv_heads = -1) {
  std::ifstream f(path, std::ios::binary);
  KVSIFT_REQUIRE(f.good(), kInvalidArgument, "path = '", path, "' cannot be opened for reading");
  std::ostringstream text;
  text << f.rdbuf();
  Status s = parse_head_roles(text.str(), out, expected_layers, expected_kv_heads);
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return s;
}

}  // namespace kvsift
