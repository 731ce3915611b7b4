// DimFuse's local-fusion convolution (training): a grouped 1x1 convolution with one output
// channel per group, over rows of channels (a channels-last map seen as (R, K C)):
//   y[r, c]      = sum_b w[c K + b] x[r, c K + b],  b < K   (K = 3 in DiCE: one channel's
//                                                            dimension-wise responses)
//   grad_x[r, j] = w[j] grad_y[r, j / K]
//   grad_w[j]    = sum_r grad_y[r, j / K] x[r, j]
// oneDNN runs this convolution as a general grouped one: 0.15 ms forward and 0.41 ms backward for
// a 4 x 348 x 14 x 14 input on 2 cores, where these passes take 0.06 and 0.08 ms; in all, about a
// tenth of a DiCENet training step. Here each direction is one pass over the rows.
// The weight gradient is summed per fixed block of rows (a function of the sizes only) and the
// partial sums are added in order, so it does not depend on the thread count.
// x, grad_y and weight share one dtype: float32, bfloat16 or float16 (arithmetic in float32).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h

// rows per task of the forward and of the input gradient: about 32k elements of x
int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(width, 1));
}

template <typename T>
void forward_rows(const T* xs, const float* w, T* ys, int64_t R, int64_t C, int64_t K) {
  const int64_t width = C * K;
  at::parallel_for(0, R, row_grain(width), [&](int64_t begin, int64_t end) {
    std::vector<float> products(width);
    float* __restrict__ p = products.data();
    for (int64_t r = begin; r < end; ++r) {
      const T* __restrict__ x = xs + r * width;
      T* __restrict__ y = ys + r * C;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) p[j] = w[j] * load(x, j);
      for (int64_t c = 0; c < C; ++c) {
        float sum = p[c * K];
        for (int64_t b = 1; b < K; ++b) sum += p[c * K + b];
        store(y, c, sum);
      }
    }
  });
}

// grad_x and the weight gradient's partial sums: partial[block, j] sums over the block's rows
template <typename T>
void backward_rows(const T* dys, const T* xs, const float* w, T* dxs, float* partial, int64_t R,
                   int64_t C, int64_t K, bool want_x, bool want_w) {
  const int64_t width = C * K;
  const int64_t blocks = row_blocks(R, width);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> spread(width);  // grad_y[r, j / K] for every j of the row
    float* __restrict__ g = spread.data();
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ acc = want_w ? partial + block * width : nullptr;
      const int64_t row_end = (block + 1) * R / blocks;
      for (int64_t r = block * R / blocks; r < row_end; ++r) {
        const T* __restrict__ dy = dys + r * C;
        for (int64_t c = 0; c < C; ++c) {
          const float v = load(dy, c);
          for (int64_t b = 0; b < K; ++b) g[c * K + b] = v;
        }
        if (want_x) {
          T* __restrict__ dx = dxs + r * width;
#pragma omp simd
          for (int64_t j = 0; j < width; ++j) store(dx, j, w[j] * g[j]);
        }
        if (want_w) {
          multiply_add(acc, g, xs + r * width, width);
        }
      }
    }
  });
}

// the checks both ops make before any memory is read; returns (C, K)
std::tuple<int64_t, int64_t> check_operands(const char* op, const at::Tensor& x,
                                            const at::Tensor& weight) {
  check_dense(op, x, "x", 2, "(R, K C)");
  check_dense(op, weight, "weight", 2, "(C, K)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", dtype);
  TORCH_CHECK(weight.scalar_type() == dtype, op, ": weight must be ", dtype_name(dtype),
              " as x, got ", weight.scalar_type());
  const int64_t C = weight.size(0), K = weight.size(1);
  TORCH_CHECK(C > 0 && K > 0, op, ": weight must be (C, K) with C, K > 0, got shape ",
              weight.sizes());
  check_shape(op, x, "x", {x.size(0), C * K}, "(R, K C), C and K of weight ", weight.sizes());
  return {C, K};
}

std::vector<float> weights_in_float(const at::Tensor& weight) {
  std::vector<float> w(weight.numel());
  dispatch_float(weight.scalar_type(), [&](auto zero) {
    const auto* src = weight.data_ptr<decltype(zero)>();
    for (size_t j = 0; j < w.size(); ++j) w[j] = load(src, static_cast<int64_t>(j));
  });
  return w;
}

at::Tensor local_fusion_convolution(const at::Tensor& x, const at::Tensor& weight) {
  const auto [C, K] = check_operands("local_fusion_convolution", x, weight);
  const int64_t R = x.size(0);
  at::Tensor y = at::empty({R, C}, x.options());
  const std::vector<float> w = weights_in_float(weight);
  dispatch_float(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    forward_rows(x.data_ptr<T>(), w.data(), y.data_ptr<T>(), R, C, K);
  });
  return y;
}

// (grad_x (R, K C) or an empty tensor, float32 grad_weight (C, K) or an empty tensor)
std::tuple<at::Tensor, at::Tensor> local_fusion_convolution_backward(const at::Tensor& grad_y,
                                                              const at::Tensor& x,
                                                              const at::Tensor& weight,
                                                              bool input_grad, bool weight_grad) {
  constexpr const char* kOp = "local_fusion_convolution_backward";
  const auto [C, K] = check_operands(kOp, x, weight);
  check_dense(kOp, grad_y, "grad_y", 2, "(R, C)");
  TORCH_CHECK(grad_y.scalar_type() == x.scalar_type(), kOp, ": grad_y must be ",
              dtype_name(x.scalar_type()), " as x, got ", grad_y.scalar_type());
  const int64_t R = x.size(0);
  check_shape(kOp, grad_y, "grad_y", {R, C}, "(R, C), R of x ", x.sizes(), " and C of weight ",
              weight.sizes());

  at::Tensor grad_x = input_grad ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  const auto fp32 = x.options().dtype(at::kFloat);
  const int64_t blocks = row_blocks(R, C * K);
  // (blocks, K C): each row block's partial sums of the weight gradient
  at::Tensor partial = at::zeros({weight_grad ? std::max<int64_t>(blocks, 1) : 0, C * K}, fp32);
  const std::vector<float> w = weights_in_float(weight);
  if (input_grad || weight_grad) {
    dispatch_float(x.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      backward_rows(grad_y.data_ptr<T>(), x.data_ptr<T>(), w.data(),
                    input_grad ? grad_x.data_ptr<T>() : nullptr,
                    weight_grad ? partial.data_ptr<float>() : nullptr, R, C, K, input_grad,
                    weight_grad);
    });
  }
  at::Tensor grad_weight = at::zeros({weight_grad ? C : 0, K}, fp32);
  if (weight_grad) {  // the partial sums, added in order
    float* total = grad_weight.data_ptr<float>();
    const float* part = partial.data_ptr<float>();
    for (int64_t p = 0; p < blocks; ++p)
      for (int64_t j = 0; j < C * K; ++j) total[j] += part[p * C * K + j];
  }
  return {grad_x, grad_weight};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def("local_fusion_convolution(Tensor x, Tensor weight) -> Tensor", &local_fusion_convolution);
  m.def(
      "local_fusion_convolution_backward(Tensor grad_y, Tensor x, Tensor weight, bool input_grad, "
      "bool weight_grad) -> (Tensor, Tensor)",
      &local_fusion_convolution_backward);
}
