// DimConv (DiCENet) forward and backward for training, on channels-last maps at the build size.
// With x in (B, H, W, C) memory order and "same" zero padding (half = (k - 1) / 2, offsets
// o(i) = (i - half) d per branch dilation d), the three branches of output position (b, h, w, c):
//   channel-wise: sum_ij x[b, h + o(i), w + o(j), c]    wc[c, i, j]
//   height-wise:  sum_ij x[b, h, w + o(j), c + o(i)]    wh[h, i, j]   (kernel axes channel, width)
//   width-wise:   sum_ij x[b, h + o(i), w, c + o(j)]    ww[w, i, j]   (kernel axes height, channel)
// written interleaved (channel 3c + branch) or concatenated (branch C + c). Every inner loop runs
// along the channels, contiguous in this layout, so the height- and width-wise convolutions need
// none of the transposed copies the eager path makes for them (three depth-wise oneDNN
// convolutions, two transposes and a stack forward, as many again backward: a fifth of a DiCENet
// s=1.0 training step on 2 cores). The backward de-interleaves the output gradient once, then
// writes the input gradient (the three transposed stencils) and sums the weight gradients in the
// same pass over the rows. The weight gradients are summed per fixed block of (b, h) rows and the
// blocks in order, so they do not depend on the thread count. Arithmetic in float32; x, weights
// and output gradient share one dtype (float32, bfloat16 or float16).

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

struct Sizes {
  int64_t B, H, W, C, k, half;
  int64_t dc, dh, dw;  // dilations of the channel-, height- and width-wise branches
  bool interleave;
  // the output channel of branch t (0 channel-, 1 height-, 2 width-wise) of input channel c
  int64_t out(int64_t c, int64_t t) const { return interleave ? 3 * c + t : t * C + c; }
  int64_t row(int64_t b, int64_t h, int64_t w) const { return ((b * H + h) * W + w) * C; }
};

// The weights in float32: the channel-wise one transposed to (k, k, C) so that a tap's weights
// run along the channels; the height- and width-wise ones as they are, (H, k, k) and (W, k, k).
struct Weights {
  std::vector<float> channel, height, width;
};

template <typename T>
std::vector<float> to_float(const at::Tensor& t) {
  std::vector<float> out(t.numel());
  const T* src = t.data_ptr<T>();
  for (size_t j = 0; j < out.size(); ++j) out[j] = load(src, static_cast<int64_t>(j));
  return out;
}

template <typename T>
Weights weights_in_float(const at::Tensor& wc, const at::Tensor& wh, const at::Tensor& ww,
                         const Sizes& s) {
  Weights w{std::vector<float>(s.k * s.k * s.C), to_float<T>(wh), to_float<T>(ww)};
  const std::vector<float> channel = to_float<T>(wc);
  for (int64_t c = 0; c < s.C; ++c)
    for (int64_t tap = 0; tap < s.k * s.k; ++tap)
      w.channel[tap * s.C + c] = channel[c * s.k * s.k + tap];
  return w;
}

// acc[c] += a * src[c + off] over the channels where c + off is one
template <typename T>
inline void shifted_axpy(float* __restrict__ acc, const T* __restrict__ src, float a, int64_t off,
                         int64_t C) {
  const int64_t lo = std::max<int64_t>(0, -off), hi = std::min<int64_t>(C, C - off);
#pragma omp simd
  for (int64_t c = lo; c < hi; ++c) acc[c] += a * load(src, c + off);
}

// sum over the channels where c + off is one of g[c] * src[c + off]
template <typename T>
inline float shifted_dot(const float* __restrict__ g, const T* __restrict__ src, int64_t off,
                         int64_t C) {
  const int64_t lo = std::max<int64_t>(0, -off), hi = std::min<int64_t>(C, C - off);
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t c = lo; c < hi; ++c) total += g[c] * load(src, c + off);
  return total;
}

