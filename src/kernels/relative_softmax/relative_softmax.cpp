// The attention probabilities of relative-position attention (Transformer-XL, Group-Transformer)
// in one pass over the scores, forward and backward (training and inference):
//   prob = softmax(mask(-inf, (content + rel_shift(position)) * scale))
// where rel_shift is Transformer-XL's zero-pad-and-reshape realignment of the position scores:
// for query i of T and key j of K (K >= T), with v = K - T + i + 1 the keys query i may see,
//   rel_shift(x)[i, j] = x[i, j + T - 1 - i]    j < v     (the valid entries)
//                      = 0                      j = v     (the pad)
//                      = x[i + 1, j - v - 1]    j > v     (future keys, masked in a causal LM)
// Eagerly the pad, the reshape, the add, the scale, the mask and the softmax are separate passes
// over (B, H, T, K) tensors (each a fresh, page-faulting allocation at LM sizes), and their
// backward another six: at Transformer-XL's enwik8 sizes about 40% of a CPU training step.
// Backward, with gs = mask(0, prob * (grad - sum_j grad prob)) * scale the score gradient,
//   grad_content = gs,  grad_position[i, c] = gs[i, c - (T - 1 - i)]   c >= T - 1 - i
//                                           = gs[i - 1, c + v]         c < T - 1 - i, i > 0
//                                           = 0                        otherwise
// the exact adjoint of rel_shift (each position score feeds one output entry, or none).
// Scores are formed as the eager ops round them (the add, then the scale, each rounded to the
// dtype), the softmax in float32, and the probabilities stored in the dtype: float32, bfloat16
// or float16. Rows (one query of one head) are independent, so no result depends on the thread
// count.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "common.h"

// Where PyTorch itself runs AVX-512 code (the build then defines LIGHTNETS_AVX512), this file's
// loops are compiled for it: the forward's exponentials and 16-bit roundings take 0.55-0.7 of their
// AVX2 time. The other kernels keep AVX2, with which they measured as fast.
#ifdef LIGHTNETS_AVX512
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif

namespace {

using namespace lightnets;  // the shared helpers of common.h

constexpr float kInf = std::numeric_limits<float>::infinity();

// v rounded to T (identity for float32): the eager ops round each intermediate to the dtype
template <typename T>
inline float narrow(float v) {
  T t;
  store(&t, 0, v);
  return load(&t, 0);
}

// v where the mask byte is 0, else fill, in integer operations: written as a select on a bool,
// the loop stays scalar with a branch per element (GCC 12 does not vectorise it)
inline float visible(uint8_t masked, float v, float fill) {
  const uint32_t keep = 0u - static_cast<uint32_t>(masked == 0);  // all ones where visible
  uint32_t vb, fb;
  std::memcpy(&vb, &v, sizeof vb);
  std::memcpy(&fb, &fill, sizeof fb);
  const uint32_t out = (vb & keep) | (fb & ~keep);
  float r;
  std::memcpy(&r, &out, sizeof r);
  return r;
}

// Rows per task: about 16K elements, so a task amortises its scratch row.
inline int64_t grain(int64_t K) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)); }

template <typename T>
void forward(const T* content, const T* position, const uint8_t* mask, T* prob, int64_t N,
             int64_t Tq, int64_t K, float scale) {
  // by value: through the reference captures, the loops reload them per element and stay scalar
  at::parallel_for(0, N * Tq, grain(K), [=](int64_t begin, int64_t end) {
    std::vector<float> scratch(K);
    float* __restrict__ s = scratch.data();
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % Tq;
      const T* __restrict__ c = content + row * K;
      const T* x = position + (row - i) * K;  // the head's (T, K) position scores
      const int64_t v = K - Tq + i + 1;
      const T* __restrict__ head = x + i * K + (Tq - 1 - i);  // head[j] = x[i, j + T - 1 - i]
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) s[j] = narrow<T>(load(c, j) + load(head, j));
      if (v < K) {
        s[v] = load(c, v);  // + the pad's 0
        const T* __restrict__ tail = x + (i + 1) * K - (v + 1);  // tail[j] = x[i + 1, j - v - 1]
#pragma omp simd
        for (int64_t j = v + 1; j < K; ++j) s[j] = narrow<T>(load(c, j) + load(tail, j));
      }
      const uint8_t* __restrict__ m = mask == nullptr ? nullptr : mask + i * K;
      float top = -kInf;
      if (m != nullptr) {
#pragma omp simd reduction(max : top)
        for (int64_t j = 0; j < K; ++j) {
          const float scaled = visible(m[j], narrow<T>(s[j] * scale), -kInf);
          s[j] = scaled;
          top = std::max(top, scaled);
        }
      } else {
#pragma omp simd reduction(max : top)
        for (int64_t j = 0; j < K; ++j) {
          const float scaled = narrow<T>(s[j] * scale);
          s[j] = scaled;
          top = std::max(top, scaled);
        }
      }
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < K; ++j) {
        const float e = exp_nonpositive(s[j] - top);  // a row of -inf gives NaN, as ATen's
        s[j] = e;
        total += e;
      }
      const float inv = 1.f / total;
      T* __restrict__ p = prob + row * K;
#pragma omp simd
      for (int64_t j = 0; j < K; ++j) store(p, j, s[j] * inv);
    }
  });
}

