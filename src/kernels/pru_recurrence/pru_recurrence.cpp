// The PRU's recurrence over a whole sequence, forward and backward through time, in one call each
// (src/kernels/pru_recurrence). For T steps of B rows, M = g w hidden units and gates (f, g, i, o):
//   a_t = P_t + GLT(h_{t-1}) + b,  c_t = s(a_f) c_{t-1} + s(a_i) tanh(a_g),  h_t = s(a_o) tanh(c_t)
// where group j of the GLT is h_{t-1}[:, j w : (j + 1) w] @ W_j, W_j (w, 4w), gate q's block its
// columns q w .. (q + 1) w.
//
// The work of a step is cut into tasks (j, k-chunk): a task multiplies h_{t-1}'s group j by the
// columns of W_j that feed its k-chunk of all four gates, then runs the cell equations on that
// chunk, so the products' outputs never leave the cache and a step is one parallel region. The
// products are plain sgemm calls, or MKL's packed GEMM on matrices packed once per call
// (cblas_sgemm_pack): on an AMD EPYC both take the same time at PTB's sizes (forward 44 ms,
// backward 81 ms at B = 20, T = 70) and packing costs 1 ms a call more at B = 1, T = 5; the
// packed routines died of SIGSEGV on an Intel Xeon. src/kernels/pru_recurrence checks each mode
// once per machine, plain first.
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
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
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

using namespace lightnets;  // the shared helpers of common.h

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
constexpr int64_t kGates = 4;
// A task's share of a group's k, forward and backward: measured at PTB sizes (B = 20, g = 4,
// w = 350) on 2 threads, the forward products ran at 78 GMAC/s with 64 (59 with whole groups), the
// backward ones (k of 4w, n of the chunk) at 69 with 128 and 55 with 64
constexpr int64_t kForwardChunk = 64, kBackwardChunk = 128;
// columns of a weight-gradient task: large enough for MKL's blocking, small enough for balance
constexpr int64_t kGradChunk = 512;

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

// The cell equations along n consecutive units of one row: gate q's pre-activations at
// pre + q pre_stride, its products at cx + q cx_stride, its biases at bias + q bias_stride; the
// activated gates saved (gate q at saved + q saved_stride) for the backward when Save.
template <bool Save>
__attribute__((always_inline)) inline void cell_forward(
    const float* __restrict__ pre, int64_t pre_stride, const float* __restrict__ cx,
    int64_t cx_stride, const float* __restrict__ bias, int64_t bias_stride,
    const float* __restrict__ c_prev, float* __restrict__ c_next, float* __restrict__ h,
    float* __restrict__ saved, int64_t saved_stride, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float f = sigmoid(pre[k] + cx[k] + bias[k]);
    const float gg = tanh_(pre[pre_stride + k] + cx[cx_stride + k] + bias[bias_stride + k]);
    const float i =
        sigmoid(pre[2 * pre_stride + k] + cx[2 * cx_stride + k] + bias[2 * bias_stride + k]);
    const float o =
        sigmoid(pre[3 * pre_stride + k] + cx[3 * cx_stride + k] + bias[3 * bias_stride + k]);
    const float c = f * c_prev[k] + i * gg;
    c_next[k] = c;
    h[k] = o * tanh_(c);
    if constexpr (Save) {
      saved[k] = f;
      saved[saved_stride + k] = gg;
      saved[2 * saved_stride + k] = i;
      saved[3 * saved_stride + k] = o;
    }
  }
}

