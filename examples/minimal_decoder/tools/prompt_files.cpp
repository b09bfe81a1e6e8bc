// Reading prompt files (prompt_files.hpp).

#include "tools/prompt_files.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/errors.hpp"

namespace minimal_decoder {

std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<std::int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) throw DecoderError(what + ": \"" + word + "\" is not a token id");
    ids.push_back(std::int32_t(v));
  }
  if (ids.empty()) throw DecoderError(what + ": empty prompt");
  return ids;
}

std::vector<std::vector<std::int32_t>> read_prompt_file(const std::string& path, int max_prompts) {
  std::ifstream in(path);
  if (!in) throw DecoderError("--prompt-file " + path + ": cannot open");
  std::vector<std::vector<std::int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line) && (max_prompts <= 0 || int(prompts.size()) < max_prompts)) {
    ++line_no;
    const std::size_t bar = line.find('|');
    const std::string ids = bar == std::string::npos ? line : line.substr(bar + 1);
    if (ids.find_first_not_of(" \t\r") == std::string::npos) continue;
    prompts.push_back(parse_ids(ids, path + ":" + std::to_string(line_no)));
  }
  if (prompts.empty()) throw DecoderError("--prompt-file " + path + ": no prompts");
  return prompts;
}

std::vector<PasskeyCase> read_passkey_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DecoderError("--eval-passkey " + path + ": cannot open");
  std::vector<PasskeyCase> cases;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const std::size_t bar = line.find('|');
    std::istringstream head(line.substr(0, bar == std::string::npos ? 0 : bar));
    std::string word;
    if (bar == std::string::npos || !(head >> word) || word != "ANSWER")
      throw DecoderError(where + ": expected \"ANSWER d1 d2 d3 d4 d5 | ids\"");
    PasskeyCase c;
    std::string rest;
    std::getline(head, rest);
    c.answer = parse_ids(rest, where + " (answer)");
    if (int(c.answer.size()) != kPasskeyDigits) throw DecoderError(where + ": the answer must have 5 token ids");
    c.prompt = parse_ids(line.substr(bar + 1), where);
    cases.push_back(std::move(c));
  }
  if (cases.empty()) throw DecoderError("--eval-passkey " + path + ": no prompts");
  return cases;
}

std::vector<PasskeyCase> passkey_cases_of_length(const std::vector<PasskeyCase>& all, int length, int limit) {
  std::vector<PasskeyCase> out;
  for (const PasskeyCase& c : all)
    if (int(c.prompt.size()) == length && (limit <= 0 || int(out.size()) < limit)) out.push_back(c);
  return out;
}

std::vector<std::vector<PasskeyCase>> passkey_batches(const std::vector<PasskeyCase>& all, int length, int limit,
                                                      int batch) {
  const std::vector<PasskeyCase> cases = passkey_cases_of_length(all, length, limit);
  if (cases.empty()) throw DecoderError("no prompts of " + std::to_string(length) + " tokens in the file");
  std::vector<std::vector<PasskeyCase>> out;
  for (std::size_t i = 0; i < cases.size(); i += std::size_t(batch))
    out.emplace_back(cases.begin() + std::ptrdiff_t(i), cases.begin() + std::ptrdiff_t(std::min(cases.size(), i + std::size_t(batch))));
  return out;
}

int passkey_digit_position(const std::vector<std::int32_t>& prompt) {
  for (std::size_t i = 0; i + kPasskeyDigits + 1 < prompt.size(); ++i)
    if (prompt[i] == kKeyStart) return int(i) + 1;
  throw DecoderError("a passkey prompt without KEY_START d1..d5 KEY_END");
}

}  // namespace minimal_decoder
