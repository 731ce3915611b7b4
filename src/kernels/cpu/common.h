// Helpers shared by the fused CPU kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace lightnets {

// branch-free, so that loops over it vectorise (a data-dependent branch mispredicts on new inputs)
inline float prelu(float v, float a) { return std::max(v, 0.f) + a * std::min(v, 0.f); }

// Element loads and stores in float32. bfloat16's are written out, bit for bit c10::BFloat16's
// conversions (round to nearest even, NaN to 0x7FC0), in integer operations that vectorise, which
// c10's do not.
inline float load(const float* p, int64_t j) { return p[j]; }
inline float load(const c10::Half* p, int64_t j) { return static_cast<float>(p[j]); }
inline float load(const c10::BFloat16* p, int64_t j) {
  const uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[j]) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
inline void store(float* p, int64_t j, float v) { p[j] = v; }
inline void store(c10::Half* p, int64_t j, float v) { p[j] = static_cast<c10::Half>(v); }
inline void store(c10::BFloat16* p, int64_t j, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  reinterpret_cast<uint16_t*>(p)[j] = static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

// The name the kernels' messages give a float32, bfloat16 or float16 tensor's dtype.
inline const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
}

// fn(T{}) with T the element type of a float32, bfloat16 or float16 tensor (checked before).
template <typename Fn>
void dispatch_float(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kFloat:
      fn(float{});
      break;
    case at::kBFloat16:
      fn(c10::BFloat16{});
      break;
    default:
      fn(c10::Half{});
  }
}

// exp(x) for x <= 0 (a score minus its row's maximum; -|x| in a sigmoid), branch-free so that
// loops over it vectorise: Cephes' single-precision range reduction and polynomial (about 1 ulp).
// Below -87.3 (where exp is below float32's normal range) it gives 0, as for -inf; NaN stays NaN.
__attribute__((always_inline)) inline float exp_nonpositive(float x) {
  const float clamped = std::max(x, -87.3f);  // NaN passes (std::max keeps its first operand)
  float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  n = n == n ? n : 0.f;  // an integer for the exponent bits, even for NaN
  float r = clamped - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.3f ? 0.f : y * two_n;
}

// acc[c] += a[c] b[c], c < n, in float32: the loops along the channels of the convolution kernels.
// Always inlined, so that a caller built for AVX-512 (a per-file target) vectorises it for AVX-512.
template <typename A, typename B>
__attribute__((always_inline)) inline void multiply_add(float* __restrict__ acc,
                                                        const A* __restrict__ a,
                                                        const B* __restrict__ b, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) acc[c] += load(a, c) * load(b, c);
}

// out[c] = acc[c], c < n, rounded to out's dtype
template <typename T>
__attribute__((always_inline)) inline void store_row(T* __restrict__ out,
                                                     const float* __restrict__ acc, int64_t n) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) store(out, c, acc[c]);
}

// Row blocks of a sum over rows (parameter gradients, per-channel statistics): at most 64, enough
// for any thread count in use, and for rows of `width` elements at least 8,192 elements each, so
// that a small input does not pay for more partial sums than it has rows. A function of the sizes
// only, so that the sums do not depend on the thread count.
constexpr int64_t kRowBlocks = 64;
inline int64_t row_blocks(int64_t rows, int64_t width) {
  return std::max<int64_t>(1, std::min({rows, kRowBlocks, rows * width / 8192}));
}

// y[r] += a * x[r], r < n
inline void axpy(float* __restrict__ y, const float* __restrict__ x, int64_t n, float a) {
  for (int64_t r = 0; r < n; ++r) y[r] += a * x[r];
}

// The kernels read each tensor operand through its data pointer as a dense, row-major array in
// CPU memory, outside autograd. check_dense holds an operand to that, and to its rank, before any
// size of it is used; check_operand adds float32 and no gradient; check_shape then holds it to the
// sizes the other operands imply. They run on every operand before the kernel reads any memory.
inline void check_dense(const char* op, const at::Tensor& t, const char* name, int64_t dim,
                        const char* dims) {
  TORCH_CHECK(t.layout() == at::kStrided, op, ": ", name, " must be a dense (strided) tensor, got ",
              "layout ", t.layout());
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be on the CPU, got device ", t.device());
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be ", dim, "-D ", dims, ", got shape ",
              t.sizes());
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (row-major), got strides ",
              t.strides(), " for shape ", t.sizes());
  // a negated view stores the values before negation
  TORCH_CHECK(!t.is_neg(), op, ": ", name, " must not be a negated view (call resolve_neg())");
  // the outputs carry no gradient: a grad-requiring operand would silently lose its gradient
  TORCH_CHECK(!(t.requires_grad() && at::GradMode::is_enabled()), op, ": ", name,
              " requires grad, but the kernel's outputs carry none: call it under "
              "torch.no_grad(), or through the module that owns it");
}

inline void check_operand(const char* op, const at::Tensor& t, const char* name, int64_t dim,
                          const char* dims) {
  check_dense(op, t, name, dim, dims);
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
              t.scalar_type());
}

// `origin` says where the expected sizes come from; it is formatted only when the check fails.
template <typename... Origin>
inline void check_shape(const char* op, const at::Tensor& t, const char* name,
                        std::initializer_list<int64_t> expected, const Origin&... origin) {
  TORCH_CHECK(t.sizes().equals(expected), op, ": ", name, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(expected), " = ", origin...);
}

// A tensor that goes with the (R, C) rows x: dense, 2-D, of x's shape and dtype (an output
// gradient, a residual).
inline void check_like_rows(const char* op, const at::Tensor& t, const char* name,
                            const at::Tensor& x) {
  check_dense(op, t, name, 2, "(R, C)");
  TORCH_CHECK(t.sizes().equals(x.sizes()), op, ": ", name, " has shape ", t.sizes(),
              ", expected x's shape ", x.sizes());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", name, " must be ",
              dtype_name(x.scalar_type()), " as x, got ", t.scalar_type());
}

// Per-channel float32 (C,) vectors of the (R, C) rows x (BN's weight and statistics, a slope).
inline void check_channel_vectors(
    const char* op, std::initializer_list<std::pair<const at::Tensor*, const char*>> vectors,
    const at::Tensor& x) {
  for (const auto& [t, name] : vectors) {
    check_operand(op, *t, name, 1, "(C,)");
    check_shape(op, *t, name, {x.size(1)}, "(C,), C of x ", x.sizes());
  }
}

// Past this reach of a kernel tap (far beyond any feature map), the sizes of the padded planes
// the kernels allocate could overflow.
constexpr int64_t kMaxReach = int64_t{1} << 16;

// Copies src (rows x cols, contiguous) into the interior of a zeroed (rows_p x pitch) plane at
// (top, left).
inline void pad_plane(const float* src, float* dst, int64_t rows, int64_t cols, int64_t rows_p,
                      int64_t pitch, int64_t top, int64_t left) {
  std::memset(dst, 0, sizeof(float) * rows_p * pitch);
  for (int64_t h = 0; h < rows; ++h)
    std::memcpy(dst + (top + h) * pitch + left, src + h * cols, sizeof(float) * cols);
}

}  // namespace lightnets
