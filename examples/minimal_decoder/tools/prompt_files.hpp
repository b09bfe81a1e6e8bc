#pragma once
// Prompts as token ids, from text: the plain prompt file of --prompt-file (one prompt per line) and
// the passkey prompt files of a passkey checkpoint (passkey-llama-13m's README; docs/fidelity.md),
// one "ANSWER d1 d2 d3 d4 d5 | id id ... 3" per line: filler with KEY_START d1..d5 KEY_END
// somewhere, ending with QUERY.

#include <cstdint>
#include <string>
#include <vector>

namespace minimal_decoder {

// "12 5 7" -> {12, 5, 7}; anything that is not an integer is an error naming `what`.
std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& what);

// One prompt per line, ids separated by spaces; text before a '|' is ignored (so a passkey file reads
// as plain prompts too); at most max_prompts (<= 0: all).
std::vector<std::vector<std::int32_t>> read_prompt_file(const std::string& path, int max_prompts);

inline constexpr int kPasskeyDigits = 5;
inline constexpr std::int32_t kKeyStart = 1;  // the token before d1 (README: 1 = KEY_START)

struct PasskeyCase {
  std::vector<std::int32_t> answer;  // the five digit token ids
  std::vector<std::int32_t> prompt;  // ends with QUERY
};

// "ANSWER d1 d2 d3 d4 d5 | id id ..." per line; anything else is an error naming the line.
std::vector<PasskeyCase> read_passkey_file(const std::string& path);

// The first `limit` prompts of exactly `length` tokens (limit <= 0: all), in file order.
std::vector<PasskeyCase> passkey_cases_of_length(const std::vector<PasskeyCase>& all, int length, int limit);

// Those cases in batches of at most `batch`; an error when there are none.
std::vector<std::vector<PasskeyCase>> passkey_batches(const std::vector<PasskeyCase>& all, int length, int limit,
                                                      int batch);

// Position of d1 (the token after KEY_START) in a prompt.
int passkey_digit_position(const std::vector<std::int32_t>& prompt);

}  // namespace minimal_decoder
