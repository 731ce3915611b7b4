// The PRU's recurrence over a whole sequence, forward and backward through time, in one call each
// (src/ops/pru_recurrence.py). For T steps of B rows, M = g w hidden units and gates (f, g, i, o):
//   a_t = P_t + GLT(h_{t-1}) + b,  c_t = s(a_f) c_{t-1} + s(a_i) tanh(a_g),  h_t = s(a_o) tanh(c_t)
// where group j of the GLT is h_{t-1}[:, j w : (j + 1) w] @ W_j, W_j (w, 4w), gate q's block its
// columns q w .. (q + 1) w.
//
// The work of a step is cut into tasks (j, k-chunk): a task multiplies h_{t-1}'s group j by the
// columns of W_j that feed its k-chunk of all four gates, then runs the cell equations on that
// chunk, so the products' outputs never leave the cache and a step is one parallel region. The
// matrices the tasks multiply by (W_j's columns forward, its rows backward) are packed once per
// call into MKL's internal layout (cblas_sgemm_pack): at B of 10 to 80 rows, a plain GEMM call
// re-packs the whole weight every step, which costs about as much as the product.
//
// Backward, task (j, k-chunk) of step t first forms the recurrent gradient of its chunk of h_t,
// dG_{t+1, j} @ W_j^T[:, chunk], then the cell's gradient. The weight gradient is one product over
// all T B rows after the loop, dW_j = [h_0; h_1 .. h_{T-1}]_j^T dG_j, and the bias gradient a sum
// of dG over the rows. Every product runs on one thread over a fixed split of the sizes, and every
// sum in a fixed order, so no result depends on the thread count.
//
// The products are MKL's, as linked into PyTorch (the symbols are declared weak: a PyTorch
// without MKL still loads this library, and `pru_recurrence_available` says false). float32 only.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "common.h"

#ifdef LIGHTNETS_AVX512
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif

extern "C" {
// MKL's CBLAS (LP64: MKL_INT is int), exported by PyTorch's CPU library where it links MKL
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc)
    __attribute__((weak));
// BLAS's (column-major) sgemm: PyTorch exports MKL's, not cblas_sgemm
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
// by value: PyTorch's lower-case mkl_set_num_threads_local is the Fortran entry (a pointer)
int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));
}

namespace {

using lightnets::check_dense;
using lightnets::exp_nonpositive;

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
constexpr int64_t kGates = 4;
// a task's share of a group's k: 64 keeps a task's four gate rows of B in the L1 cache at B = 80
constexpr int64_t kChunk = 64;
// columns of a weight-gradient task: large enough for MKL's blocking, small enough for balance
constexpr int64_t kGradChunk = 128;

bool mkl_available() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr && sgemm_ != nullptr &&
         MKL_Set_Num_Threads_Local != nullptr;
}

// MKL runs on the calling thread inside the scope: the tasks are the parallelism, and MKL's own
// split (which would depend on the thread count) never happens
// Row-major C (m, n) = alpha A (m, k) B (k, n) + beta C, A or B read transposed when ta or tb: as
// column-major, C^T = B^T A^T
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  const char trans_b = tb ? 'T' : 'N', trans_a = ta ? 'T' : 'N';
  sgemm_(&trans_b, &trans_a, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
}

struct OneMklThread {
  int previous;
  OneMklThread() : previous(MKL_Set_Num_Threads_Local(1)) {}
  ~OneMklThread() { MKL_Set_Num_Threads_Local(previous); }
};

__attribute__((always_inline)) inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  const float s = 1.f / (1.f + e);
  return x >= 0.f ? s : e * s;  // e / (1 + e) for x < 0: no 1 - s cancellation
}

// Cephes' tanhf: a polynomial below 0.625 (where 1 - e^{-2|x|} would cancel), else from exp
__attribute__((always_inline)) inline float tanh_(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  const float p =
      ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
        1.33314422036e-1f) * z - 3.33332819422e-1f) * z * a + a;
  const float e = exp_nonpositive(-2.f * a);
  const float r = a < 0.625f ? p : (1.f - e) / (1.f + e);
  return std::copysign(r, x);
}

