// Fused CPU inference kernel of the DiCE unit: DimConv + DimFuse with every BN folded.
//
// For x of shape (B, C, H, W) at the unit's build size, one call computes
//   y_c = channel-wise conv (a kernel per channel over the (H, W) plane; BN in weight and bias)
//   y_h = height-wise conv  (a kernel per row h over the (C, W) plane)
//   y_w = width-wise conv   (a kernel per column w over the (C, H) plane)
//   f   = PReLU(l_s + l_c PReLU(y_c) + l_h PReLU(s_h y_h + t_h) + l_w PReLU(s_w y_w + t_w))
//   out = PReLU(depth-wise 3x3 conv(f) + b_s) * sigmoid(ReLU(mean_hw(f) G_in) G_out)
// which is DiCE._folded_forward of src/ops/dice.py. That eager path makes about twenty ATen calls
// per unit (four oneDNN convolutions among them), each with a fixed cost well above its arithmetic
// at these map sizes; here the three responses and the fusion never leave a row buffer.
//
// Layout: each input plane is copied into a zero-padded (H + 2 p_h + 1, W + 2 p_w) buffer (a ring
// of them per thread, as the height- and width-wise kernels also read the neighbouring channels),
// so that every tap of every branch is one contiguous run: outputs are computed on the padded row
// pitch (W + 2 p_w columns per row, the last 2 p_w of each row discarded), and a tap at offset
// (dh, dw) reads the run shifted by dh * pitch + dw. No tensor but the output is allocated: fresh
// multi-megabyte allocations page-fault on every call. Weights that vary along the run (the height-
// wise kernel per row, the width-wise kernel per column) come pre-expanded to the run's length.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"

