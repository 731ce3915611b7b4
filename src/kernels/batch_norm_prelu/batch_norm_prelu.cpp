// BatchNorm followed by PReLU, training, for a channels-last input read as (R, C) = (B H W, C)
// rows: the "BN + PReLU" of every CBR unit of DiCENet and ESPNetv2. With per-channel batch mean m,
// biased variance v, inverse standard deviation s = 1 / sqrt(v + eps), weight w, bias b, slope a:
//   z = x A + B  with  A = s w, B = b - m A      (ATen's BatchNorm transform)
//   y = z where z > 0, a z elsewhere             (ATen's PReLU)
// Unfused, BN writes z, PReLU reads it back and writes y, and autograd keeps both x and z; here the
// forward reads x twice (statistics, then y) and only x is kept: the backward recomputes z.
// With a residual r (EESP's unit input, added after BN), z = x A + B + r, and r's gradient is dz.
// Backward, with dz = dy where z > 0 and a dy elsewhere and M = R elements per channel:
//   grad_a = sum min(z, 0) dy,  grad_b = sum dz,  grad_w = s sum dz (x - m)
//   grad_x = (dz - sum dz / M - (x - m) s^2 sum dz (x - m) / M) s w   (ATen's BN formula)
// in two passes: the three sums, then grad_x.
// The statistics are sums of x - x[0, c] (shifted, so that a mean far from zero costs no
// precision), in float32 per fixed block of rows and in double across the blocks; every sum is
// taken per fixed block of rows and added in order, so nothing depends on the thread count.
// x, grad_y and y share one dtype, float32 or bfloat16 (autocast's convolutions give BN bfloat16
// inputs; z is not rounded to it); weight, bias, slope, the statistics and the parameter
// gradients are float32.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h

// rows [begin, end) of (R, C) as parallel_for chunks of at least 32K elements
template <typename Fn>
void for_rows(int64_t R, int64_t C, Fn&& fn) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1));
  at::parallel_for(0, R, grain, std::forward<Fn>(fn));
}

// per-channel A = s w and B = b - m A, the BN transform z = x A + B
void transform(const float* weight, const float* bias, const float* mean, const float* invstd,
               float* A, float* B, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    A[c] = invstd[c] * weight[c];
    B[c] = bias[c] - mean[c] * A[c];
  }
}

template <typename T, bool kResidual>
void forward_rows(const T* xs, const T* rs, const float* weight, const float* bias,
                  const float* slope, float eps, T* ys, float* mean, float* invstd,
                  float* var_unbiased, int64_t R, int64_t C) {
  // pass 1: per block, the shifted sums of x - k and (x - k)^2, k = x[0, c]
  std::vector<float> shift(C);
  for (int64_t c = 0; c < C; ++c) shift[c] = load(xs, c);
  const int64_t blocks = row_blocks(R, C);
  std::vector<float> sums(blocks * 2 * C, 0.f);
  const float* __restrict__ k = shift.data();
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ s1 = sums.data() + block * 2 * C;
      float* __restrict__ s2 = s1 + C;
      const int64_t row_end = (block + 1) * R / blocks;
      for (int64_t r = block * R / blocks; r < row_end; ++r) {
        const T* __restrict__ x = xs + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float d = load(x, c) - k[c];
          s1[c] += d;
          s2[c] += d * d;
        }
      }
    }
  });
  const double count = static_cast<double>(R);
  for (int64_t c = 0; c < C; ++c) {
    double t1 = 0.0, t2 = 0.0;
    for (int64_t block = 0; block < blocks; ++block) {
      t1 += sums[block * 2 * C + c];
      t2 += sums[block * 2 * C + C + c];
    }
    const double centred = std::max(t2 - t1 * t1 / count, 0.0);  // sum (x - m)^2
    mean[c] = static_cast<float>(k[c] + t1 / count);
    invstd[c] = static_cast<float>(1.0 / std::sqrt(centred / count + eps));
    var_unbiased[c] = static_cast<float>(centred / (count - 1.0));
  }
  // pass 2: y = prelu(x A + B (+ r))
  std::vector<float> A(C), B(C);
  transform(weight, bias, mean, invstd, A.data(), B.data(), C);
  const float* __restrict__ a = A.data();
  const float* __restrict__ b = B.data();
  for_rows(R, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* __restrict__ x = xs + r * C;
      const T* __restrict__ res = kResidual ? rs + r * C : nullptr;
      T* __restrict__ y = ys + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float z = load(x, c) * a[c] + b[c] + (kResidual ? load(res, c) : 0.f);
        store(y, c, prelu(z, slope[c]));
      }
    }
  });
}

