// The safetensors reader (safetensors.hpp): tensor tables up front, tensors on demand.

#include "engine/safetensors.hpp"

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/errors.hpp"
#include <kvsift/core/dtype.hpp>

namespace minimal_decoder {
namespace {

std::size_t element_bytes(TensorDType t) { return t == TensorDType::kF32 ? 4 : 2; }

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

SafetensorsArchive SafetensorsArchive::open_directory(const std::string& dir) {
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

const TensorInfo& SafetensorsArchive::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw DecoderError("checkpoint has no tensor \"" + name + "\"");
  return it->second;
}

std::vector<float> SafetensorsArchive::read(const std::string& name, const std::vector<std::int64_t>& expected) const {
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
      out[i] = t.dtype == TensorDType::kBF16 ? kvsift::to_float(kvsift::bfloat16_t{bits})
                                             : kvsift::to_float(kvsift::half_t{bits});
    }
  }
  return out;
}

void SafetensorsArchive::add_file(const std::string& path) {
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

}  // namespace minimal_decoder