namespace {

using lightnets::axpy;
using lightnets::check_float;
using lightnets::pad_plane;
using lightnets::prelu;

// Rows of the (15, C) per-channel table.
enum Row {
  kBiasChannel, kSlopeChannel,
  kScaleHeight, kShiftHeight, kSlopeHeight,
  kScaleWidth, kShiftWidth, kSlopeWidth,
  kLocalChannel, kLocalHeight, kLocalWidth, kLocalShift, kSlopeLocal,
  kBiasSpatial, kSlopeSpatial,
  kRows
};

// y[r] += a[r] * x[r], r < n
inline void vaxpy(float* __restrict__ y, const float* __restrict__ a, const float* __restrict__ x,
                  int64_t n) {
  for (int64_t r = 0; r < n; ++r) y[r] += a[r] * x[r];
}

at::Tensor dice_forward(const at::Tensor& x, const at::Tensor& weight_channel,
                        const at::Tensor& weight_height, const at::Tensor& weight_width,
                        const at::Tensor& per_channel, const at::Tensor& weight_spatial,
                        const at::Tensor& gate_in, const at::Tensor& gate_out,
                        int64_t kernel_size, int64_t dil_channel, int64_t dil_height,
                        int64_t dil_width) {
  TORCH_CHECK(x.dim() == 4, "x must be (B, C, H, W), got ", x.sizes());
  TORCH_CHECK(kernel_size % 2 == 1 && kernel_size > 0, "kernel_size must be odd, got ",
              kernel_size);
  TORCH_CHECK(dil_channel >= 1 && dil_height >= 1 && dil_width >= 1,
              "dilations must be positive, got (", dil_channel, ", ", dil_height, ", ", dil_width,
              ")");
  TORCH_CHECK(gate_in.dim() == 2, "gate_in must be (C, C // 4), got ", gate_in.sizes());
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t k = kernel_size, kk = k * k, half = (k - 1) / 2, hidden = gate_in.size(1);
  // padding of each axis: the largest reach of the branches that slide along it
  const int64_t pad_c = half * std::max(dil_height, dil_width);
  const int64_t pad_h = half * std::max(dil_channel, dil_width);
  const int64_t pad_w = half * std::max(dil_channel, dil_height);
  const int64_t pitch = W + 2 * pad_w, rows_p = H + 2 * pad_h + 1, plane = rows_p * pitch;
  const int64_t run = H * pitch;  // outputs per channel on the padded pitch
  const int64_t pitch_f = W + 2, plane_f = (H + 3) * pitch_f, run_f = H * pitch_f;
  check_float(x, "x", {B, C, H, W});
  check_float(weight_channel, "weight_channel", {C, kk});
  check_float(weight_height, "weight_height", {kk, run});
  check_float(weight_width, "weight_width", {kk, run});
  check_float(per_channel, "per_channel", {kRows, C});
  check_float(weight_spatial, "weight_spatial", {C, 9});
  check_float(gate_in, "gate_in", {C, hidden});
  check_float(gate_out, "gate_out", {hidden, C});

  const int64_t HW = H * W;
  at::Tensor out = at::empty({B, C, H, W}, x.options());
  std::vector<float> mean(B * C), gate(B * C);
  const float* xs = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* wc = weight_channel.data_ptr<float>();
  const float* wh = weight_height.data_ptr<float>();
  const float* ww = weight_width.data_ptr<float>();
  const float* pc = per_channel.data_ptr<float>();
  const float* ws = weight_spatial.data_ptr<float>();
  auto param = [pc, C](Row r, int64_t c) { return pc[r * C + c]; };
  // planes per task: enough work to cover a task's start-up, and still every thread busy
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, run));

  // DimConv and the local fusion, one (b, c) plane at a time; f goes to `out` for now
  at::parallel_for(0, B * C, grain, [&](int64_t begin, int64_t end) {
    // padded input planes of channels c - p_c .. c + p_c, kept in a ring as c advances
    const int64_t slots = 2 * pad_c + 1;
    std::vector<float> ring(slots * plane), zeros(plane, 0.f), buffers(4 * run);
    std::vector<int64_t> held(slots, -1);  // the (b, c) index each slot holds
    auto padded = [&](int64_t b, int64_t c) -> const float* {
      if (c < 0 || c >= C) return zeros.data();
      const int64_t slot = c % slots;
      float* dst = ring.data() + slot * plane;
      if (held[slot] != b * C + c) {
        pad_plane(xs + (b * C + c) * HW, dst, H, W, rows_p, pitch, pad_h, pad_w);
        held[slot] = b * C + c;
      }
      return dst;
    };
    float* yc = buffers.data();
    float* yh = yc + run;
    float* yw = yh + run;
    float* fused = yw + run;
    for (int64_t bc = begin; bc < end; ++bc) {
      const int64_t b = bc / C, c = bc % C;
      // channel c + dc's padded plane, at output (0, 0) shifted by (dh, dw)
      auto tap = [&](int64_t dc, int64_t dh, int64_t dw) {
        return padded(b, c + dc) + (pad_h + dh) * pitch + pad_w + dw;
      };
      std::fill(yc, yc + run, param(kBiasChannel, c));
      std::fill(yh, yh + run, 0.f);
      std::fill(yw, yw + run, 0.f);
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t t = i * k + j, oi = i - half, oj = j - half;
          axpy(yc, tap(0, oi * dil_channel, oj * dil_channel), run, wc[c * kk + t]);
          vaxpy(yh, wh + t * run, tap(oi * dil_height, 0, oj * dil_height), run);
          vaxpy(yw, ww + t * run, tap(oi * dil_width, oj * dil_width, 0), run);
        }
      }
      const float a_c = param(kSlopeChannel, c);
      const float s_h = param(kScaleHeight, c), t_h = param(kShiftHeight, c);
      const float a_h = param(kSlopeHeight, c);
      const float s_w = param(kScaleWidth, c), t_w = param(kShiftWidth, c);
      const float a_w = param(kSlopeWidth, c);
      const float l_c = param(kLocalChannel, c), l_h = param(kLocalHeight, c);
      const float l_w = param(kLocalWidth, c), l_s = param(kLocalShift, c);
      const float a_l = param(kSlopeLocal, c);
      for (int64_t r = 0; r < run; ++r) {
        const float v = l_s + l_c * prelu(yc[r], a_c) + l_h * prelu(s_h * yh[r] + t_h, a_h) +
                        l_w * prelu(s_w * yw[r] + t_w, a_w);
        fused[r] = prelu(v, a_l);
      }
      // drop the pitch's pad columns; the channel mean on the way
      float* dst = op + bc * HW;
      double sum = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        const float* row = fused + h * pitch;
        std::memcpy(dst + h * W, row, sizeof(float) * W);
        float row_sum = 0.f;
        for (int64_t w = 0; w < W; ++w) row_sum += row[w];
        sum += row_sum;
      }
      mean[bc] = static_cast<float>(sum / HW);
    }
  });

  // the channel gate, sigmoid(ReLU(mean G_in) G_out): (B, C) -> (B, C)
  const float* gi = gate_in.data_ptr<float>();
  const float* go = gate_out.data_ptr<float>();
  std::vector<float> z(hidden);
  for (int64_t b = 0; b < B; ++b) {
    std::fill(z.begin(), z.end(), 0.f);
    for (int64_t c = 0; c < C; ++c) axpy(z.data(), gi + c * hidden, hidden, mean[b * C + c]);
    float* g = gate.data() + b * C;
    std::fill(g, g + C, 0.f);
    for (int64_t q = 0; q < hidden; ++q) axpy(g, go + q * C, C, std::max(z[q], 0.f));
    for (int64_t c = 0; c < C; ++c) g[c] = 1.f / (1.f + std::exp(-g[c]));
  }

  // DimFuse's depth-wise 3x3 convolution with its PReLU, times the gate, over f in place
  at::parallel_for(0, B * C, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> f(plane_f), acc(run_f);
    for (int64_t bc = begin; bc < end; ++bc) {
      const int64_t c = bc % C;
      float* o = op + bc * HW;
      pad_plane(o, f.data(), H, W, H + 3, pitch_f, 1, 1);
      std::fill(acc.begin(), acc.end(), param(kBiasSpatial, c));
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j)
          axpy(acc.data(), f.data() + i * pitch_f + j, run_f, ws[c * 9 + i * 3 + j]);
      const float a_s = param(kSlopeSpatial, c), g = gate[bc];
      for (int64_t h = 0; h < H; ++h) {
        const float* __restrict__ a = acc.data() + h * pitch_f;
        float* __restrict__ row = o + h * W;
        for (int64_t w = 0; w < W; ++w) row[w] = prelu(a[w], a_s) * g;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "dice_forward(Tensor x, Tensor weight_channel, Tensor weight_height, Tensor weight_width, "
      "Tensor per_channel, Tensor weight_spatial, Tensor gate_in, Tensor gate_out, "
      "int kernel_size, int dil_channel, int dil_height, int dil_width) -> Tensor",
      &dice_forward);
}
