// Helpers shared by the fused CPU inference kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>

namespace lightnets {

// branch-free, so that loops over it vectorise (a data-dependent branch mispredicts on new inputs)
inline float prelu(float v, float a) { return std::max(v, 0.f) + a * std::min(v, 0.f); }

// y[r] += a * x[r], r < n
inline void axpy(float* __restrict__ y, const float* __restrict__ x, int64_t n, float a) {
  for (int64_t r = 0; r < n; ++r) y[r] += a * x[r];
}

inline void check_float(const at::Tensor& t, const char* name,
                        std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), name,
              " must be a contiguous float32 CPU tensor");
  TORCH_CHECK(t.sizes().equals(shape), name, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

// Copies src (rows x cols, contiguous) into the interior of a zeroed (rows_p x pitch) plane at
// (top, left).
inline void pad_plane(const float* src, float* dst, int64_t rows, int64_t cols, int64_t rows_p,
                      int64_t pitch, int64_t top, int64_t left) {
  std::memset(dst, 0, sizeof(float) * rows_p * pitch);
  for (int64_t h = 0; h < rows; ++h)
    std::memcpy(dst + (top + h) * pitch + left, src + h * cols, sizeof(float) * cols);
}

}  // namespace lightnets
