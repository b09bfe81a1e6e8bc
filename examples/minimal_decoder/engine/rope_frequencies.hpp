#pragma once
// RoPE's inverse frequency of pair i, computed as Hugging Face does (float32 power and reciprocal), so a
// checkpoint sees the positions it was trained with. One definition for the CPU backend's rope and the
// decoder's table, which kvsift::store_kv's rotary takes (decoder.hpp, layer_forward).

#include <cmath>

namespace minimal_decoder {

inline float rope_inv_freq(int pair, int head_dim, float theta) { return 1.f / std::pow(theta, float(2 * pair) / float(head_dim)); }

}  // namespace minimal_decoder
