// Fused CPU inference kernel of the DiCE unit: DimConv + DimFuse with every BN folded.
//
// For x of shape (B, C, H, W), one call computes
//   y_c = channel-wise conv (a kernel per channel over the (H, W) plane; BN in weight and bias)
//   y_h = height-wise conv  (a kernel per row over the (C, W) plane)
//   y_w = width-wise conv   (a kernel per column over the (C, H) plane)
//   f   = PReLU(l_s + l_c PReLU(y_c) + l_h PReLU(s_h y_h + t_h) + l_w PReLU(s_w y_w + t_w))
//   out = PReLU(depth-wise 3x3 conv(f) + b_s) * sigmoid(ReLU(mean_hw(f) G_in) G_out)
// which is DiCE's folded inference forward (src/kernels/dice). Off the build size (H_b, W_b), the
// height-wise branch runs on x resized to H_b rows (x_height, resized by the caller) and its output
// is resized back to H rows here (resize_height, (H, H_b)); likewise the width-wise branch with
// W_b columns. The eager path makes about twenty ATen calls per unit (four oneDNN convolutions
// among them), each with a fixed cost well above its arithmetic at these map sizes; here the three
// responses and the fusion never leave per-plane buffers.
//
// Layout: each branch reads zero-padded copies of its input's planes (PaddedPlanes; one set shared
// by the three branches at the build size), so that every tap is one contiguous run: outputs are
// computed on the padded row pitch (the pad columns of each row discarded), and a tap at offset
// (dr, dw) reads the run shifted by dr * pitch + dw. No tensor but the output is allocated: fresh
// multi-megabyte allocations page-fault on every call. Weights that vary along the run (the
// height-wise kernel per row, the width-wise kernel per column) come pre-expanded to the run's
// length. Every operand's kind, rank and sizes are checked before any memory is read.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h

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

// The input of one dimension-wise branch: the planes of a (B, C, rows, cols) tensor as
// zero-padded copies, kept in a ring of the `halo` channels either side of the current one (the
// height- and width-wise kernels also slide along the channels). The branch's outputs are
// computed on the padded pitch: `run` values per channel, of which each row's first `cols` count.
class PaddedPlanes {
 public:
  PaddedPlanes(const float* data, int64_t C, int64_t rows, int64_t cols, int64_t halo,
               int64_t pad_rows, int64_t pad_cols)
      : data_(data), C_(C), rows_(rows), cols_(cols), pad_rows_(pad_rows), pad_cols_(pad_cols),
        pitch(cols + 2 * pad_cols),
        // one spare row: the last output row's pad columns read past the last padded row
        plane_(pitch * (rows + 2 * pad_rows + 1)), run(rows * pitch), slots_(2 * halo + 1),
        ring_(slots_ * plane_), zeros_(plane_, 0.f), held_(slots_, -1) {}

  // channel c + dc's padded plane, at output (0, 0) shifted by (dr, dw)
  const float* tap(int64_t b, int64_t c, int64_t dr, int64_t dw) {
    return plane(b, c) + (pad_rows_ + dr) * pitch + pad_cols_ + dw;
  }

  const int64_t pitch, plane_, run;

 private:
  const float* plane(int64_t b, int64_t c) {
    if (c < 0 || c >= C_) return zeros_.data();
    const int64_t slot = c % slots_;
    float* dst = ring_.data() + slot * plane_;
    if (held_[slot] != b * C_ + c) {
      pad_plane(data_ + (b * C_ + c) * rows_ * cols_, dst, rows_, cols_, plane_ / pitch, pitch,
                pad_rows_, pad_cols_);
      held_[slot] = b * C_ + c;
    }
    return dst;
  }

  const float* data_;
  const int64_t C_, rows_, cols_, pad_rows_, pad_cols_;
  const int64_t slots_;
  std::vector<float> ring_, zeros_;
  std::vector<int64_t> held_;  // the (b, c) index each slot holds
};

// The non-zero entries of each row of a resize matrix (a few per row: interpolation or pooling).
using SparseRows = std::vector<std::vector<std::pair<int64_t, float>>>;