// The cell's gradient along n consecutive units of one row, from dL/dh_t (the sum of dh_out,
// dh_rec and dh_last) and the carried dL/dc_t (updated in place to dL/dc_{t-1}): the gate
// pre-activations' gradients into dp (gate q at dp + q dp_stride) and dg (at dg + q dg_stride);
// the activated gates at gates + q gates_stride.
__attribute__((always_inline)) inline void cell_backward(
    const float* __restrict__ dh_out, const float* __restrict__ dh_rec,
    const float* __restrict__ dh_last, const float* __restrict__ gates, int64_t gates_stride,
    const float* __restrict__ c, const float* __restrict__ c_prev, float* __restrict__ dc,
    float* __restrict__ dp, int64_t dp_stride, float* __restrict__ dg, int64_t dg_stride,
    int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) {
    const float dh = dh_out[k] + dh_rec[k] + dh_last[k];
    const float f = gates[k], gg = gates[gates_stride + k];
    const float i = gates[2 * gates_stride + k], o = gates[3 * gates_stride + k];
    const float tc = tanh_(c[k]);
    const float dct = dc[k] + dh * o * (1.f - tc * tc);
    const float d_f = dct * c_prev[k] * f * (1.f - f);
    const float d_g = dct * i * (1.f - gg * gg);
    const float d_i = dct * gg * i * (1.f - i);
    const float d_o = dh * tc * o * (1.f - o);
    dc[k] = dct * f;
    dp[k] = d_f;
    dp[dp_stride + k] = d_g;
    dp[2 * dp_stride + k] = d_i;
    dp[3 * dp_stride + k] = d_o;
    dg[k] = d_f;
    dg[dg_stride + k] = d_g;
    dg[2 * dg_stride + k] = d_i;
    dg[3 * dg_stride + k] = d_o;
  }
}

// The pyramid's levels as the recurrence reads them: level l holds the pre-activations of the
// hidden units offset .. offset + width, as a (T, B, 4, width) array (its own gate stride)
struct Level {
  float* data;
  int64_t offset, width;
};

// fn(level, first unit, units) for each level's share of the units a .. a + n
template <typename Fn>
inline void for_segments(const std::vector<Level>& levels, int64_t a, int64_t n, Fn&& fn) {
  for (const Level& level : levels) {
    const int64_t lo = std::max(a, level.offset);
    const int64_t hi = std::min(a + n, level.offset + level.width);
    if (lo < hi) fn(level, lo, hi - lo);
  }
}

// The sizes, and the tasks (j, k-chunk) of chunks `chunk` wide (the last one may be narrower)
struct Sizes {
  int64_t T, B, M, g, w, chunk = 1, chunks = 1;
  Sizes split(int64_t width) const {
    Sizes s = *this;
    s.chunk = std::max<int64_t>(1, std::min(width, w));
    s.chunks = (w + s.chunk - 1) / s.chunk;
    return s;
  }
  int64_t tasks() const { return g * chunks; }
  int64_t k0(int64_t task) const { return (task % chunks) * chunk; }
  int64_t n(int64_t task) const { return std::min(chunk, w - k0(task)); }
};

// g and w of the (g, w, 4w) weight
std::pair<int64_t, int64_t> check_weight(const char* op, const at::Tensor& weight) {
  TORCH_CHECK(mkl_available(), op, ": needs PyTorch built with MKL");
  lightnets::check_operand(op, weight, "weight", 3, "(g, w, 4w)");
  const int64_t g = weight.size(0), w = weight.size(1);
  TORCH_CHECK(g > 0 && w > 0 && weight.size(2) == kGates * w, op, ": weight has shape ",
              weight.sizes(), ", expected (g, w, 4w) with g, w > 0");
  return {g, w};
}

