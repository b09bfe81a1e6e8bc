#pragma once
// A reader for Hugging Face safetensors checkpoints, single-file or sharded.
//
// File format: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}, "__metadata__": {...}}
// then the raw tensor bytes, offsets relative to the end of the header. A sharded checkpoint adds
// model.safetensors.index.json, whose "weight_map" names the shard file of every tensor.
//
// Only what a decoder needs: the tensor table is read up front (so a truncated or inconsistent file
// fails before any weight is loaded), and each tensor is read on demand and widened to float.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace minimal_decoder {

enum class TensorDType { kF32, kF16, kBF16 };

struct TensorInfo {
  std::string file;  // path of the shard that holds it
  TensorDType dtype = TensorDType::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t offset = 0;  // absolute byte offset in the file
  std::uint64_t bytes = 0;

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

class SafetensorsArchive {
 public:
  // A directory holding model.safetensors.index.json (sharded) or model.safetensors (one file).
  static SafetensorsArchive open_directory(const std::string& dir);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  // The tensor widened to float, after checking that its shape is `expected`.
  std::vector<float> read(const std::string& name, const std::vector<std::int64_t>& expected) const;

 private:
  // Reads one file's tensor table and checks every entry against the file's size.
  void add_file(const std::string& path);

  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace minimal_decoder