template <typename T>
void backward(const T* grad, const T* prob, const uint8_t* mask, T* grad_content,
              T* grad_position, int64_t N, int64_t Tq, int64_t K, float scale) {
  at::parallel_for(0, N * Tq, grain(K), [=](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % Tq;
      const T* __restrict__ g = grad + row * K;
      const T* __restrict__ p = prob + row * K;
      T* __restrict__ gs = grad_content + row * K;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < K; ++j) dot += load(g, j) * load(p, j);
      const uint8_t* __restrict__ m = mask == nullptr ? nullptr : mask + i * K;
      if (m != nullptr) {
#pragma omp simd
        for (int64_t j = 0; j < K; ++j) {
          const float value = load(p, j) * (load(g, j) - dot) * scale;
          store(gs, j, visible(m[j], value, 0.f));
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < K; ++j) store(gs, j, load(p, j) * (load(g, j) - dot) * scale);
      }
      // the adjoint of rel_shift: row i's valid entries to position row i from column T - 1 - i,
      // its entries past the pad to the head of position row i + 1
      T* gx = grad_position + (row - i) * K;
      const int64_t v = K - Tq + i + 1;
      std::memcpy(gx + i * K + (Tq - 1 - i), gs, sizeof(T) * v);
      if (v + 1 < K) std::memcpy(gx + (i + 1) * K, gs + v + 1, sizeof(T) * (K - v - 1));
      if (i == 0) std::memset(gx, 0, sizeof(T) * (Tq - 1));  // fed by no entry
    }
  });
}

// (N, T, K) score-shaped operands of one dtype, K >= T >= 1, and a (T, K) bool mask if given
void check_operands(const char* op, std::initializer_list<std::pair<const at::Tensor*, const char*>>
                                        scores,
                    const std::optional<at::Tensor>& mask) {
  const auto& [first, first_name] = *scores.begin();
  check_dense(op, *first, first_name, 3, "(N, T, K)");
  const auto dtype = first->scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op, ": ",
              first_name, " must be float32, bfloat16 or float16, got ", dtype);
  const int64_t Tq = first->size(1), K = first->size(2);
  TORCH_CHECK(Tq >= 1 && K >= Tq, op, ": ", first_name,
              " must have K >= T >= 1 (keys include the queries), got shape ", first->sizes());
  for (const auto& [t, name] : scores) {
    check_dense(op, *t, name, 3, "(N, T, K)");
    TORCH_CHECK(t->sizes().equals(first->sizes()), op, ": ", name, " has shape ", t->sizes(),
                ", expected ", first_name, "'s shape ", first->sizes());
    TORCH_CHECK(t->scalar_type() == dtype, op, ": ", name, " must be ", dtype_name(dtype), " as ",
                first_name, ", got ", t->scalar_type());
  }
  if (mask.has_value()) {
    check_dense(op, *mask, "mask", 2, "(T, K)");
    lightnets::check_shape(op, *mask, "mask", {Tq, K}, "(T, K) of ", first_name, " ",
                           first->sizes());
    TORCH_CHECK(mask->scalar_type() == at::kBool, op, ": mask must be bool, got ",
                mask->scalar_type());
  }
}

// an output written in place must not share memory with an operand the kernel still reads
void check_disjoint(const char* op, const at::Tensor& out, const char* out_name,
                    std::initializer_list<std::pair<const at::Tensor*, const char*>> operands) {
  const auto begin = reinterpret_cast<uintptr_t>(out.data_ptr());
  const auto end = begin + out.nbytes();
  for (const auto& [t, name] : operands) {
    const auto other = reinterpret_cast<uintptr_t>(t->data_ptr());
    TORCH_CHECK(end <= other || other + t->nbytes() <= begin, op, ": ", out_name,
                " shares memory with ", name, "; pass a separate buffer");
  }
}

void forward_into(const at::Tensor& content, const at::Tensor& position,
                  const std::optional<at::Tensor>& mask, double scale, at::Tensor& prob) {
  // torch.bool is one byte
  const auto* m =
      mask.has_value() ? reinterpret_cast<const uint8_t*>(mask->data_ptr<bool>()) : nullptr;
  const int64_t N = content.size(0), Tq = content.size(1), K = content.size(2);
  const float s = static_cast<float>(scale);  // as ATen's mul by a Python float
  switch (content.scalar_type()) {
    case at::kFloat:
      forward(content.data_ptr<float>(), position.data_ptr<float>(), m, prob.data_ptr<float>(), N,
              Tq, K, s);
      break;
    case at::kBFloat16:
      forward(content.data_ptr<c10::BFloat16>(), position.data_ptr<c10::BFloat16>(), m,
              prob.data_ptr<c10::BFloat16>(), N, Tq, K, s);
      break;
    default:
      forward(content.data_ptr<c10::Half>(), position.data_ptr<c10::Half>(), m,
              prob.data_ptr<c10::Half>(), N, Tq, K, s);
  }
}