template <typename T>
void forward(const T* x, const Weights& wt, T* y, const Sizes& s) {
  const int64_t C = s.C, k = s.k;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(s.W * C, 1));
  at::parallel_for(0, s.B * s.H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(3 * C);
    float* __restrict__ acc_c = buffer.data();
    float* __restrict__ acc_h = acc_c + C;
    float* __restrict__ acc_w = acc_h + C;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / s.H, h = r % s.H;
      for (int64_t w = 0; w < s.W; ++w) {
        std::fill(buffer.begin(), buffer.end(), 0.f);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t hc = h + (i - s.half) * s.dc, hw = h + (i - s.half) * s.dw;
          for (int64_t j = 0; j < k; ++j) {
            const int64_t wc = w + (j - s.half) * s.dc, wh = w + (j - s.half) * s.dh;
            if (hc >= 0 && hc < s.H && wc >= 0 && wc < s.W) {
              const T* __restrict__ src = x + s.row(b, hc, wc);
              const float* __restrict__ a = wt.channel.data() + (i * k + j) * C;
              multiply_add(acc_c, a, src, C);
            }
            if (wh >= 0 && wh < s.W)
              shifted_axpy(acc_h, x + s.row(b, h, wh), wt.height[(h * k + i) * k + j],
                           (i - s.half) * s.dh, C);
            if (hw >= 0 && hw < s.H)
              shifted_axpy(acc_w, x + s.row(b, hw, w), wt.width[(w * k + i) * k + j],
                           (j - s.half) * s.dw, C);
          }
        }
        T* __restrict__ out = y + s.row(b, h, w) * 3;
        for (int64_t c = 0; c < C; ++c) {
          store(out, s.out(c, 0), acc_c[c]);
          store(out, s.out(c, 1), acc_h[c]);
          store(out, s.out(c, 2), acc_w[c]);
        }
      }
    }
  });
}

// The input gradient and the weight gradients' partial sums of one block of (b, h) rows.
// g: the output gradient de-interleaved, float32 (3, B H W C).
template <typename T>
void backward(const float* g, const T* x, const Weights& wt, T* dx, float* part_c, float* part_h,
              float* part_w, const Sizes& s, int64_t blocks, bool want_x, bool want_w) {
  const int64_t C = s.C, k = s.k, rows = s.B * s.H;
  const int64_t plane = rows * s.W * C;
  const float* gc = g;
  const float* gh = g + plane;
  const float* gw = g + 2 * plane;
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> buffer(C);
    float* __restrict__ acc = buffer.data();
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ pc = want_w ? part_c + block * k * k * C : nullptr;
      float* __restrict__ ph = want_w ? part_h + block * s.H * k * k : nullptr;
      float* __restrict__ pw = want_w ? part_w + block * s.W * k * k : nullptr;
      for (int64_t r = block * rows / blocks; r < (block + 1) * rows / blocks; ++r) {
        const int64_t b = r / s.H, h = r % s.H;
        for (int64_t w = 0; w < s.W; ++w) {
          const int64_t at = s.row(b, h, w);
          if (want_x) {
            std::fill(buffer.begin(), buffer.end(), 0.f);
            for (int64_t i = 0; i < k; ++i) {
              const int64_t hc = h - (i - s.half) * s.dc, hw = h - (i - s.half) * s.dw;
              for (int64_t j = 0; j < k; ++j) {
                const int64_t wc = w - (j - s.half) * s.dc, wh = w - (j - s.half) * s.dh;
                if (hc >= 0 && hc < s.H && wc >= 0 && wc < s.W) {
                  const float* __restrict__ src = gc + s.row(b, hc, wc);
                  const float* __restrict__ a = wt.channel.data() + (i * k + j) * C;
                  multiply_add(acc, a, src, C);
                }
                if (wh >= 0 && wh < s.W)
                  shifted_axpy(acc, gh + s.row(b, h, wh), wt.height[(h * k + i) * k + j],
                               -(i - s.half) * s.dh, C);
                if (hw >= 0 && hw < s.H)
                  shifted_axpy(acc, gw + s.row(b, hw, w), wt.width[(w * k + i) * k + j],
                               -(j - s.half) * s.dw, C);
              }
            }
            store_row(dx + at, acc, C);
          }
          if (want_w) {
            for (int64_t i = 0; i < k; ++i) {
              const int64_t hc = h + (i - s.half) * s.dc, hw = h + (i - s.half) * s.dw;
              for (int64_t j = 0; j < k; ++j) {
                const int64_t wc = w + (j - s.half) * s.dc, wh = w + (j - s.half) * s.dh;
                if (hc >= 0 && hc < s.H && wc >= 0 && wc < s.W) {
                  const T* __restrict__ src = x + s.row(b, hc, wc);
                  const float* __restrict__ grad = gc + at;
                  float* __restrict__ p = pc + (i * k + j) * C;
                  multiply_add(p, grad, src, C);
                }
                if (wh >= 0 && wh < s.W)
                  ph[(h * k + i) * k + j] +=
                      shifted_dot(gh + at, x + s.row(b, h, wh), (i - s.half) * s.dh, C);
                if (hw >= 0 && hw < s.H)
                  pw[(w * k + i) * k + j] +=
                      shifted_dot(gw + at, x + s.row(b, hw, w), (j - s.half) * s.dw, C);
              }
            }
          }
        }
      }
    }
  });
}