// the bias (g, 4w) and the state h0, c0 (B, M) that go with the sizes in `s`; `origin` names the
// operand that gave B
void check_bias_and_state(const char* op, const std::optional<at::Tensor>& bias,
                          const at::Tensor& h0, const at::Tensor& c0, const Sizes& s,
                          const at::Tensor& weight, const char* origin, at::IntArrayRef sizes) {
  if (bias) {
    lightnets::check_operand(op, *bias, "bias", 2, "(g, 4w)");
    lightnets::check_shape(op, *bias, "bias", {s.g, kGates * s.w}, "(g, 4w) of weight ",
                           weight.sizes());
  }
  for (const auto& [t, name] : {std::pair{&h0, "h0"}, std::pair{&c0, "c0"}}) {
    lightnets::check_operand(op, *t, name, 2, "(B, M)");
    lightnets::check_shape(op, *t, name, {s.B, s.M}, "(B, M) of ", origin, " ", sizes,
                           " and weight ", weight.sizes());
  }
  // MKL's LP64 interface takes int sizes
  TORCH_CHECK(s.T * s.B * kGates * s.M < std::numeric_limits<int>::max(), op, ": ", origin,
              " of shape ", sizes, " is too large for MKL's 32-bit sizes");
}

// The sizes of the (T, B, 4, M) tensor `gates` (the activated gates, backward) and of the
// operands that go with it
Sizes check_operands(const char* op, const at::Tensor& gates, const at::Tensor& weight,
                     const at::Tensor& h0, const at::Tensor& c0) {
  lightnets::check_operand(op, gates, "gates", 4, "(T, B, 4, M)");
  const auto [g, w] = check_weight(op, weight);
  TORCH_CHECK(gates.size(2) == kGates && gates.size(3) == g * w, op, ": gates has shape ",
              gates.sizes(), " and weight ", weight.sizes(),
              ", expected gates (T, B, 4, M) and weight (g, M/g, 4M/g)");
  const Sizes s{gates.size(0), gates.size(1), g * w, g, w};
  check_bias_and_state(op, std::nullopt, h0, c0, s, weight, "gates", gates.sizes());
  return s;
}

// The levels of the forward's pre-activations, each (T, B, 4, m_l) with sum m_l = M, and the
// sizes of the operands that go with them
std::pair<Sizes, std::vector<Level>> check_levels(const char* op, at::TensorList levels,
                                                  const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const at::Tensor& h0, const at::Tensor& c0) {
  TORCH_CHECK(!levels.empty(), op, ": levels must hold at least one (T, B, 4, m) tensor");
  const auto [g, w] = check_weight(op, weight);
  std::vector<Level> out;
  std::string shapes;
  int64_t width = 0;
  for (const at::Tensor& level : levels) {
    lightnets::check_operand(op, level, "levels", 4, "(T, B, 4, m)");
    shapes += c10::str(shapes.empty() ? "" : ", ", level.sizes());
    out.push_back({level.data_ptr<float>(), width, level.size(3)});
    width += level.size(3);
  }
  const int64_t T = levels[0].size(0), B = levels[0].size(1);
  bool same = true;
  for (const at::Tensor& level : levels)
    same = same && level.size(0) == T && level.size(1) == B && level.size(2) == kGates;
  TORCH_CHECK(same && width == g * w, op, ": levels have shapes ", shapes, " and weight ",
              weight.sizes(), ", expected levels (T, B, 4, m_l) with sum m_l = M and weight ",
              "(g, M/g, 4M/g)");
  const Sizes s{T, B, g * w, g, w};
  check_bias_and_state(op, bias, h0, c0, s, weight, "levels", levels[0].sizes());
  return {s, out};
}

// Packed matrices live in buffers that are kept for the next call. MKL asks for at least 5.8 MB
// a matrix, however small, of which packing touches about 1 MB: fresh buffers (mapped lazily)
// page-fault on every call, 9 ms of a PTB-sized forward's 50 where kept ones take 1.6 ms.
// They are 64-byte aligned, as MKL asks of a packed matrix's storage: its AVX-512 code (Intel
// processors) stores the packed panels with aligned moves, and a 16-byte aligned buffer (what
// `new float[]` gives) faults there, while the AVX2 code taken on AMD processors does not mind.
class PackedBuffers {
 public:
  static constexpr size_t kAlignment = 64;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  struct Buffer {
    size_t floats = 0;
    std::unique_ptr<float, Free> data;
  };