// The cell equations along n consecutive units of one row: pre (gate q at pre + q M), the
// product (gate q at cx + q n), the bias (gate q at bias + q w); the activated gates saved for
// the backward when Save.
template <bool Save>
__attribute__((always_inline)) inline void cell_forward(
    const float* __restrict__ pre, const float* __restrict__ cx, const float* __restrict__ bias,
    const float* __restrict__ c_prev, float* __restrict__ c_next, float* __restrict__ h,
    float* __restrict__ saved, int64_t n, int64_t M, int64_t w) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float f = sigmoid(pre[k] + cx[k] + bias[k]);
    const float gg = tanh_(pre[M + k] + cx[n + k] + bias[w + k]);
    const float i = sigmoid(pre[2 * M + k] + cx[2 * n + k] + bias[2 * w + k]);
    const float o = sigmoid(pre[3 * M + k] + cx[3 * n + k] + bias[3 * w + k]);
    const float c = f * c_prev[k] + i * gg;
    c_next[k] = c;
    h[k] = o * tanh_(c);
    if constexpr (Save) {
      saved[k] = f;
      saved[M + k] = gg;
      saved[2 * M + k] = i;
      saved[3 * M + k] = o;
    }
  }
}

// The cell's gradient along n consecutive units of one row, from dL/dh_t (the sum of dh_out,
// dh_rec and dh_last) and the carried dL/dc_t (updated in place to dL/dc_{t-1}): the gate
// pre-activations' gradients into dp (gate q at dp + q M) and dg (gate q at dg + q w).
__attribute__((always_inline)) inline void cell_backward(
    const float* __restrict__ dh_out, const float* __restrict__ dh_rec,
    const float* __restrict__ dh_last, const float* __restrict__ gates,
    const float* __restrict__ c, const float* __restrict__ c_prev, float* __restrict__ dc,
    float* __restrict__ dp, float* __restrict__ dg, int64_t n, int64_t M, int64_t w) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float dh = dh_out[k] + dh_rec[k] + dh_last[k];
    const float f = gates[k], gg = gates[M + k], i = gates[2 * M + k], o = gates[3 * M + k];
    const float tc = tanh_(c[k]);
    const float dct = dc[k] + dh * o * (1.f - tc * tc);
    const float d_f = dct * c_prev[k] * f * (1.f - f);
    const float d_g = dct * i * (1.f - gg * gg);
    const float d_i = dct * gg * i * (1.f - i);
    const float d_o = dh * tc * o * (1.f - o);
    dc[k] = dct * f;
    dp[k] = d_f;
    dp[M + k] = d_g;
    dp[2 * M + k] = d_i;
    dp[3 * M + k] = d_o;
    dg[k] = d_f;
    dg[w + k] = d_g;
    dg[2 * w + k] = d_i;
    dg[3 * w + k] = d_o;
  }
}

struct Sizes {
  int64_t T, B, M, g, w, chunks;
  int64_t tasks() const { return g * chunks; }
  int64_t k0(int64_t task) const { return (task % chunks) * kChunk; }
  int64_t n(int64_t task) const { return std::min(kChunk, w - k0(task)); }
};

// g and w of the (g, w, 4w) weight, checked with the (., ., 4, M) tensor `gates` it goes with
std::pair<int64_t, int64_t> check_weight(const char* op, const at::Tensor& weight,
                                         const at::Tensor& gates, const char* gates_name) {
  TORCH_CHECK(mkl_available(), op, ": needs PyTorch built with MKL");
  lightnets::check_operand(op, weight, "weight", 3, "(g, w, 4w)");
  const int64_t g = weight.size(0), w = weight.size(1);
  TORCH_CHECK(g > 0 && w > 0 && weight.size(2) == kGates * w && gates.size(2) == kGates &&
                  gates.size(3) == g * w,
              op, ": ", gates_name, " has shape ", gates.sizes(), " and weight ", weight.sizes(),
              ", expected ", gates_name, " (T, B, 4, M) and weight (g, M/g, 4M/g)");
  // MKL's LP64 interface takes int sizes
  TORCH_CHECK(gates.numel() < std::numeric_limits<int>::max(), op, ": ", gates_name,
              " of shape ", gates.sizes(), " is too large for MKL's 32-bit sizes");
  return {g, w};
}

// the sizes of the (T, B, 4, M) tensor `inputs` (the pre-activations or, backward, their
// activated values, named `name`) and of the operands that go with it
Sizes check_operands(const char* op, const at::Tensor& inputs, const char* name,
                     const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     const at::Tensor& h0, const at::Tensor& c0) {
  lightnets::check_operand(op, inputs, name, 4, "(T, B, 4, M)");
  const auto [g, w] = check_weight(op, weight, inputs, name);
  const int64_t T = inputs.size(0), B = inputs.size(1), M = g * w;
  if (bias) {
    lightnets::check_operand(op, *bias, "bias", 2, "(g, 4w)");
    lightnets::check_shape(op, *bias, "bias", {g, kGates * w}, "(g, 4w) of weight ",
                           weight.sizes());
  }
  for (const auto& [t, name] : {std::pair{&h0, "h0"}, std::pair{&c0, "c0"}}) {
    lightnets::check_operand(op, *t, name, 2, "(B, M)");
    lightnets::check_shape(op, *t, name, {B, M}, "(B, M) of ", inputs.sizes());
  }
  return {T, B, M, g, w, (w + kChunk - 1) / kChunk};
}