// The output gradient, (B H W, 3C) in the output's channel order, as three float32 planes.
template <typename T>
void deinterleave(const T* gy, float* g, const Sizes& s) {
  const int64_t positions = s.B * s.H * s.W, C = s.C, plane = positions * C;
  const int64_t grain = std::max<int64_t>(1, 8192 / (3 * C));
  at::parallel_for(0, positions, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const T* __restrict__ src = gy + p * 3 * C;
      for (int64_t t = 0; t < 3; ++t) {
        float* __restrict__ dst = g + t * plane + p * C;
        for (int64_t c = 0; c < C; ++c) dst[c] = load(src, s.out(c, t));
      }
    }
  });
}

// Checks every operand before any memory is read; returns the sizes.
Sizes check_operands(const char* op, const at::Tensor& x, const at::Tensor& wc,
                     const at::Tensor& wh, const at::Tensor& ww, at::IntArrayRef dilation,
                     bool interleave) {
  check_dense(op, x, "x", 4, "(B, H, W, C)");
  check_dense(op, wc, "weight_channel", 3, "(C, k, k)");
  check_dense(op, wh, "weight_height", 3, "(H, k, k)");
  check_dense(op, ww, "weight_width", 3, "(W, k, k)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op,
              ": x must be float32, bfloat16 or float16, got ", dtype);
  const auto check_dtype = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == dtype, op, ": ", name, " must be ", dtype_name(dtype),
                " as x, got ", t.scalar_type());
  };
  check_dtype(wc, "weight_channel");
  check_dtype(wh, "weight_height");
  check_dtype(ww, "weight_width");
  TORCH_CHECK(dilation.size() == 3 && *std::min_element(dilation.begin(), dilation.end()) >= 1,
              op, ": dilation must be three positive ints, got ", dilation);
  const int64_t k = wc.size(1);
  TORCH_CHECK(k % 2 == 1, op, ": weight_channel must be (C, k, k) with k odd, got shape ",
              wc.sizes());
  TORCH_CHECK(*std::max_element(dilation.begin(), dilation.end()) * k < lightnets::kMaxReach, op,
              ": dilation ", dilation, " times kernel size ", k, " is out of range");
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  check_shape(op, wc, "weight_channel", {C, k, k}, "(C, k, k), C of x ", x.sizes(),
              " and k of weight_channel");
  check_shape(op, wh, "weight_height", {H, k, k}, "(H, k, k), H of x ", x.sizes(), " and k ", k);
  check_shape(op, ww, "weight_width", {W, k, k}, "(W, k, k), W of x ", x.sizes(), " and k ", k);
  return Sizes{B, H, W, C, k, (k - 1) / 2, dilation[0], dilation[1], dilation[2], interleave};
}

at::Tensor dim_conv_forward(const at::Tensor& x, const at::Tensor& weight_channel,
                            const at::Tensor& weight_height, const at::Tensor& weight_width,
                            at::IntArrayRef dilation, bool interleave) {
  const Sizes s = check_operands("dim_conv_forward", x, weight_channel, weight_height,
                                 weight_width, dilation, interleave);
  at::Tensor y = at::empty({s.B, s.H, s.W, 3 * s.C}, x.options());
  dispatch_float(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    const Weights wt = weights_in_float<T>(weight_channel, weight_height, weight_width, s);
    forward(x.data_ptr<T>(), wt, y.data_ptr<T>(), s);
  });
  return y;
}

