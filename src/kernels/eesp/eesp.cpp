// Fused CPU inference kernel of the EESP unit's spatial pyramid.
//
// For the reduced map x of shape (B, n, H, W), one call computes the K depth-wise dilated 3x3
// convolutions (dilations d_0 <= ... <= d_{K-1}, stride 1 or 2), their hierarchical feature
// fusion (branch k adds the fused output of branch k - 1), the concatenation and its BN and
// PReLU:
//   out[:, k n + j] = PReLU(s[k n + j] * (sum_{k' <= k} conv_{k'}(x[:, j])) + t[k n + j])
// (the sum runs over k' = k alone without HFF), which is the middle of EESP.forward in
// src/kernels/eesp. Eagerly those are 2K + 2 ATen calls, K of them oneDNN convolutions with a
// fixed cost well above their arithmetic on these maps; here one padded copy of a channel's plane
// serves all K branches, and the running sum stays in a row buffer.
//
// Layout as in dice.cpp: the plane sits zero-padded by the largest dilation P in an
// (H + 2P + 1, W + 2P) buffer; at stride 1 every tap is one contiguous run on the padded pitch.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h

at::Tensor eesp_pyramid(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef dilations,
                        int64_t stride, const at::Tensor& affine, bool hff) {
  constexpr const char* kOp = "eesp_pyramid";
  check_operand(kOp, x, "x", 4, "(B, n, H, W)");
  check_operand(kOp, weight, "weight", 3, "(K, n, 9)");
  check_operand(kOp, affine, "affine", 2, "(3, K n)");
  TORCH_CHECK(stride == 1 || stride == 2, kOp, ": stride must be 1 or 2, got ", stride);
  const int64_t K = static_cast<int64_t>(dilations.size());
  TORCH_CHECK(K >= 1, kOp, ": dilations must name at least one branch, got ", dilations);
  int64_t pad = 0;
  for (int64_t d : dilations) {
    TORCH_CHECK(d >= 1 && d <= kMaxReach, kOp, ": dilations must be in [1, ", kMaxReach,
                "], got ", dilations);
    pad = std::max(pad, d);
  }
  const int64_t B = x.size(0), n = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(n >= 1 && H >= 1 && W >= 1, kOp, ": x needs a channel, a row and a column, got ",
              "shape ", x.sizes());
  check_shape(kOp, weight, "weight", {K, n, 9}, "(K, n, 9), K = len(dilations) ", dilations,
              ", n of x ", x.sizes());
  check_shape(kOp, affine, "affine", {3, K * n}, "(3, K n), K = len(dilations) ", dilations,
              ", n of x ", x.sizes());

  const int64_t pitch = W + 2 * pad, rows_p = H + 2 * pad + 1, plane = rows_p * pitch;
  const int64_t H_o = (H - 1) / stride + 1, W_o = (W - 1) / stride + 1;
  // outputs per channel: on the padded pitch at stride 1, packed at stride 2
  const int64_t run = stride == 1 ? H_o * pitch : H_o * W_o;
  at::Tensor out = at::empty({B, K * n, H_o, W_o}, x.options());
  const float* xs = x.data_ptr<float>();
  const float* wk = weight.data_ptr<float>();
  const float* scale = affine.data_ptr<float>();
  const float* shift = scale + K * n;
  const float* slope = shift + K * n;
  float* op = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, run * K));

  at::parallel_for(0, B * n, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> padded(plane), acc(run), fused(run, 0.f);
    for (int64_t bj = begin; bj < end; ++bj) {
      const int64_t b = bj / n, j = bj % n;
      pad_plane(xs + bj * H * W, padded.data(), H, W, rows_p, pitch, pad, pad);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t d = dilations[k];
        const float* w = wk + (k * n + j) * 9;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t i = 0; i < 3; ++i) {
          for (int64_t l = 0; l < 3; ++l) {
            // the tap's input for output (0, 0), in padded coordinates
            const float* src = padded.data() + (pad + (i - 1) * d) * pitch + pad + (l - 1) * d;
            if (stride == 1) {
              axpy(acc.data(), src, run, w[i * 3 + l]);
            } else {
              for (int64_t h = 0; h < H_o; ++h) {
                const float* row = src + 2 * h * pitch;
                float* a = acc.data() + h * W_o;
                for (int64_t v = 0; v < W_o; ++v) a[v] += w[i * 3 + l] * row[2 * v];
              }
            }
          }
        }
        // hierarchical feature fusion: the running sum over the branches so far
        if (hff && k > 0)
          for (int64_t r = 0; r < run; ++r) fused[r] += acc[r];
        else
          std::copy(acc.begin(), acc.end(), fused.begin());
        const int64_t c = k * n + j;
        const float s = scale[c], t = shift[c], a = slope[c];
        const int64_t row_stride = stride == 1 ? pitch : W_o;
        float* o = op + (b * K * n + c) * H_o * W_o;
        for (int64_t h = 0; h < H_o; ++h) {
          const float* __restrict__ f = fused.data() + h * row_stride;
          float* __restrict__ dst = o + h * W_o;
          for (int64_t v = 0; v < W_o; ++v) dst[v] = prelu(s * f[v] + t, a);
        }
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "eesp_pyramid(Tensor x, Tensor weight, int[] dilations, int stride, Tensor affine, "
      "bool hff) -> Tensor",
      &eesp_pyramid);
}