  // a buffer of at least `bytes`, the smallest kept one that fits (left uninitialised)
  Buffer take(size_t bytes) {
    const size_t rounded = (bytes / kAlignment + 1) * kAlignment;
    const size_t floats = rounded / sizeof(float);
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if (it->floats >= floats && (best == kept_.end() || it->floats < best->floats)) best = it;
    if (best == kept_.end()) {
      auto* data = static_cast<float*>(std::aligned_alloc(kAlignment, rounded));
      TORCH_CHECK(data != nullptr, "pru_recurrence: out of memory packing ", rounded, " bytes");
      return {floats, std::unique_ptr<float, Free>(data)};
    }
    Buffer buffer = std::move(*best);
    kept_.erase(best);
    return buffer;
  }

  void give_back(std::vector<Buffer>& buffers) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Buffer& buffer : buffers)
      if (buffer.data) kept_.push_back(std::move(buffer));
    buffers.clear();
  }

 private:
  std::mutex mutex_;
  std::vector<Buffer> kept_;
};

PackedBuffers& packed_buffers() {
  static PackedBuffers pool;  // never destroyed before the calls that use it end
  return pool;
}

// A call's weight operands, one per task, in the buffers given back to the pool when the call
// ends. Packed (MKL's internal layout, cblas_sgemm_pack) or plain (a row-major matrix for sgemm):
// both give the same products; plain is the fallback where MKL's packed routines fail
// (src/kernels/pru_recurrence probes them once per machine). Forward, task (j, chunk) multiplies by
// W_j's columns {q w + k0 .. q w + k0 + n : q < 4} gathered into a (w, 4n) matrix; backward by
// W_j^T's columns k0 .. k0 + n, (4w, n), which plain mode reads from W in place.
class TaskWeights {
 public:
  TaskWeights(const float* W, const Sizes& s, bool backward, bool packed)
      : W_(W), s_(s), backward_(backward), packed_(packed), buffers_(s.tasks()) {
    if (backward && !packed) return;  // read in place
    const int64_t w = s.w, four_w = kGates * w;
    at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
      OneMklThread one;
      std::vector<float> gathered;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task / s.chunks, k0 = s.k0(task), n = s.n(task);
        const float* Wj = W + j * w * four_w;
        auto& buffer = buffers_[task];
        if (backward) {
          buffer = packed_buffers().take(cblas_sgemm_pack_get_size(kBMatrix, s.B, n, four_w));
          // B = (rows k0 .. k0 + n of W_j)^T
          cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, s.B, n, four_w, 1.f, Wj + k0 * four_w,
                           four_w, buffer.data.get());
          continue;
        }
        const int64_t size = w * kGates * n;
        if (packed) gathered.resize(size);
        else buffer = packed_buffers().take(size * sizeof(float));
        float* dst = packed ? gathered.data() : buffer.data.get();
        for (int64_t r = 0; r < w; ++r)
          for (int64_t q = 0; q < kGates; ++q)
            std::copy_n(Wj + r * four_w + q * w + k0, n, dst + (r * kGates + q) * n);
        if (packed) {
          buffer = packed_buffers().take(cblas_sgemm_pack_get_size(kBMatrix, s.B, kGates * n, w));
          cblas_sgemm_pack(kRowMajor, kBMatrix, kNoTrans, s.B, kGates * n, w, 1.f, dst,
                           kGates * n, buffer.data.get());
        }
      }
    });
  }
  TaskWeights(const TaskWeights&) = delete;
  ~TaskWeights() { packed_buffers().give_back(buffers_); }

  // task's product C = A @ (its weight operand): forward A (B, w) -> C (B, 4n), backward
  // A (B, 4w) -> C (B, n); A and C row-major with row strides lda and ldc
  void multiply(int64_t task, const float* a, int lda, float* c, int ldc) const {
    const int B = s_.B, w = s_.w, four_w = kGates * s_.w, n = s_.n(task);
    const float* buffer = buffers_[task].data.get();
    if (!backward_ && packed_)
      cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, B, kGates * n, w, a, lda, buffer,
                          kGates * n, 0.f, c, ldc);
    else if (!backward_)
      gemm(false, false, B, kGates * n, w, 1.f, a, lda, buffer, kGates * n, 0.f, c, ldc);
    else if (packed_)
      cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, B, n, four_w, a, lda, buffer, n, 0.f, c,
                          ldc);
    else
      gemm(false, true, B, n, four_w, 1.f, a, lda,
           W_ + (task / s_.chunks) * w * four_w + s_.k0(task) * four_w, four_w, 0.f, c, ldc);
  }

 private:
  const float* W_;
  Sizes s_;
  bool backward_, packed_;
  std::vector<PackedBuffers::Buffer> buffers_;
};

