#pragma once
// Output files written whole or not at all: to PATH.tmp first, renamed into place once complete, so
// an interrupted run never leaves a half-written roles file, JSON report or ids file behind.

#include <string>

namespace minimal_decoder {

// `flag` names the option the path came from, for the error ("--json out.json: cannot write").
void write_file_replacing(const std::string& path, const std::string& contents, const std::string& flag);

}  // namespace minimal_decoder
