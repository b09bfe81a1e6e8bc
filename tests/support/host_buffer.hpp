#pragma once
// Host-side test plumbing shared by host and GPU tests: the poison byte, a 256-byte aligned host buffer
// (the alignment state and workspace carving require) filled with it, and head roles written as text.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kvsift/gates/roles_file.hpp"

namespace kvsift_test {

// Byte pattern written over outputs before a kernel runs: 0xFF makes every float, half and bfloat16
// a NaN and every int32 -1, so an element the kernel failed to write never passes as a result.
inline constexpr int kPoisonByte = 0xFF;

class HostBuffer {
 public:
  explicit HostBuffer(std::size_t bytes)
      : bytes_(bytes),
        p_(static_cast<unsigned char*>(std::aligned_alloc(256, (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256)),
           &std::free) {
    std::memset(p_.get(), kPoisonByte, bytes_);  // never read as zeros
  }
  unsigned char* get() const { return p_.get(); }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::unique_ptr<unsigned char, void (*)(void*)> p_;
};

// Rows like "RRRR/RSSR/SSRS": one per layer, R = retrieval, S = sparse.
inline kvsift::HeadRoles roles_from(const std::string& rows) {
  kvsift::HeadRoles r;
  std::size_t start = 0;
  while (start <= rows.size()) {
    const std::size_t end = std::min(rows.find('/', start), rows.size());
    const std::string row = rows.substr(start, end - start);
    r.kv_heads = int(row.size());
    kvsift::HeadRoleMask mask;
    for (std::size_t h = 0; h < row.size(); ++h) mask.set_sparse(int(h), row[h] == 'S');
    r.masks.push_back(mask);
    ++r.layers;
    start = end + 1;
  }
  return r;
}

}  // namespace kvsift_test