// Forward. Returns (output (T, B, M), c_T (B, M), gates (T, B, 4, M), cells (T, B, M)); the last
// two, the activated gates and the cells that the backward reads, are empty unless `save`.
// `packed`: the recurrent products on MKL-packed weights, else plain sgemm (TaskWeights).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> pru_recurrence_forward(
    at::TensorList levels, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& h0, const at::Tensor& c0, bool save, bool packed) {
  const auto checked = check_levels("pru_recurrence_forward", levels, weight, bias, h0, c0);
  const Sizes s = checked.first.split(kForwardChunk);
  const std::vector<Level>& level_list = checked.second;
  const int64_t T = s.T, B = s.B, M = s.M, w = s.w;
  auto options = h0.options();
  at::Tensor output = at::empty({T, B, M}, options);
  at::Tensor gates = save ? at::empty({T, B, kGates, M}, options) : at::empty({0}, options);
  at::Tensor cells = save ? at::empty({T, B, M}, options) : at::empty({0}, options);
  at::Tensor c_last = c0.clone();
  if (T == 0 || B == 0) return {output, c_last, gates, cells};
  const TaskWeights weights(weight.data_ptr<float>(), s, false, packed);
  const std::vector<float> no_bias(bias ? 0 : s.g * kGates * w, 0.f);
  const float* bias_p = bias ? bias->data_ptr<float>() : no_bias.data();
  float* out = output.data_ptr<float>();
  float* gates_p = save ? gates.data_ptr<float>() : nullptr;
  // without saving, the cells ping-pong between c_last and a second buffer
  std::vector<float> ring(save ? 0 : B * M);
  // each task's (B, 4n) product, at task * B * 4 chunk
  std::vector<float> context(s.tasks() * B * kGates * s.chunk);
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
        float* ctx = context.data() + task * B * kGates * s.chunk;
        weights.multiply(task, h_prev + j * w, M, ctx, kGates * n);
        const int64_t m0 = j * w + k0;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = t * B + b;
          for_segments(level_list, m0, n, [&](const Level& level, int64_t u, int64_t len) {
            const float* pre = level.data + row * kGates * level.width + (u - level.offset);
            const float* cx = ctx + b * kGates * n + (u - m0);
            const float* bq = bias_p + j * kGates * w + (u - j * w);
            const int64_t at = b * M + u;
            if (save)
              cell_forward<true>(pre, level.width, cx, n, bq, w, c_prev + at, c_next + at,
                                 out + row * M + u, gates_p + row * kGates * M + u, M, len);
            else
              cell_forward<false>(pre, level.width, cx, n, bq, w, c_prev + at, c_next + at,
                                  out + row * M + u, nullptr, M, len);
          });
        }
      }
    });
  }
  if (save) c_last.copy_(cells.select(0, T - 1));
  return {output, c_last, gates, cells};
}