// One packed matrix per task: forward W_j's columns {q w + k0 .. q w + k0 + n : q < 4}
// gathered into a (w, 4n) matrix; backward W_j^T's columns k0 .. k0 + n, (4w, n).
std::vector<std::vector<float>> pack_weights(const float* W, const Sizes& s, bool backward) {
  std::vector<std::vector<float>> packs(s.tasks());
  const int64_t w = s.w, four_w = kGates * w;
  at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
    OneMklThread one;
    std::vector<float> gathered;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t j = task / s.chunks, k0 = s.k0(task), n = s.n(task);
      const float* Wj = W + j * w * four_w;
      if (backward) {
        packs[task].resize(cblas_sgemm_pack_get_size(kBMatrix, s.B, n, four_w) / sizeof(float) + 1);
        // B = (rows k0 .. k0 + n of W_j)^T
        cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, s.B, n, four_w, 1.f, Wj + k0 * four_w,
                         four_w, packs[task].data());
      } else {
        gathered.resize(w * kGates * n);
        for (int64_t r = 0; r < w; ++r)
          for (int64_t q = 0; q < kGates; ++q)
            std::copy_n(Wj + r * four_w + q * w + k0, n, gathered.data() + (r * kGates + q) * n);
        packs[task].resize(cblas_sgemm_pack_get_size(kBMatrix, s.B, kGates * n, w) / sizeof(float) +
                           1);
        cblas_sgemm_pack(kRowMajor, kBMatrix, kNoTrans, s.B, kGates * n, w, 1.f, gathered.data(),
                         kGates * n, packs[task].data());
      }
    }
  });
  return packs;
}

// Forward. Returns (output (T, B, M), c_T (B, M), gates (T, B, 4, M), cells (T, B, M)); the last
// two, the activated gates and the cells that the backward reads, are empty unless `save`.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pru_recurrence_forward(
    const at::Tensor& inputs, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& h0, const at::Tensor& c0, bool save) {
  const Sizes s =
      check_operands("pru_recurrence_forward", inputs, "inputs", weight, bias, h0, c0);
  const int64_t T = s.T, B = s.B, M = s.M, w = s.w;
  auto options = inputs.options();
  at::Tensor output = at::empty({T, B, M}, options);
  at::Tensor gates = save ? at::empty({T, B, kGates, M}, options) : at::empty({0}, options);
  at::Tensor cells = save ? at::empty({T, B, M}, options) : at::empty({0}, options);
  at::Tensor c_last = c0.clone();
  if (T == 0 || B == 0) return {output, c_last, gates, cells};
  const auto packs = pack_weights(weight.data_ptr<float>(), s, false);
  const float* P = inputs.data_ptr<float>();
  const std::vector<float> no_bias(bias ? 0 : s.g * kGates * w, 0.f);
  const float* bias_p = bias ? bias->data_ptr<float>() : no_bias.data();
  float* out = output.data_ptr<float>();
  float* gates_p = save ? gates.data_ptr<float>() : nullptr;
  // without saving, the cells ping-pong between c_last and a second buffer
  std::vector<float> ring(save ? 0 : B * M);
  // each task's (B, 4n) product, at task * B * 4 kChunk
  std::vector<float> context(s.tasks() * B * kGates * kChunk);
  for (int64_t t = 0; t < T; ++t) {
    const float* h_prev = t ? out + (t - 1) * B * M : h0.data_ptr<float>();
    const float* c_prev;
    float* c_next;
    if (save) {
      c_prev = t ? cells.data_ptr<float>() + (t - 1) * B * M : c0.data_ptr<float>();
      c_next = cells.data_ptr<float>() + t * B * M;
    } else {  // ends in c_last: odd steps write it, even steps the ring, per the parity of T
      float* a = c_last.data_ptr<float>();
      float* b = ring.data();
      const bool last_to_a = (T - 1 - t) % 2 == 0;
      c_next = last_to_a ? a : b;
      c_prev = t ? (last_to_a ? b : a) : c0.data_ptr<float>();
    }
    at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
      OneMklThread one;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task / s.chunks, k0 = s.k0(task), n = s.n(task);
        float* ctx = context.data() + task * B * kGates * kChunk;
        cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, B, kGates * n, w, h_prev + j * w, M,
                            packs[task].data(), kGates * n, 0.f, ctx, kGates * n);
        const int64_t m0 = j * w + k0;
        const float* bq = bias_p + j * kGates * w + k0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = t * B + b;
          const float* pre = P + row * kGates * M + m0;
          const float* cx = ctx + b * kGates * n;
          float* h = out + row * M + m0;
          if (save)
            cell_forward<true>(pre, cx, bq, c_prev + b * M + m0, c_next + b * M + m0, h,
                               gates_p + row * kGates * M + m0, n, M, w);
          else
            cell_forward<false>(pre, cx, bq, c_prev + b * M + m0, c_next + b * M + m0, h,
                                nullptr, n, M, w);
        }
      }
    });
  }
  if (save) c_last.copy_(cells.select(0, T - 1));
  return {output, c_last, gates, cells};
}

