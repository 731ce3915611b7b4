// The backward of a depth-wise k x k convolution (training) on channels-last maps. With x in
// (B, H, W, C) memory order, stride s, zero padding p and dilation d, the forward (ATen's) is
//   y[b, oh, ow, c] = sum_ij x[b, oh s - p + i d, ow s - p + j d, c] w[c, i, j]  (+ bias[c])
// and its gradients are
//   grad_x[b, ih, iw, c] = sum over the taps (i, j) and outputs (oh, ow) that read (ih, iw) of
//                          grad_y[b, oh, ow, c] w[c, i, j]
//   grad_w[c, i, j]      = sum_{b, oh, ow} grad_y[b, oh, ow, c]
//                                           x[b, oh s - p + i d, ow s - p + j d, c]
//   grad_bias[c]         = sum_{b, oh, ow} grad_y[b, oh, ow, c]
// oneDNN's CPU backward of a depth-wise convolution takes 10-20x its forward (2.3 vs 0.2 ms for
// 4 x 64 x 56 x 56 on 2 cores; more with dilation): a third of an ESPNetv2 training step, whose
// EESP pyramids are dilated depth-wise convolutions. Here the input gradient gathers its taps per
// input row (no two threads write one element), every loop runs along the contiguous channels,
// and the weight and bias gradients are summed per fixed block of output rows and the blocks in
// order, so they do not depend on the thread count. Arithmetic in float32; grad_y, x and weight
// share one dtype (float32, bfloat16 or float16).

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

#ifdef LIGHTNETS_AVX512
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif

namespace {

using namespace lightnets;  // the shared helpers of common.h

struct Geometry {
  int64_t B, H, W, C, OH, OW, k, stride, padding, dilation;
  int64_t in_row(int64_t b, int64_t h, int64_t w) const { return ((b * H + h) * W + w) * C; }
  int64_t out_row(int64_t b, int64_t h, int64_t w) const { return ((b * OH + h) * OW + w) * C; }
};

// grad_x, one (b, ih) row per task: each element gathers the outputs its taps fed. The taps
// and output rows that reach input row ih are found once per row, the columns once per column.
template <typename T>
void input_grad(const T* gy, const float* w_taps, T* dx, const Geometry& g) {
  const int64_t C = g.C, k = g.k;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(g.W * C, 1));
  // the output index a tap offset `num` = i_in + padding - tap * dilation reaches, or -1
  const auto reached = [&](int64_t num, int64_t extent) -> int64_t {
    if (num < 0) return -1;
    const int64_t o = g.stride == 1 ? num : (num % g.stride == 0 ? num / g.stride : -1);
    return o < extent ? o : -1;
  };
  at::parallel_for(0, g.B * g.H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(C);
    std::vector<int64_t> taps_i(k), rows_o(k), taps_j(k), cols_o(k);
    float* __restrict__ acc = buffer.data();
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / g.H, ih = r % g.H;
      int64_t n_i = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t oh = reached(ih + g.padding - i * g.dilation, g.OH);
        if (oh >= 0) taps_i[n_i] = i, rows_o[n_i++] = oh;
      }
      for (int64_t iw = 0; iw < g.W; ++iw) {
        int64_t n_j = 0;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t ow = reached(iw + g.padding - j * g.dilation, g.OW);
          if (ow >= 0) taps_j[n_j] = j, cols_o[n_j++] = ow;
        }
        std::fill(buffer.begin(), buffer.end(), 0.f);
        for (int64_t a_i = 0; a_i < n_i; ++a_i)
          for (int64_t a_j = 0; a_j < n_j; ++a_j) {
            const T* __restrict__ src = gy + g.out_row(b, rows_o[a_i], cols_o[a_j]);
            const float* __restrict__ a = w_taps + (taps_i[a_i] * k + taps_j[a_j]) * C;
            multiply_add(acc, a, src, C);
          }
        store_row(dx + g.in_row(b, ih, iw), acc, C);
      }
    }
  });
}

// the weight and bias gradients' partial sums over each block of (b, oh) output rows:
// part_w (blocks, k k C) tap-major, part_b (blocks, C)
template <typename T>
void parameter_grads(const T* gy, const T* x, float* part_w, float* part_b, const Geometry& g,
                     int64_t blocks) {
  const int64_t C = g.C, k = g.k, rows = g.B * g.OH;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ pw = part_w + block * k * k * C;
      float* __restrict__ pb = part_b + block * C;
      for (int64_t r = block * rows / blocks; r < (block + 1) * rows / blocks; ++r) {
        const int64_t b = r / g.OH, oh = r % g.OH;
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const T* __restrict__ grad = gy + g.out_row(b, oh, ow);
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) pb[c] += load(grad, c);
          for (int64_t i = 0; i < k; ++i) {
            const int64_t ih = oh * g.stride - g.padding + i * g.dilation;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t j = 0; j < k; ++j) {
              const int64_t iw = ow * g.stride - g.padding + j * g.dilation;
              if (iw < 0 || iw >= g.W) continue;
              const T* __restrict__ src = x + g.in_row(b, ih, iw);
              float* __restrict__ p = pw + (i * k + j) * C;
              multiply_add(p, grad, src, C);
            }
          }
        }
      }
    }
  });
}

