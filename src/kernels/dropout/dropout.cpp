// Dropout with a counter-based mask: element i of a call is kept when hash(seed, i), a keyed
// 32-bit mix of its index, is at or above p 2^32; kept elements are scaled by 1 / (1 - p). The
// backward regenerates the mask from the seed instead of storing it. The seed is a one-element
// int64 tensor, drawn by the caller on the CPU's generator: a traced graph then draws it on every
// call, where a number would be a constant of the graph.
//
// Why: on CPUs where PyTorch does not take MKL's vectorised generator (AMD's), bernoulli_ draws
// element by element from one locked Mersenne Twister, about 4 ns an element: DeLighT's many
// dropouts (after each GLT of every DExTra unit) spent a quarter of a small model's training step
// there. The mix here vectorises (integer multiplies, shifts and xors) and runs on every thread;
// the mask depends on the seed and the index only, so not on the thread count.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.h"

#ifdef LIGHTNETS_AVX512
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#endif

namespace {

// murmur3's 32-bit finaliser over the index, keyed before and after by the seed's two halves
inline uint32_t mix(uint32_t i, uint32_t key0, uint32_t key1) {
  uint32_t v = i * 0x9E3779B9u + key0;
  v ^= v >> 16;
  v *= 0x85EBCA6Bu;
  v ^= v >> 13;
  v *= 0xC2B2AE35u;
  v ^= v >> 16;
  v ^= key1;
  v *= 0x27D4EB2Du;
  v ^= v >> 15;
  return v;
}

// out[i] = in[i] * mask / (1 - p) for the n elements from index `start`: a function of its own
// with a 32-bit counter, the form GCC vectorises (inside the parallel lambda, or with a 64-bit
// counter, the loop stays scalar)
void scale_range(const float* __restrict__ in, float* __restrict__ out, int32_t n, uint32_t start,
                 uint32_t key0, uint32_t key1, uint32_t threshold, float scale) {
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t h = mix(start + static_cast<uint32_t>(i), key0, key1);
    out[i] = h >= threshold ? in[i] * scale : 0.f;
  }
}

void scale_kept(const float* src, float* dst, int64_t n, double p, int64_t seed) {
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  // kept when mix >= threshold: probability 1 - threshold / 2^32 = 1 - p, to 2^-32
  const uint32_t threshold = static_cast<uint32_t>(std::llround(p * 4294967296.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  at::parallel_for(0, n, 16384, [=](int64_t begin, int64_t end) {
    for (int64_t a = begin; a < end; a += int64_t{1} << 30) {
      const auto count = static_cast<int32_t>(std::min(end - a, int64_t{1} << 30));
      scale_range(src + a, dst + a, count, static_cast<uint32_t>(a), key0, key1, threshold, scale);
    }
  });
}

// The seed's value, after both operands are checked
int64_t check(const char* op, const at::Tensor& x, const char* name, double p,
              const at::Tensor& seed) {
  lightnets::check_operand(op, x, name, x.dim(), "(any shape)");
  TORCH_CHECK(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p);
  TORCH_CHECK(x.numel() <= (int64_t{1} << 32), op, ": ", name, " of shape ", x.sizes(),
              " has more than 2^32 elements, past the mask's index");
  TORCH_CHECK(seed.device().is_cpu() && seed.scalar_type() == at::kLong && seed.numel() == 1, op,
              ": seed must be a one-element int64 CPU tensor, got ", seed.scalar_type(),
              " of shape ", seed.sizes(), " on ", seed.device());
  return seed.data_ptr<int64_t>()[0];
}

// y = x * mask / (1 - p)
at::Tensor dropout_forward(const at::Tensor& x, double p, const at::Tensor& seed) {
  const int64_t key = check("dropout_forward", x, "x", p, seed);
  at::Tensor y = at::empty_like(x);
  scale_kept(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), p, key);
  return y;
}

// grad_x = grad_y * mask / (1 - p), the forward's mask for the same seed and size
at::Tensor dropout_backward(const at::Tensor& grad_y, double p, const at::Tensor& seed) {
  const int64_t key = check("dropout_backward", grad_y, "grad_y", p, seed);
  at::Tensor grad_x = at::empty_like(grad_y);
  scale_kept(grad_y.data_ptr<float>(), grad_x.data_ptr<float>(), grad_y.numel(), p, key);
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def("dropout_forward(Tensor x, float p, Tensor seed) -> Tensor", &dropout_forward);
  m.def("dropout_backward(Tensor grad_y, float p, Tensor seed) -> Tensor", &dropout_backward);
}
