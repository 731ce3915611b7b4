// Fused CPU kernels of Group-Transformer's per-group layer norm, forward and backward (training).
//
// For x of shape (N, D) cut into G contiguous groups of W = D / G features, with per-group mean
// m, centred values c = x - m, unbiased standard deviation s = |c| / sqrt(W - 1) and
// inv = 1 / (s + eps) (eps on the std, as the official norm), the forward writes
//   y = c inv * weight + bias        (float32, whatever x's dtype)
// and returns m and s per group, which is all the backward needs besides x. With n = c inv and
// g = grad_y * weight, the backward writes
//   grad_x = dc - mean(dc),  dc = inv g - n sum(g n) / ((W - 1) max(s, tiny))
//   grad_weight = sum over rows of grad_y n,  grad_bias = sum over rows of grad_y
// which is PerGroupLayerNormFunction's backward in src/kernels/per_group_layer_norm. Eagerly those
// are about eight ATen passes forward and fourteen backward over (N, D) tensors; here a group's W
// values stay in cache between its passes. The weight and bias gradients are summed over a fixed
// split of the rows (a function of N only), so that they do not depend on the thread count.
// x may be float32, bfloat16 or float16 (statistics in float32, as autocast's norms take them);
// every other operand is float32.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h (kRowBlocks: the weight and
                            // bias gradients' row blocks)