at::Tensor relative_softmax_forward(const at::Tensor& content, const at::Tensor& position,
                                    const std::optional<at::Tensor>& mask, double scale) {
  check_operands("relative_softmax_forward", {{&content, "content"}, {&position, "position"}},
                 mask);
  at::Tensor prob = at::empty(content.sizes(), content.options());
  forward_into(content, position, mask, scale, prob);
  return prob;
}

// the forward into a caller's buffer (reused across calls: a fresh score-sized tensor at LM sizes
// is page-faulted in on every call)
void relative_softmax_forward_out(const at::Tensor& content, const at::Tensor& position,
                                  const std::optional<at::Tensor>& mask, double scale,
                                  at::Tensor prob) {
  const char* op = "relative_softmax_forward_out";
  check_operands(op, {{&content, "content"}, {&position, "position"}, {&prob, "prob"}}, mask);
  check_disjoint(op, prob, "prob", {{&content, "content"}, {&position, "position"}});
  forward_into(content, position, mask, scale, prob);
}

void backward_into(const at::Tensor& grad_prob, const at::Tensor& prob,
                   const std::optional<at::Tensor>& mask, double scale, at::Tensor& grad_content,
                   at::Tensor& grad_position) {
  // torch.bool is one byte
  const auto* m =
      mask.has_value() ? reinterpret_cast<const uint8_t*>(mask->data_ptr<bool>()) : nullptr;
  const int64_t N = prob.size(0), Tq = prob.size(1), K = prob.size(2);
  const float s = static_cast<float>(scale);
  switch (prob.scalar_type()) {
    case at::kFloat:
      backward(grad_prob.data_ptr<float>(), prob.data_ptr<float>(), m,
               grad_content.data_ptr<float>(), grad_position.data_ptr<float>(), N, Tq, K, s);
      break;
    case at::kBFloat16:
      backward(grad_prob.data_ptr<c10::BFloat16>(), prob.data_ptr<c10::BFloat16>(), m,
               grad_content.data_ptr<c10::BFloat16>(), grad_position.data_ptr<c10::BFloat16>(),
               N, Tq, K, s);
      break;
    default:
      backward(grad_prob.data_ptr<c10::Half>(), prob.data_ptr<c10::Half>(), m,
               grad_content.data_ptr<c10::Half>(), grad_position.data_ptr<c10::Half>(), N, Tq,
               K, s);
  }
}

std::tuple<at::Tensor, at::Tensor> relative_softmax_backward(
    const at::Tensor& grad_prob, const at::Tensor& prob, const std::optional<at::Tensor>& mask,
    double scale) {
  check_operands("relative_softmax_backward", {{&prob, "prob"}, {&grad_prob, "grad_prob"}}, mask);
  at::Tensor grad_content = at::empty(prob.sizes(), prob.options());
  at::Tensor grad_position = at::empty(prob.sizes(), prob.options());
  backward_into(grad_prob, prob, mask, scale, grad_content, grad_position);
  return {grad_content, grad_position};
}

// the backward into a caller's buffers (see relative_softmax_forward_out)
void relative_softmax_backward_out(const at::Tensor& grad_prob, const at::Tensor& prob,
                                   const std::optional<at::Tensor>& mask, double scale,
                                   at::Tensor grad_content, at::Tensor grad_position) {
  const char* op = "relative_softmax_backward_out";
  check_operands(op,
                 {{&prob, "prob"},
                  {&grad_prob, "grad_prob"},
                  {&grad_content, "grad_content"},
                  {&grad_position, "grad_position"}},
                 mask);
  check_disjoint(op, grad_content, "grad_content",
                 {{&grad_prob, "grad_prob"}, {&prob, "prob"}, {&grad_position, "grad_position"}});
  check_disjoint(op, grad_position, "grad_position", {{&grad_prob, "grad_prob"}, {&prob, "prob"}});
  backward_into(grad_prob, prob, mask, scale, grad_content, grad_position);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def(
      "relative_softmax_forward(Tensor content, Tensor position, Tensor? mask, float scale) -> "
      "Tensor",
      &relative_softmax_forward);
  m.def(
      "relative_softmax_backward(Tensor grad_prob, Tensor prob, Tensor? mask, float scale) -> "
      "(Tensor, Tensor)",
      &relative_softmax_backward);
  m.def(
      "relative_softmax_forward_out(Tensor content, Tensor position, Tensor? mask, float scale, "
      "Tensor(a!) prob) -> ()",
      &relative_softmax_forward_out);
  m.def(
      "relative_softmax_backward_out(Tensor grad_prob, Tensor prob, Tensor? mask, float scale, "
      "Tensor(a!) grad_content, Tensor(b!) grad_position) -> ()",
      &relative_softmax_backward_out);
}