// (grad_x or an empty tensor, float32 grad_weight (C, k, k) and grad_bias (C,) or empty tensors)
std::tuple<at::Tensor, at::Tensor, at::Tensor> depthwise_conv_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight, int64_t stride,
    int64_t padding, int64_t dilation, bool want_input, bool want_weight, bool want_bias) {
  constexpr const char* kOp = "depthwise_conv_backward";
  check_dense(kOp, x, "x", 4, "(B, H, W, C)");
  check_dense(kOp, weight, "weight", 3, "(C, k, k)");
  check_dense(kOp, grad_y, "grad_y", 4, "(B, OH, OW, C)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, kOp,
              ": x must be float32, bfloat16 or float16, got ", dtype);
  TORCH_CHECK(weight.scalar_type() == dtype, kOp, ": weight must be ", dtype_name(dtype),
              " as x, got ", weight.scalar_type());
  TORCH_CHECK(grad_y.scalar_type() == dtype, kOp, ": grad_y must be ", dtype_name(dtype),
              " as x, got ", grad_y.scalar_type());
  TORCH_CHECK(stride >= 1 && padding >= 0 && dilation >= 1, kOp,
              ": need stride >= 1, padding >= 0 and dilation >= 1, got ", stride, ", ", padding,
              ", ", dilation);
  const int64_t k = weight.size(1);
  TORCH_CHECK(k >= 1 && dilation * k < lightnets::kMaxReach && padding < lightnets::kMaxReach,
              kOp, ": weight has shape ", weight.sizes(), "; with dilation ", dilation,
              " and padding ", padding, " that is out of range");
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  check_shape(kOp, weight, "weight", {C, k, k}, "(C, k, k), C of x ", x.sizes(),
              " and k of weight");
  const int64_t reach = dilation * (k - 1) + 1;
  TORCH_CHECK(H + 2 * padding >= reach && W + 2 * padding >= reach, kOp, ": x ", x.sizes(),
              " padded by ", padding, " is smaller than the kernel's reach ", reach);
  const int64_t OH = (H + 2 * padding - reach) / stride + 1;
  const int64_t OW = (W + 2 * padding - reach) / stride + 1;
  check_shape(kOp, grad_y, "grad_y", {B, OH, OW, C}, "(B, OH, OW, C) of x ", x.sizes(),
              ", weight ", weight.sizes(), ", stride ", stride, ", padding ", padding,
              ", dilation ", dilation);
  const Geometry g{B, H, W, C, OH, OW, k, stride, padding, dilation};

  const auto fp32 = x.options().dtype(at::kFloat);
  at::Tensor grad_x = want_input ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  const bool sums = want_weight || want_bias;
  const int64_t blocks = sums ? row_blocks(B * OH, OW * C) : 0;
  at::Tensor part_w = at::zeros({blocks, k * k * C}, fp32);
  at::Tensor part_b = at::zeros({blocks, C}, fp32);
  dispatch_float(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (want_input) {
      // the weight tap-major, (k, k, C), so that a tap's weights run along the channels
      std::vector<float> w_taps(k * k * C);
      const T* w = weight.data_ptr<T>();
      for (int64_t c = 0; c < C; ++c)
        for (int64_t tap = 0; tap < k * k; ++tap) w_taps[tap * C + c] = load(w, c * k * k + tap);
      input_grad(grad_y.data_ptr<T>(), w_taps.data(), grad_x.data_ptr<T>(), g);
    }
    if (sums)
      parameter_grads(grad_y.data_ptr<T>(), x.data_ptr<T>(), part_w.data_ptr<float>(),
                      part_b.data_ptr<float>(), g, blocks);
  });
  at::Tensor grad_w = at::zeros({want_weight ? C : 0, k, k}, fp32);
  at::Tensor grad_b = at::zeros({want_bias ? C : 0}, fp32);
  for (int64_t p = 0; p < blocks; ++p) {  // the partial sums, added in order
    if (want_weight) {
      float* dw = grad_w.data_ptr<float>();
      const float* pw = part_w.data_ptr<float>() + p * k * k * C;
      for (int64_t tap = 0; tap < k * k; ++tap)
        for (int64_t c = 0; c < C; ++c) dw[c * k * k + tap] += pw[tap * C + c];
    }
    if (want_bias) {
      float* db = grad_b.data_ptr<float>();
      const float* pb = part_b.data_ptr<float>() + p * C;
      for (int64_t c = 0; c < C; ++c) db[c] += pb[c];
    }
  }
  return {grad_x, grad_w, grad_b};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "depthwise_conv_backward(Tensor grad_y, Tensor x, Tensor weight, int stride, int padding, "
      "int dilation, bool input_grad, bool weight_grad, bool bias_grad) "
      "-> (Tensor, Tensor, Tensor)",
      &depthwise_conv_backward);
}
