// The CPU backend's arithmetic (host_backend.hpp): plain loops in float, the reference the CUDA
// backend is compared with.

#include "engine/host_backend.hpp"

#include "engine/rope_frequencies.hpp"

#include <chrono>
#include <cmath>

namespace minimal_decoder {
namespace {

// Rotation angle of RoPE pair i at `position`, computed as Hugging Face does (float32 inverse
// frequency and product), so a checkpoint sees the positions it was trained with.
float rope_angle(int position, int pair, int head_dim, float theta) {
  return float(position) * rope_inv_freq(pair, head_dim, theta);
}

}  // namespace

HostBackend::Matrix HostBackend::make_matrix(const std::vector<float>& w, int rows, int cols) const {
  Matrix m{Buffer<float>(w.size()), rows, cols};
  std::copy(w.begin(), w.end(), m.data.data());
  return m;
}

double HostBackend::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void HostBackend::embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const {
  for (int i = 0; i < n; ++i)
    std::copy_n(table.data.data() + std::int64_t(tokens[i]) * table.cols, table.cols, out + std::int64_t(i) * table.cols);
}

void HostBackend::rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.f / std::sqrt(float(ss / dim) + eps);
    float* yr = y + r * dim;
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

// Four tokens share each row of W while it is in cache; eight independent partial sums let the
// compiler vectorise the dot product without -ffast-math.
void HostBackend::linear(const float* x, int n, const Matrix& w, float* y) const {
  const int in = w.cols, out = w.rows;
  for (int t0 = 0; t0 < n; t0 += 4) {
    const int nt = std::min(4, n - t0);
    for (int o = 0; o < out; ++o) {
      const float* wr = w.data.data() + std::int64_t(o) * in;
      for (int t = 0; t < nt; ++t) {
        const float* xr = x + std::int64_t(t0 + t) * in;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= in; i += 8)
          for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * wr[i + j];
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < in; ++i) s += xr[i] * wr[i];
        y[std::int64_t(t0 + t) * out + o] = s;
      }
    }
  }
}

void HostBackend::linear_shared_input(const float* x, int n,
                                      std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
  for (const auto& o : outputs) linear(x, n, *o.first, o.second);
}

void HostBackend::norm_linear_shared_input(const float* x, const float* delta, float* x_out, int n, int dim, const float* w,
                                           float eps, float* normed,
                                           std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
  std::copy_n(x, std::int64_t(n) * dim, x_out);
  if (delta) add(x_out, delta, std::int64_t(n) * dim);
  rms_norm(x_out, n, dim, w, eps, normed);
  linear_shared_input(normed, n, outputs);
}

void HostBackend::silu_mul(float* gate, const float* up, std::int64_t n) const {
  for (std::int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

void HostBackend::add(float* x, const float* y, std::int64_t n) const {
  for (std::int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void HostBackend::add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps,
                               float* out) const {
  add(x, y, rows * dim);
  rms_norm(x, rows, dim, w, eps, out);
}

void HostBackend::silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const {
  silu_mul(gate, up, std::int64_t(n) * w.cols);
  linear(gate, n, w, y);
}

void HostBackend::norm_swiglu_mlp(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                                  float* normed, const Matrix& w_gate, const Matrix& w_up, const Matrix& w_down, float* gate,
                                  float* up, float* y) const {
  norm_linear_shared_input(x, delta, x_out, n, dim, w, eps, normed, {{&w_gate, gate}, {&w_up, up}});
  silu_mul_linear(gate, up, n, w_down, y);
}

void HostBackend::rope(float* q, int q_heads, float* k, int k_heads, const std::int32_t* positions, int n, int head_dim,
                       float theta) const {
  const int half = head_dim / 2;
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < half; ++i) {
      const double a = rope_angle(positions[t], i, head_dim, theta);
      const float c = float(std::cos(a)), s = float(std::sin(a));
      for (auto [x, heads] : {std::pair<float*, int>{q, q_heads}, std::pair<float*, int>{k, k_heads}})
        for (int h = 0; h < heads; ++h) {
          float* r = x + (std::int64_t(t) * heads + h) * head_dim;
          const float x1 = r[i], x2 = r[i + half];
          r[i] = x1 * c - x2 * s;
          r[i + half] = x2 * c + x1 * s;
        }
    }
}

void HostBackend::scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row,
                               float* dst) const {
  for (int i = 0; i < n; ++i)
    if (dst_row[i] >= 0) std::copy_n(src + i * row_elems, row_elems, dst + dst_row[i] * row_elems);
}

}  // namespace minimal_decoder