// PReLU's derivative at z. Both operands are loaded before the select: a load on one side of it
// would be conditional and keep the loops from vectorising (2.05 against 0.18 ms for 364K elements).
inline float factor(float z, float slope) { return z > 0.f ? 1.f : slope; }

template <typename T, bool kResidual>
void backward_rows(const T* dys, const T* xs, const T* rs, const float* weight, const float* bias,
                   const float* slope, const float* mean, const float* invstd, T* dxs, T* drs,
                   float* totals, int64_t R, int64_t C) {
  std::vector<float> A(C), B(C);
  transform(weight, bias, mean, invstd, A.data(), B.data(), C);
  const float* __restrict__ a = A.data();
  const float* __restrict__ b = B.data();
  // pass 1: per block, sum dz, sum dz (x - m), sum min(z, 0) dy
  const int64_t blocks = row_blocks(R, C);
  std::vector<float> sums(blocks * 3 * C, 0.f);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ sum_dz = sums.data() + block * 3 * C;
      float* __restrict__ sum_dz_xmu = sum_dz + C;
      float* __restrict__ sum_slope = sum_dz_xmu + C;
      const int64_t row_end = (block + 1) * R / blocks;
      for (int64_t r = block * R / blocks; r < row_end; ++r) {
        const T* __restrict__ dy = dys + r * C;
        const T* __restrict__ x = xs + r * C;
        const T* __restrict__ res = kResidual ? rs + r * C : nullptr;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float v = load(x, c), g = load(dy, c);
          const float z = v * a[c] + b[c] + (kResidual ? load(res, c) : 0.f);
          const float dz = factor(z, slope[c]) * g;
          sum_dz[c] += dz;
          sum_dz_xmu[c] += dz * (v - mean[c]);
          sum_slope[c] += std::min(z, 0.f) * g;
        }
      }
    }
  });
  for (int64_t block = 0; block < blocks; ++block)
    for (int64_t j = 0; j < 3 * C; ++j) totals[j] += sums[block * 3 * C + j];
  // pass 2: grad_x (and the residual's, dz)
  const float count = static_cast<float>(R);
  std::vector<float> mean_dz(C), kk(C), scale(C);
  for (int64_t c = 0; c < C; ++c) {
    mean_dz[c] = totals[c] / count;
    kk[c] = totals[C + c] / count * invstd[c] * invstd[c];
    scale[c] = invstd[c] * weight[c];
  }
  const float* __restrict__ mdz = mean_dz.data();
  const float* __restrict__ k = kk.data();
  const float* __restrict__ sc = scale.data();
  for_rows(R, C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* __restrict__ dy = dys + r * C;
      const T* __restrict__ x = xs + r * C;
      const T* __restrict__ res = kResidual ? rs + r * C : nullptr;
      T* __restrict__ dx = dxs + r * C;
      T* __restrict__ dres = kResidual ? drs + r * C : nullptr;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float v = load(x, c);
        const float z = v * a[c] + b[c] + (kResidual ? load(res, c) : 0.f);
        const float dz = factor(z, slope[c]) * load(dy, c);
        store(dx, c, (dz - mdz[c] - (v - mean[c]) * k[c]) * sc[c]);
        if constexpr (kResidual) store(dres, c, dz);
      }
    }
  });
}

constexpr const char* kForward = "batch_norm_prelu_forward";
constexpr const char* kBackward = "batch_norm_prelu_backward";

// x (R, C) float32 or bfloat16, at least two rows; every (C,) vector float32
void check_rows(const char* op, const at::Tensor& x, const char* name) {
  check_dense(op, x, name, 2, "(R, C)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, op, ": ", name,
              " must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(x.size(0) > 1, op, ": ", name, " has shape ", x.sizes(),
              ": BatchNorm's training statistics need more than one value per channel");
}