// (grad_x or an empty tensor, then the three float32 weight gradients or empty tensors)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dim_conv_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight_channel,
    const at::Tensor& weight_height, const at::Tensor& weight_width, at::IntArrayRef dilation,
    bool interleave, bool input_grad, bool weight_grad) {
  constexpr const char* kOp = "dim_conv_backward";
  const Sizes s =
      check_operands(kOp, x, weight_channel, weight_height, weight_width, dilation, interleave);
  check_dense(kOp, grad_y, "grad_y", 4, "(B, H, W, 3C)");
  TORCH_CHECK(grad_y.scalar_type() == x.scalar_type(), kOp, ": grad_y must be ",
              dtype_name(x.scalar_type()), " as x, got ", grad_y.scalar_type());
  check_shape(kOp, grad_y, "grad_y", {s.B, s.H, s.W, 3 * s.C}, "(B, H, W, 3C), x ", x.sizes());

  const auto fp32 = x.options().dtype(at::kFloat);
  at::Tensor grad_x = input_grad ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  const int64_t blocks = row_blocks(s.B * s.H, s.W * s.C);
  const int64_t taps = s.k * s.k, parts = weight_grad ? blocks : 0;
  at::Tensor part_c = at::zeros({parts, taps * s.C}, fp32);
  at::Tensor part_h = at::zeros({parts, s.H * taps}, fp32);
  at::Tensor part_w = at::zeros({parts, s.W * taps}, fp32);
  if (input_grad || weight_grad) {
    at::Tensor g = at::empty({3, s.B * s.H * s.W * s.C}, fp32);
    dispatch_float(x.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      const Weights wt = weights_in_float<T>(weight_channel, weight_height, weight_width, s);
      deinterleave(grad_y.data_ptr<T>(), g.data_ptr<float>(), s);
      backward(g.data_ptr<float>(), x.data_ptr<T>(), wt,
               input_grad ? grad_x.data_ptr<T>() : nullptr,
               weight_grad ? part_c.data_ptr<float>() : nullptr,
               weight_grad ? part_h.data_ptr<float>() : nullptr,
               weight_grad ? part_w.data_ptr<float>() : nullptr, s, blocks, input_grad,
               weight_grad);
    });
  }
  const int64_t out_rows = weight_grad ? 1 : 0;
  at::Tensor grad_c = at::zeros({out_rows * s.C, s.k, s.k}, fp32);
  at::Tensor grad_h = at::zeros({out_rows * s.H, s.k, s.k}, fp32);
  at::Tensor grad_w = at::zeros({out_rows * s.W, s.k, s.k}, fp32);
  if (weight_grad) {  // the partial sums, added in order; the channel one transposed back
    float* dc = grad_c.data_ptr<float>();
    float* dh = grad_h.data_ptr<float>();
    float* dw = grad_w.data_ptr<float>();
    for (int64_t p = 0; p < blocks; ++p) {
      const float* pc = part_c.data_ptr<float>() + p * taps * s.C;
      for (int64_t tap = 0; tap < taps; ++tap)
        for (int64_t c = 0; c < s.C; ++c) dc[c * taps + tap] += pc[tap * s.C + c];
      const float* ph = part_h.data_ptr<float>() + p * s.H * taps;
      for (int64_t j = 0; j < s.H * taps; ++j) dh[j] += ph[j];
      const float* pw = part_w.data_ptr<float>() + p * s.W * taps;
      for (int64_t j = 0; j < s.W * taps; ++j) dw[j] += pw[j];
    }
  }
  return {grad_x, grad_c, grad_h, grad_w};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "dim_conv_forward(Tensor x, Tensor weight_channel, Tensor weight_height, "
      "Tensor weight_width, int[] dilation, bool interleave) -> Tensor",
      &dim_conv_forward);
  m.def(
      "dim_conv_backward(Tensor grad_y, Tensor x, Tensor weight_channel, Tensor weight_height, "
      "Tensor weight_width, int[] dilation, bool interleave, bool input_grad, bool weight_grad) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      &dim_conv_backward);
}