// Backward. grad_output (T, B, M), grad_h_last and grad_c_last (B, M) may be undefined (zero).
// Returns (grad_inputs (T, B, 4, M), grad_weight (g, w, 4w), grad_bias (g, 4w), grad_h0 (B, M),
// grad_c0 (B, M)); grad_weight and grad_bias are empty unless asked for.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> pru_recurrence_backward(
    const std::optional<at::Tensor>& grad_output, const std::optional<at::Tensor>& grad_h_last,
    const std::optional<at::Tensor>& grad_c_last, const at::Tensor& gates,
    const at::Tensor& cells, const at::Tensor& output, const at::Tensor& weight,
    const at::Tensor& h0, const at::Tensor& c0, bool weight_grad, bool bias_grad) {
  const char* op = "pru_recurrence_backward";
  const Sizes s = check_operands(op, gates, "gates", weight, std::nullopt, h0, c0);
  const int64_t T = s.T, B = s.B, M = s.M, w = s.w, g = s.g, four_w = kGates * w;
  for (const auto& [t, name] : {std::pair{&cells, "cells"}, std::pair{&output, "output"}}) {
    lightnets::check_operand(op, *t, name, 3, "(T, B, M)");
    lightnets::check_shape(op, *t, name, {T, B, M}, "(T, B, M) of gates ", gates.sizes());
  }
  if (grad_output) {
    lightnets::check_operand(op, *grad_output, "grad_output", 3, "(T, B, M)");
    lightnets::check_shape(op, *grad_output, "grad_output", {T, B, M}, "(T, B, M) of gates ",
                           gates.sizes());
  }
  for (const auto& [t, name] :
       {std::pair{&grad_h_last, "grad_h_last"}, std::pair{&grad_c_last, "grad_c_last"}}) {
    if (!*t) continue;
    lightnets::check_operand(op, **t, name, 2, "(B, M)");
    lightnets::check_shape(op, **t, name, {B, M}, "(B, M) of gates ", gates.sizes());
  }
  auto options = h0.options();
  at::Tensor grad_inputs = at::empty({T, B, kGates, M}, options);
  at::Tensor grad_h0 = at::empty({B, M}, options);
  at::Tensor grad_c0 = grad_c_last ? grad_c_last->clone() : at::zeros({B, M}, options);
  if (T == 0 || B == 0) {
    grad_h0 = grad_h_last ? grad_h_last->clone() : at::zeros({B, M}, options);
    return {grad_inputs, at::zeros_like(weight), at::zeros({g, four_w}, options), grad_h0,
            grad_c0};
  }
  const auto packs = pack_weights(weight.data_ptr<float>(), s, true);
  const float* gout = grad_output ? grad_output->data_ptr<float>() : nullptr;
  const float* gh_last = grad_h_last ? grad_h_last->data_ptr<float>() : nullptr;
  const float* G = gates.data_ptr<float>();
  const float* C = cells.data_ptr<float>();
  float* dP = grad_inputs.data_ptr<float>();
  float* dc_carry = grad_c0.data_ptr<float>();  // dL/dc_t, carried down to dL/dc_0
  // dG of steps t and t + 1 in the group-major layout the recurrent products read: (g, B, 4w)
  std::vector<float> dG[2] = {std::vector<float>(g * B * four_w),
                             std::vector<float>(g * B * four_w)};
  std::vector<float> recurrent(s.tasks() * B * kChunk);  // each task's (B, n) recurrent gradient
  const std::vector<float> zeros(kChunk, 0.f);  // an absent gradient's row
  // task (j, chunk): dG_next_j (B, 4w) @ W_j^T[:, chunk] into dst (B, n), row stride ld
  auto recurrent_product = [&](int64_t task, const float* dG_next, float* dst, int64_t ld) {
    const int64_t j = task / s.chunks, n = s.n(task);
    cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, B, n, four_w, dG_next + j * B * four_w,
                        four_w, packs[task].data(), n, 0.f, dst, ld);
  };
  for (int64_t t = T - 1; t >= 0; --t) {
    const float* dG_next = dG[(t + 1) % 2].data();
    float* dG_cur = dG[t % 2].data();
    const float* c_prev_all = t ? C + (t - 1) * B * M : c0.data_ptr<float>();
    at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
      OneMklThread one;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task / s.chunks, k0 = s.k0(task), n = s.n(task), m0 = j * w + k0;
        float* rec = recurrent.data() + task * B * kChunk;
        if (t < T - 1) recurrent_product(task, dG_next, rec, n);
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = t * B + b;
          cell_backward(gout ? gout + row * M + m0 : zeros.data(),
                        t < T - 1 ? rec + b * n : zeros.data(),
                        t == T - 1 && gh_last ? gh_last + b * M + m0 : zeros.data(),
                        G + row * kGates * M + m0, C + row * M + m0, c_prev_all + b * M + m0,
                        dc_carry + b * M + m0, dP + row * kGates * M + m0,
                        dG_cur + (j * B + b) * four_w + k0, n, M, w);
        }
      }
    });
  }
  // dL/dh_0: step 0's recurrent product, straight into grad_h0's columns
  float* gh0 = grad_h0.data_ptr<float>();
  at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
    OneMklThread one;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t j = task / s.chunks, k0 = s.k0(task);
      recurrent_product(task, dG[0].data(), gh0 + j * w + k0, M);
    }
  });
  at::Tensor grad_weight = at::empty({0}, options), grad_bias = at::empty({0}, options);
  if (weight_grad) {
    // dW_j[:, q w + cols] = h0_j^T dP[0, :, q, j w + cols] + out[:-1]_j^T dP[1:, :, q, j w + cols]
    grad_weight = at::empty({g, w, four_w}, options);
    float* dW = grad_weight.data_ptr<float>();
    const float* H0 = h0.data_ptr<float>();
    const float* H = output.data_ptr<float>();
    const int64_t parts = (w + kGradChunk - 1) / kGradChunk;
    at::parallel_for(0, g * kGates * parts, 1, [&](int64_t begin, int64_t end) {
      OneMklThread one;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task / (kGates * parts), q = task / parts % kGates;
        const int64_t k0 = task % parts * kGradChunk, n = std::min(kGradChunk, w - k0);
        float* dst = dW + j * w * four_w + q * w + k0;
        const float* src = dP + q * M + j * w + k0;
        gemm(true, false, w, n, B, 1.f, H0 + j * w, M, src, kGates * M, 0.f, dst, four_w);
        if (T > 1)
          gemm(true, false, w, n, (T - 1) * B, 1.f, H + j * w, M, src + B * kGates * M,
               kGates * M, 1.f, dst, four_w);
      }
    });
  }
  if (bias_grad) {
    // column sums of dP over the T B rows, each column's in row order
    grad_bias = at::empty({g, four_w}, options);
    float* db = grad_bias.data_ptr<float>();
    const int64_t columns = kGates * M, rows = T * B;
    at::parallel_for(0, (columns + 255) / 256, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(256);
      for (int64_t part = begin; part < end; ++part) {
        const int64_t c0 = part * 256, n = std::min<int64_t>(256, columns - c0);
        std::fill_n(acc.data(), n, 0.f);
        for (int64_t r = 0; r < rows; ++r) {
          const float* src = dP + r * columns + c0;
#pragma omp simd
          for (int64_t k = 0; k < n; ++k) acc[k] += src[k];
        }
        for (int64_t k = 0; k < n; ++k) {  // column q M + m -> bias[m / w, q w + m % w]
          const int64_t q = (c0 + k) / M, m = (c0 + k) % M;
          db[(m / w) * four_w + q * w + m % w] = acc[k];
        }
      }
    });
  }
  return {grad_inputs, grad_weight, grad_bias, grad_h0, grad_c0};
}

bool pru_recurrence_available() { return mkl_available(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "pru_recurrence_forward(Tensor inputs, Tensor weight, Tensor? bias, Tensor h0, Tensor c0, "
      "bool save) -> (Tensor, Tensor, Tensor, Tensor)",
      &pru_recurrence_forward);
  m.def(
      "pru_recurrence_backward(Tensor? grad_output, Tensor? grad_h_last, Tensor? grad_c_last, "
      "Tensor gates, Tensor cells, Tensor output, Tensor weight, Tensor h0, Tensor c0, "
      "bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      &pru_recurrence_backward);
  m.def("pru_recurrence_available() -> bool", &pru_recurrence_available);
}