// an optional residual: (R, C) of x's shape and dtype
void check_residual(const char* op, const std::optional<at::Tensor>& residual, const at::Tensor& x) {
  if (residual.has_value()) check_like_rows(op, *residual, "residual", x);
}

// fn(T{}, std::bool_constant<residual>{}) for x's element type
template <typename Fn>
void dispatch(const at::Tensor& x, bool residual, Fn&& fn) {
  const auto with = [&](auto element) {
    if (residual)
      fn(element, std::true_type{});
    else
      fn(element, std::false_type{});
  };
  if (x.scalar_type() == at::kFloat)
    with(float{});
  else
    with(c10::BFloat16{});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_prelu_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& slope,
    double eps, const std::optional<at::Tensor>& residual) {
  check_rows(kForward, x, "x");
  check_channel_vectors(kForward, {{&weight, "weight"}, {&bias, "bias"}, {&slope, "slope"}}, x);
  check_residual(kForward, residual, x);
  TORCH_CHECK(eps > 0.0, kForward, ": eps must be positive, got ", eps);
  const int64_t R = x.size(0), C = x.size(1);
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({C}, f32), invstd = at::empty({C}, f32), var = at::empty({C}, f32);
  dispatch(x, residual.has_value(), [&](auto element, auto has_residual) {
    using T = decltype(element);
    const T* rs = has_residual ? residual->data_ptr<T>() : nullptr;
    forward_rows<T, decltype(has_residual)::value>(
        x.data_ptr<T>(), rs, weight.data_ptr<float>(), bias.data_ptr<float>(),
        slope.data_ptr<float>(), static_cast<float>(eps), y.data_ptr<T>(), mean.data_ptr<float>(),
        invstd.data_ptr<float>(), var.data_ptr<float>(), R, C);
  });
  return {y, mean, invstd, var};
}

// (grad_x, grad_weight, grad_bias, grad_slope, grad_residual); without a residual the last is
// empty
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_prelu_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& slope, const at::Tensor& save_mean,
    const at::Tensor& save_invstd, const std::optional<at::Tensor>& residual) {
  check_rows(kBackward, x, "x");
  check_like_rows(kBackward, grad_y, "grad_y", x);
  check_channel_vectors(kBackward,
                {{&weight, "weight"},
                 {&bias, "bias"},
                 {&slope, "slope"},
                 {&save_mean, "save_mean"},
                 {&save_invstd, "save_invstd"}},
                x);
  check_residual(kBackward, residual, x);
  const int64_t R = x.size(0), C = x.size(1);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  at::Tensor grad_residual = at::empty(residual.has_value() ? x.sizes() : at::IntArrayRef{0},
                                       x.options());
  // per channel: sum dz, sum dz (x - m), sum min(z, 0) dy
  at::Tensor totals = at::zeros({3, C}, x.options().dtype(at::kFloat));
  dispatch(x, residual.has_value(), [&](auto element, auto has_residual) {
    using T = decltype(element);
    const T* rs = has_residual ? residual->data_ptr<T>() : nullptr;
    T* drs = has_residual ? grad_residual.data_ptr<T>() : nullptr;
    backward_rows<T, decltype(has_residual)::value>(
        grad_y.data_ptr<T>(), x.data_ptr<T>(), rs, weight.data_ptr<float>(),
        bias.data_ptr<float>(), slope.data_ptr<float>(), save_mean.data_ptr<float>(),
        save_invstd.data_ptr<float>(), grad_x.data_ptr<T>(), drs, totals.data_ptr<float>(), R, C);
  });
  at::Tensor grad_weight = totals.select(0, 1).mul(save_invstd);
  return {grad_x, grad_weight, totals.select(0, 0).clone(), totals.select(0, 2).clone(),
          grad_residual};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "batch_norm_prelu_forward(Tensor x, Tensor weight, Tensor bias, Tensor slope, float eps, "
      "Tensor? residual=None) -> (Tensor, Tensor, Tensor, Tensor)",
      &batch_norm_prelu_forward);
  m.def(
      "batch_norm_prelu_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor bias, "
      "Tensor slope, Tensor save_mean, Tensor save_invstd, Tensor? residual=None) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      &batch_norm_prelu_backward);
}
