// Whole-or-nothing output files (output_file.hpp).

#include "tools/output_file.hpp"

#include <cstdio>
#include <fstream>

#include "engine/errors.hpp"

namespace minimal_decoder {

void write_file_replacing(const std::string& path, const std::string& contents, const std::string& flag) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << contents;
  if (!out.good() || (out.close(), std::rename(tmp.c_str(), path.c_str())) != 0)
    throw DecoderError(flag + " " + path + ": cannot write");
}

}  // namespace minimal_decoder
