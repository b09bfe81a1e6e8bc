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
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvsift/core/dtype.hpp>

#include "errors.hpp"

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

inline std::size_t element_bytes(TensorDType t) { return t == TensorDType::kF32 ? 4 : 2; }

inline std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class SafetensorsArchive {
 public:
  // A directory holding model.safetensors.index.json (sharded) or model.safetensors (one file).
  static SafetensorsArchive open_directory(const std::string& dir) {
    SafetensorsArchive archive;
    const std::string index_path = dir + "/model.safetensors.index.json";
    if (std::ifstream index(index_path); index) {
      nlohmann::json j;
      try {
        index >> j;
      } catch (const nlohmann::json::exception& e) {
        throw DecoderError(index_path + ": malformed JSON (" + e.what() + ")");
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw DecoderError(index_path + ": no \"weight_map\" object");
      std::map<std::string, bool> shards;
      for (const auto& item : j["weight_map"].items()) {
        if (!item.value().is_string()) throw DecoderError(index_path + ": weight_map entry \"" + item.key() + "\" is not a file name");
        shards[item.value().get<std::string>()] = true;
      }
      for (const auto& shard : shards) archive.add_file(dir + "/" + shard.first);
      for (const auto& item : j["weight_map"].items())
        if (!archive.contains(item.key()))
          throw DecoderError(index_path + ": tensor \"" + item.key() + "\" is not in " + item.value().get<std::string>());
      return archive;
    }
    archive.add_file(dir + "/model.safetensors");
    return archive;
  }

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  const TensorInfo& info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw DecoderError("checkpoint has no tensor \"" + name + "\"");
    return it->second;
  }

  // The tensor widened to float, after checking that its shape is `expected`.
  std::vector<float> read(const std::string& name, const std::vector<std::int64_t>& expected) const {
    const TensorInfo& t = info(name);
    if (t.shape != expected)
      throw DecoderError("tensor \"" + name + "\" has shape " + shape_string(t.shape) + ", expected " +
                         shape_string(expected));
    std::ifstream in(t.file, std::ios::binary);
    std::vector<unsigned char> raw(t.bytes);
    in.seekg(std::streamoff(t.offset));
    if (!in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size())))
      throw DecoderError(t.file + ": could not read tensor \"" + name + "\"");
    std::vector<float> out(std::size_t(t.numel()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (t.dtype == TensorDType::kF32) {
        std::memcpy(&out[i], raw.data() + 4 * i, 4);
      } else {
        std::uint16_t bits;
        std::memcpy(&bits, raw.data() + 2 * i, 2);
        out[i] = t.dtype == TensorDType::kBF16 ? kvsift::detail::bf16_bits_to_float(bits)
                                               : kvsift::detail::half_bits_to_float(bits);
      }
    }
    return out;
  }

 private:
  // Reads one file's tensor table and checks every entry against the file's size.
  void add_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw DecoderError(path + ": cannot open (missing checkpoint file?)");
    const std::uint64_t file_size = std::uint64_t(in.tellg());
    in.seekg(0);
    unsigned char len_bytes[8];
    if (file_size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8))
      throw DecoderError(path + ": too short to be a safetensors file");
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > file_size - 8) throw DecoderError(path + ": header length " + std::to_string(header_len) + " exceeds the file size");
    std::string header(header_len, '\0');
    in.read(header.data(), std::streamsize(header_len));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception& e) {
      throw DecoderError(path + ": malformed safetensors header (" + e.what() + ")");
    }
    if (!j.is_object()) throw DecoderError(path + ": safetensors header is not a JSON object");
    const std::uint64_t data_start = 8 + header_len, data_size = file_size - data_start;
    for (const auto& item : j.items()) {
      if (item.key() == "__metadata__") continue;
      const std::string where = path + ": tensor \"" + item.key() + "\"";
      const auto& e = item.value();
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
        throw DecoderError(where + " lacks dtype, shape or data_offsets");
      TensorInfo t;
      t.file = path;
      const std::string dtype = e["dtype"].is_string() ? e["dtype"].get<std::string>() : "?";
      if (dtype == "F32") t.dtype = TensorDType::kF32;
      else if (dtype == "F16") t.dtype = TensorDType::kF16;
      else if (dtype == "BF16") t.dtype = TensorDType::kBF16;
      else throw DecoderError(where + " has dtype " + dtype + " (supported: F32, F16, BF16)");
      try {
        t.shape = e["shape"].get<std::vector<std::int64_t>>();
        const auto offsets = e["data_offsets"].get<std::vector<std::uint64_t>>();
        if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] > data_size)
          throw DecoderError(where + " has data_offsets outside the file (truncated?)");
        t.offset = data_start + offsets[0];
        t.bytes = offsets[1] - offsets[0];
      } catch (const nlohmann::json::exception&) {
        throw DecoderError(where + " has a malformed shape or data_offsets");
      }
      if (t.bytes != std::uint64_t(t.numel()) * element_bytes(t.dtype))
        throw DecoderError(where + ": " + std::to_string(t.bytes) + " bytes for shape " + shape_string(t.shape));
      tensors_[item.key()] = t;
    }
  }

  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace minimal_decoder