SparseRows sparse_rows(const at::Tensor& matrix) {
  const int64_t n_out = matrix.size(0), n_in = matrix.size(1);
  const float* m = matrix.data_ptr<float>();
  SparseRows rows(n_out);
  for (int64_t i = 0; i < n_out; ++i)
    for (int64_t j = 0; j < n_in; ++j)
      if (m[i * n_in + j] != 0.f) rows[i].emplace_back(j, m[i * n_in + j]);
  return rows;
}

at::Tensor dice_forward(const at::Tensor& x, const at::Tensor& x_height, const at::Tensor& x_width,
                        const at::Tensor& resize_height, const at::Tensor& resize_width,
                        const at::Tensor& weight_channel, const at::Tensor& weight_height,
                        const at::Tensor& weight_width, const at::Tensor& per_channel,
                        const at::Tensor& weight_spatial, const at::Tensor& gate_in,
                        const at::Tensor& gate_out, int64_t kernel_size, int64_t dil_channel,
                        int64_t dil_height, int64_t dil_width) {
  constexpr const char* kOp = "dice_forward";
  check_operand(kOp, x, "x", 4, "(B, C, H, W)");
  check_operand(kOp, x_height, "x_height", 4, "(B, C, H_b, W)");
  check_operand(kOp, x_width, "x_width", 4, "(B, C, H, W_b)");
  check_operand(kOp, resize_height, "resize_height", 2, "(H, H_b)");
  check_operand(kOp, resize_width, "resize_width", 2, "(W, W_b)");
  check_operand(kOp, weight_channel, "weight_channel", 2, "(C, k * k)");
  check_operand(kOp, weight_height, "weight_height", 3, "(k * k, H_b, padded width)");
  check_operand(kOp, weight_width, "weight_width", 3, "(k * k, H, padded width)");
  check_operand(kOp, per_channel, "per_channel", 2, "(15, C)");
  check_operand(kOp, weight_spatial, "weight_spatial", 2, "(C, 9)");
  check_operand(kOp, gate_in, "gate_in", 2, "(C, hidden)");
  check_operand(kOp, gate_out, "gate_out", 2, "(hidden, C)");
  TORCH_CHECK(kernel_size % 2 == 1 && kernel_size > 0, kOp, ": kernel_size must be odd and ",
              "positive, got ", kernel_size);
  TORCH_CHECK(dil_channel >= 1 && dil_height >= 1 && dil_width >= 1, kOp,
              ": dilations must be positive, got (", dil_channel, ", ", dil_height, ", ",
              dil_width, ")");
  const int64_t k = kernel_size, kk = k * k, half = (k - 1) / 2;
  const int64_t dil_max = std::max({dil_channel, dil_height, dil_width});
  TORCH_CHECK(half <= kMaxReach / dil_max, kOp, ": kernel_size ", k, " with dilations (",
              dil_channel, ", ", dil_height, ", ", dil_width, ") reaches past ", kMaxReach,
              " pixels");
  const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(C >= 1 && H >= 1 && W >= 1, kOp, ": x needs a channel, a row and a column, got ",
              "shape ", x.sizes());
  const int64_t H_b = x_height.size(2), W_b = x_width.size(3), hidden = gate_in.size(1);
  TORCH_CHECK(H_b >= 1 && W_b >= 1, kOp, ": x_height and x_width need a row and a column, got ",
              "shapes ", x_height.sizes(), " and ", x_width.sizes());
  check_shape(kOp, x_height, "x_height", {B, C, H_b, W}, "(B, C, H_b, W), B, C, W of x ",
              x.sizes());
  check_shape(kOp, x_width, "x_width", {B, C, H, W_b}, "(B, C, H, W_b), B, C, H of x ", x.sizes());
  check_shape(kOp, resize_height, "resize_height", {H, H_b}, "(H, H_b), H of x ", x.sizes(),
              ", H_b of x_height ", x_height.sizes());
  check_shape(kOp, resize_width, "resize_width", {W, W_b}, "(W, W_b), W of x ", x.sizes(),
              ", W_b of x_width ", x_width.sizes());
  check_shape(kOp, weight_channel, "weight_channel", {C, kk}, "(C, k * k), C of x ", x.sizes(),
              ", k = kernel_size ", k);
  // At the build size the caller passes x itself as x_height and x_width, and the three branches
  // share one set of padded planes (padded for all of them); else each branch has its own.
  const bool shared = x_height.is_same(x) && x_width.is_same(x);
  const int64_t pitch_shared = W + 2 * half * std::max(dil_channel, dil_height);
  const int64_t pitch_height = shared ? pitch_shared : W + 2 * half * dil_height;
  const int64_t pitch_width = shared ? pitch_shared : W_b;
  // where the padded row lengths come from, for the messages
  const char* pitch_h =
      shared ? "W + (k - 1) max(dil_channel, dil_height) (x_height, x_width are x)"
             : "W + (k - 1) dil_height";
  const char* pitch_w = shared ? pitch_h : "W_b";
  check_shape(kOp, weight_height, "weight_height", {kk, H_b, pitch_height},
              "(k * k, H_b, padded width), padded width ", pitch_h, ", k = kernel_size ", k,
              ", dilations (", dil_channel, ", ", dil_height, ", ", dil_width, "), W of x ",
              x.sizes(), ", H_b of x_height ", x_height.sizes());
  check_shape(kOp, weight_width, "weight_width", {kk, H, pitch_width},
              "(k * k, H, padded width), padded width ", pitch_w, ", k = kernel_size ", k,
              ", dilations (", dil_channel, ", ", dil_height, ", ", dil_width, "), H, W of x ",
              x.sizes(), ", W_b of x_width ", x_width.sizes());
  check_shape(kOp, per_channel, "per_channel", {kRows, C}, "(15, C), C of x ", x.sizes());
  check_shape(kOp, weight_spatial, "weight_spatial", {C, 9}, "(C, 9), C of x ", x.sizes());
  check_shape(kOp, gate_in, "gate_in", {C, hidden}, "(C, hidden), C of x ", x.sizes());
  check_shape(kOp, gate_out, "gate_out", {hidden, C}, "(hidden, C), hidden of gate_in ",
              gate_in.sizes(), ", C of x ", x.sizes());
  const int64_t pitch_f = W + 2, plane_f = (H + 3) * pitch_f, run_f = H * pitch_f;

  const int64_t HW = H * W;
  at::Tensor out = at::empty({B, C, H, W}, x.options());
  std::vector<float> mean(B * C), gate(B * C);
  // the resizes back to (H, W), used off the build size only
  const auto back_height = shared ? SparseRows() : sparse_rows(resize_height);  // H_b -> H rows
  const auto back_width = shared ? SparseRows() : sparse_rows(resize_width);    // W_b -> W columns
  float* op = out.data_ptr<float>();
  const float* wc = weight_channel.data_ptr<float>();
  const float* wh = weight_height.data_ptr<float>();
  const float* ww = weight_width.data_ptr<float>();
  const float* pc = per_channel.data_ptr<float>();
  const float* ws = weight_spatial.data_ptr<float>();
  auto param = [pc, C](Row r, int64_t c) { return pc[r * C + c]; };
  // planes per task: enough work to cover a task's start-up, and still every thread busy
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, HW));

  // DimConv and the local fusion, one (b, c) plane at a time; f goes to `out` for now
  at::parallel_for(0, B * C, grain, [&](int64_t begin, int64_t end) {
    std::vector<std::unique_ptr<PaddedPlanes>> owned;
    auto planes_of = [&](const at::Tensor& t, int64_t halo, int64_t pad_rows, int64_t pad_cols) {
      owned.push_back(std::make_unique<PaddedPlanes>(t.data_ptr<float>(), C, t.size(2), t.size(3),
                                                     halo, pad_rows, pad_cols));
      return owned.back().get();
    };
    PaddedPlanes *channel, *height, *width;
    if (shared) {
      channel = height = width =
          planes_of(x, half * std::max(dil_height, dil_width),
                    half * std::max(dil_channel, dil_width), (pitch_shared - W) / 2);
    } else {
      channel = planes_of(x, 0, half * dil_channel, half * dil_channel);
      height = planes_of(x_height, half * dil_height, 0, half * dil_height);
      width = planes_of(x_width, half * dil_width, half * dil_width, 0);
    }
    std::vector<float> acc_c(channel->run), acc_h(height->run), acc_w(width->run);
    std::vector<float> planes(shared ? 0 : 3 * HW), fused(std::max(channel->run, HW));
    float* yc = planes.data();
    float* yh = yc + HW;
    float* yw = yh + HW;
    const int64_t run_c = channel->run, run_h = height->run, run_w = width->run;
    for (int64_t bc = begin; bc < end; ++bc) {
      const int64_t b = bc / C, c = bc % C;
      std::fill(acc_c.begin(), acc_c.end(), param(kBiasChannel, c));
      std::fill(acc_h.begin(), acc_h.end(), 0.f);
      std::fill(acc_w.begin(), acc_w.end(), 0.f);
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t t = i * k + j, oi = i - half, oj = j - half;
          axpy(acc_c.data(), channel->tap(b, c, oi * dil_channel, oj * dil_channel), run_c,
               wc[c * kk + t]);
          vaxpy(acc_h.data(), wh + t * run_h,
                height->tap(b, c + oi * dil_height, 0, oj * dil_height), run_h);
          vaxpy(acc_w.data(), ww + t * run_w, width->tap(b, c + oi * dil_width, oj * dil_width, 0),
                run_w);
        }
      }
      // the three responses on one grid: at the build size they already share the padded
      // pitch; else each goes onto the (H, W) grid, the height- and width-wise ones resized back
      const float *yc = acc_c.data(), *yh = acc_h.data(), *yw = acc_w.data();
      int64_t pitch = channel->pitch;
      if (!shared) {
        float* rows_c = planes.data();
        float* rows_h = rows_c + HW;
        float* rows_w = rows_h + HW;
        for (int64_t h = 0; h < H; ++h) {
          std::memcpy(rows_c + h * W, yc + h * channel->pitch, sizeof(float) * W);
          float* row_h = rows_h + h * W;
          std::fill(row_h, row_h + W, 0.f);
          for (const auto& [r, a] : back_height[h]) axpy(row_h, yh + r * height->pitch, W, a);
          const float* src_w = yw + h * width->pitch;
          float* row_w = rows_w + h * W;
          for (int64_t w = 0; w < W; ++w) {
            float v = 0.f;
            for (const auto& [q, a] : back_width[w]) v += a * src_w[q];
            row_w[w] = v;
          }
        }
        yc = rows_c, yh = rows_h, yw = rows_w, pitch = W;
      }
      const float a_c = param(kSlopeChannel, c);
      const float s_h = param(kScaleHeight, c), t_h = param(kShiftHeight, c);
      const float a_h = param(kSlopeHeight, c);
      const float s_w = param(kScaleWidth, c), t_w = param(kShiftWidth, c);
      const float a_w = param(kSlopeWidth, c);
      const float l_c = param(kLocalChannel, c), l_h = param(kLocalHeight, c);
      const float l_w = param(kLocalWidth, c), l_s = param(kLocalShift, c);
      const float a_l = param(kSlopeLocal, c);
      const int64_t n = H * pitch;
      const float* __restrict__ y_c = yc;
      const float* __restrict__ y_h = yh;
      const float* __restrict__ y_w = yw;
      float* __restrict__ out_f = fused.data();
      for (int64_t r = 0; r < n; ++r) {
        const float v = l_s + l_c * prelu(y_c[r], a_c) + l_h * prelu(s_h * y_h[r] + t_h, a_h) +
                        l_w * prelu(s_w * y_w[r] + t_w, a_w);
        out_f[r] = prelu(v, a_l);
      }
      float* f = op + bc * HW;
      for (int64_t h = 0; h < H; ++h)  // drop the pad columns
        std::memcpy(f + h * W, fused.data() + h * pitch, sizeof(float) * W);
      double sum = 0.0;  // a loop of its own: a reduction in the loop above would keep it scalar
      for (int64_t r = 0; r < HW; ++r) sum += f[r];
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
      "dice_forward(Tensor x, Tensor x_height, Tensor x_width, Tensor resize_height, "
      "Tensor resize_width, Tensor weight_channel, Tensor weight_height, Tensor weight_width, "
      "Tensor per_channel, Tensor weight_spatial, Tensor gate_in, Tensor gate_out, "
      "int kernel_size, int dil_channel, int dil_height, int dil_width) -> Tensor",
      &dice_forward);
}