// sum of v[0..n) with eight independent partial sums, so that the loop vectorises without
// reassociation flags
inline float sum8(const float* __restrict__ v, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += v[j + l];
  float total = 0.f;
  for (; j < n; ++j) total += v[j];
  return total + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// sum of a[j] * b[j], as sum8
inline float dot8(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * b[j + l];
  float total = 0.f;
  for (; j < n; ++j) total += a[j] * b[j];
  return total + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// x's row in float32 (a copy for 16-bit x, the row itself for float32)
template <typename T>
inline const float* row_as_float(const T* src, float* buffer, int64_t n) {
  for (int64_t j = 0; j < n; ++j) buffer[j] = static_cast<float>(src[j]);
  return buffer;
}
template <>
inline const float* row_as_float<float>(const float* src, float*, int64_t) {
  return src;
}

void check_x(const char* op, const at::Tensor& x) {
  check_dense(op, x, "x", 2, "(N, D)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", dtype);
}

// W, the width of a group, from x's width and the group count, checked
int64_t group_width(const char* op, const at::Tensor& x, int64_t groups) {
  const int64_t D = x.size(1);
  TORCH_CHECK(groups >= 1 && D % groups == 0, op, ": x has shape ", x.sizes(),
              ": its width must be divisible by groups (", groups, ")");
  TORCH_CHECK(D / groups >= 2, op, ": x has shape ", x.sizes(), ": each of its ", groups,
              " groups needs at least 2 features for an unbiased std");
  return D / groups;
}

template <typename T>
void forward_rows(const T* xs, const float* weight, const float* bias, float* ys, float* means,
                  float* stds, int64_t N, int64_t G, int64_t W, double eps) {
  const int64_t D = G * W;
  const float epsf = static_cast<float>(eps);
  const float unbias = 1.f / std::sqrt(static_cast<float>(W - 1));
  const int64_t grain = std::max<int64_t>(1, 16384 / D);
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(W), centred(W);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t k = 0; k < G; ++k) {
        const float* v = row_as_float(xs + r * D + k * W, buffer.data(), W);
        const float m = sum8(v, W) / static_cast<float>(W);
        for (int64_t j = 0; j < W; ++j) centred[j] = v[j] - m;
        const float s = std::sqrt(dot8(centred.data(), centred.data(), W)) * unbias;
        const float inv = 1.f / (s + epsf);
        const float* __restrict__ w = weight + k * W;
        const float* __restrict__ b = bias + k * W;
        float* __restrict__ y = ys + r * D + k * W;
        for (int64_t j = 0; j < W; ++j) y[j] = centred[j] * inv * w[j] + b[j];
        means[r * G + k] = m;
        stds[r * G + k] = s;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> per_group_norm_forward(const at::Tensor& x,
                                                                     const at::Tensor& weight,
                                                                     const at::Tensor& bias,
                                                                     int64_t groups, double eps) {
  constexpr const char* kOp = "per_group_norm_forward";
  check_x(kOp, x);
  check_operand(kOp, weight, "weight", 1, "(D,)");
  check_operand(kOp, bias, "bias", 1, "(D,)");
  const int64_t W = group_width(kOp, x, groups);
  const int64_t N = x.size(0), D = x.size(1), G = groups;
  check_shape(kOp, weight, "weight", {D}, "(D,), D of x ", x.sizes());
  check_shape(kOp, bias, "bias", {D}, "(D,), D of x ", x.sizes());
  TORCH_CHECK(eps >= 0, kOp, ": eps must be >= 0, got ", eps);

  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor y = at::empty({N, D}, f32);
  at::Tensor mean = at::empty({N, G}, f32);
  at::Tensor std = at::empty({N, G}, f32);
  const float* w = weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  float* ms = mean.data_ptr<float>();
  float* ss = std.data_ptr<float>();
  switch (x.scalar_type()) {
    case at::kFloat:
      forward_rows(x.data_ptr<float>(), w, b, ys, ms, ss, N, G, W, eps);
      break;
    case at::kBFloat16:
      forward_rows(x.data_ptr<c10::BFloat16>(), w, b, ys, ms, ss, N, G, W, eps);
      break;
    default:
      forward_rows(x.data_ptr<c10::Half>(), w, b, ys, ms, ss, N, G, W, eps);
  }
  return {y, mean, std};
}

template <typename T>
void backward_rows(const float* dys, const T* xs, const float* weight, const float* means,
                   const float* stds, T* dxs, float* partial, int64_t N, int64_t G, int64_t W,
                   double eps) {
  const int64_t D = G * W;
  const float epsf = static_cast<float>(eps);
  const float tiny = std::numeric_limits<float>::min();
  const int64_t blocks = std::min(N, kRowBlocks);
  // each row block sums its own rows' weight and bias gradients into partial[block]
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> buffer(W), n(W), g(W), dc(W);
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ dw = partial + block * 2 * D;
      float* __restrict__ db = dw + D;
      const int64_t row_end = (block + 1) * N / blocks;
      for (int64_t r = block * N / blocks; r < row_end; ++r) {
        for (int64_t k = 0; k < G; ++k) {
          const float* v = row_as_float(xs + r * D + k * W, buffer.data(), W);
          const float* __restrict__ dy = dys + r * D + k * W;
          const float* __restrict__ w = weight + k * W;
          const float m = means[r * G + k], s = stds[r * G + k];
          const float inv = 1.f / (s + epsf);
          for (int64_t j = 0; j < W; ++j) {
            n[j] = (v[j] - m) * inv;
            g[j] = dy[j] * w[j];
          }
          // the std's share; a constant group has n = 0, so the clamp only avoids 0 / 0
          const float through_std =
              dot8(g.data(), n.data(), W) / std::max(static_cast<float>(W - 1) * s, tiny);
          for (int64_t j = 0; j < W; ++j) dc[j] = inv * g[j] - n[j] * through_std;
          const float dc_mean = sum8(dc.data(), W) / static_cast<float>(W);
          T* __restrict__ dx = dxs + r * D + k * W;
          for (int64_t j = 0; j < W; ++j) dx[j] = static_cast<T>(dc[j] - dc_mean);
          float* __restrict__ dwk = dw + k * W;
          float* __restrict__ dbk = db + k * W;
          for (int64_t j = 0; j < W; ++j) {
            dwk[j] += dy[j] * n[j];
            dbk[j] += dy[j];
          }
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> per_group_norm_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& mean, const at::Tensor& std, int64_t groups, double eps) {
  constexpr const char* kOp = "per_group_norm_backward";
  check_operand(kOp, grad_y, "grad_y", 2, "(N, D)");
  check_x(kOp, x);
  check_operand(kOp, weight, "weight", 1, "(D,)");
  check_operand(kOp, mean, "mean", 2, "(N, groups)");
  check_operand(kOp, std, "std", 2, "(N, groups)");
  const int64_t W = group_width(kOp, x, groups);
  const int64_t N = x.size(0), D = x.size(1), G = groups;
  check_shape(kOp, grad_y, "grad_y", {N, D}, "(N, D) of x ", x.sizes());
  check_shape(kOp, weight, "weight", {D}, "(D,), D of x ", x.sizes());
  check_shape(kOp, mean, "mean", {N, G}, "(N, groups), N of x ", x.sizes(), ", groups ", G);
  check_shape(kOp, std, "std", {N, G}, "(N, groups), N of x ", x.sizes(), ", groups ", G);
  TORCH_CHECK(eps >= 0, kOp, ": eps must be >= 0, got ", eps);

  at::Tensor grad_x = at::empty({N, D}, x.options());
  const int64_t blocks = std::min(N, kRowBlocks);
  // (blocks, 2, D): each block's weight-gradient then bias-gradient partial sums
  at::Tensor partial = at::zeros({std::max<int64_t>(blocks, 1), 2, D}, grad_y.options());
  const float* dy = grad_y.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* ms = mean.data_ptr<float>();
  const float* ss = std.data_ptr<float>();
  float* part = partial.data_ptr<float>();
  switch (x.scalar_type()) {
    case at::kFloat:
      backward_rows(dy, x.data_ptr<float>(), w, ms, ss, grad_x.data_ptr<float>(), part, N, G, W,
                    eps);
      break;
    case at::kBFloat16:
      backward_rows(dy, x.data_ptr<c10::BFloat16>(), w, ms, ss, grad_x.data_ptr<c10::BFloat16>(),
                    part, N, G, W, eps);
      break;
    default:
      backward_rows(dy, x.data_ptr<c10::Half>(), w, ms, ss, grad_x.data_ptr<c10::Half>(), part, N,
                    G, W, eps);
  }
  // the blocks' partial sums, added in block order
  at::Tensor sums = at::zeros({2, D}, grad_y.options());
  float* total = sums.data_ptr<float>();
  for (int64_t block = 0; block < blocks; ++block)
    for (int64_t j = 0; j < 2 * D; ++j) total[j] += part[block * 2 * D + j];
  return {grad_x, sums[0], sums[1]};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "per_group_norm_forward(Tensor x, Tensor weight, Tensor bias, int groups, float eps) -> "
      "(Tensor, Tensor, Tensor)",
      &per_group_norm_forward);
  m.def(
      "per_group_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor mean, Tensor std, "
      "int groups, float eps) -> (Tensor, Tensor, Tensor)",
      &per_group_norm_backward);
}