// Backward. grad_output (T, B, M), grad_h_last and grad_c_last (B, M) may be undefined (zero);
// `widths` are the forward's level widths m_l. Returns (the levels' gradients, each
// (T, B, 4, m_l), grad_weight (g, w, 4w), grad_bias (g, 4w), grad_h0 (B, M), grad_c0 (B, M));
// grad_weight and grad_bias are empty unless asked for.
std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
pru_recurrence_backward(const std::optional<at::Tensor>& grad_output,
                        const std::optional<at::Tensor>& grad_h_last,
                        const std::optional<at::Tensor>& grad_c_last, const at::Tensor& gates,
                        const at::Tensor& cells, const at::Tensor& output,
                        const at::Tensor& weight, const at::Tensor& h0, const at::Tensor& c0,
                        at::IntArrayRef widths, bool weight_grad, bool bias_grad,
                        bool packed) {
  const char* op = "pru_recurrence_backward";
  const Sizes s = check_operands(op, gates, weight, h0, c0).split(kBackwardChunk);
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
  int64_t width_sum = 0;
  for (int64_t m : widths) width_sum += m > 0 ? m : M + 1;
  TORCH_CHECK(!widths.empty() && width_sum == M, op, ": widths ", widths,
              " must be positive and sum to M = ", M, " of gates ", gates.sizes());
  auto options = h0.options();
  std::vector<at::Tensor> grad_levels;
  std::vector<Level> levels;
  for (int64_t m : widths) {
    grad_levels.push_back(at::empty({T, B, kGates, m}, options));
    const int64_t offset = levels.empty() ? 0 : levels.back().offset + levels.back().width;
    levels.push_back({grad_levels.back().data_ptr<float>(), offset, m});
  }
  at::Tensor grad_h0 = at::empty({B, M}, options);
  at::Tensor grad_c0 = grad_c_last ? grad_c_last->clone() : at::zeros({B, M}, options);
  if (T == 0 || B == 0) {
    grad_h0 = grad_h_last ? grad_h_last->clone() : at::zeros({B, M}, options);
    return {grad_levels, at::zeros_like(weight), at::zeros({g, four_w}, options), grad_h0,
            grad_c0};
  }
  const TaskWeights weights(weight.data_ptr<float>(), s, true, packed);
  const float* gout = grad_output ? grad_output->data_ptr<float>() : nullptr;
  const float* gh_last = grad_h_last ? grad_h_last->data_ptr<float>() : nullptr;
  const float* G = gates.data_ptr<float>();
  const float* C = cells.data_ptr<float>();
  float* dc_carry = grad_c0.data_ptr<float>();  // dL/dc_t, carried down to dL/dc_0
  // dG of steps t and t + 1 in the group-major layout the recurrent products read: (g, B, 4w)
  std::vector<float> dG[2] = {std::vector<float>(g * B * four_w),
                             std::vector<float>(g * B * four_w)};
  // each task's (B, n) recurrent gradient
  std::vector<float> recurrent(s.tasks() * B * s.chunk);
  const std::vector<float> zeros(s.chunk, 0.f);  // an absent gradient's row
  // task (j, chunk): dG_next_j (B, 4w) @ W_j^T[:, chunk] into dst (B, n), row stride ld
  auto recurrent_product = [&](int64_t task, const float* dG_next, float* dst, int64_t ld) {
    weights.multiply(task, dG_next + task / s.chunks * B * four_w, four_w, dst, ld);
  };
  for (int64_t t = T - 1; t >= 0; --t) {
    const float* dG_next = dG[(t + 1) % 2].data();
    float* dG_cur = dG[t % 2].data();
    const float* c_prev_all = t ? C + (t - 1) * B * M : c0.data_ptr<float>();
    at::parallel_for(0, s.tasks(), 1, [&](int64_t begin, int64_t end) {
      OneMklThread one;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t j = task / s.chunks, k0 = s.k0(task), n = s.n(task), m0 = j * w + k0;
        float* rec = recurrent.data() + task * B * s.chunk;
        if (t < T - 1) recurrent_product(task, dG_next, rec, n);
        for (int64_t b = 0; b < B; ++b) {
          const int64_t row = t * B + b;
          for_segments(levels, m0, n, [&](const Level& level, int64_t u, int64_t len) {
            const int64_t at = b * M + u;
            cell_backward(gout ? gout + row * M + u : zeros.data(),
                          t < T - 1 ? rec + b * n + (u - m0) : zeros.data(),
                          t == T - 1 && gh_last ? gh_last + at : zeros.data(),
                          G + row * kGates * M + u, M, C + row * M + u, c_prev_all + at,
                          dc_carry + at,
                          level.data + row * kGates * level.width + (u - level.offset),
                          level.width, dG_cur + (j * B + b) * four_w + (u - j * w), w, len);
          });
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
    // dW_j[:, q w + cols] = h0_j^T dP[0, :, q, cols] + out[:-1]_j^T dP[1:, :, q, cols], the
    // columns' pre-activation gradients read from the level that holds them
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
        for_segments(levels, j * w + k0, n, [&](const Level& level, int64_t u, int64_t len) {
          float* dst = dW + j * w * four_w + q * w + (u - j * w);
          const int64_t ld = kGates * level.width;
          const float* src = level.data + q * level.width + (u - level.offset);
          gemm(true, false, w, len, B, 1.f, H0 + j * w, M, src, ld, 0.f, dst, four_w);
          if (T > 1)
            gemm(true, false, w, len, (T - 1) * B, 1.f, H + j * w, M, src + B * ld, ld, 1.f,
                 dst, four_w);
        });
      }
    });
  }
  if (bias_grad) {
    // column sums of each level's gradient over the T B rows, each column's in row order
    grad_bias = at::empty({g, four_w}, options);
    float* db = grad_bias.data_ptr<float>();
    const int64_t rows = T * B, block = 256;
    std::vector<std::pair<const Level*, int64_t>> parts;  // (level, first column)
    for (const Level& level : levels)
      for (int64_t c = 0; c < kGates * level.width; c += block) parts.push_back({&level, c});
    at::parallel_for(0, parts.size(), 1, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(block);
      for (int64_t part = begin; part < end; ++part) {
        const Level& level = *parts[part].first;
        const int64_t columns = kGates * level.width, c0 = parts[part].second;
        const int64_t n = std::min(block, columns - c0);
        std::fill_n(acc.data(), n, 0.f);
        for (int64_t r = 0; r < rows; ++r) {
          const float* src = level.data + r * columns + c0;
#pragma omp simd
          for (int64_t k = 0; k < n; ++k) acc[k] += src[k];
        }
        for (int64_t k = 0; k < n; ++k) {  // level column q m_l + u -> bias[m / w, q w + m % w]
          const int64_t q = (c0 + k) / level.width, m = level.offset + (c0 + k) % level.width;
          db[(m / w) * four_w + q * w + m % w] = acc[k];
        }
      }
    });
  }
  return {grad_levels, grad_weight, grad_bias, grad_h0, grad_c0};
}

bool pru_recurrence_available() { return mkl_available(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "pru_recurrence_forward(Tensor[] levels, Tensor weight, Tensor? bias, Tensor h0, "
      "Tensor c0, bool save, bool packed=True) -> (Tensor, Tensor, Tensor, Tensor)",
      &pru_recurrence_forward);
  m.def(
      "pru_recurrence_backward(Tensor? grad_output, Tensor? grad_h_last, Tensor? grad_c_last, "
      "Tensor gates, Tensor cells, Tensor output, Tensor weight, Tensor h0, Tensor c0, "
      "int[] widths, bool weight_grad, bool bias_grad, bool packed=True) -> (Tensor[], Tensor, "
      "Tensor, Tensor, Tensor)",
      &pru_recurrence_backward);
  m.def("pru_recurrence_available() -> bool", &pru_recurrence_available);
}
