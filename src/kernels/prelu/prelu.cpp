// PReLU's backward in one pass (training): for y = x where x > 0 and a_c x elsewhere,
//   grad_x = grad_y where x > 0, a_c grad_y elsewhere
//   grad_a_c = sum over channel c's elements with x <= 0 of x grad_y
// ATen's CPU kernel writes a per-element slope gradient and sums it afterwards, at about 2 ns an
// element on 2 cores (a quarter of a DiCENet training step); here each element is read once and
// the slope gradient is summed as it goes. Two layouts, chosen by the caller's view of x:
//   (B, C, S): channel-major (a contiguous NC... tensor), each (b, c) plane of S elements a run;
//   (R, C):    channel-minor (channels-last, or a (B, C) matrix), a row holds every channel.
// The slope gradient is summed per plane or per fixed block of rows (a function of the sizes only)
// and the partial sums are added in order, so it does not depend on the thread count.
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
#include <cstring>
#include <tuple>
#include <vector>

#include "common.h"

namespace {

using namespace lightnets;  // the shared helpers of common.h

// grad_x of one run of n elements sharing slope a; returns sum of min(x, 0) grad_y over the run.
// Branch-free: built without trapping math, the comparison is a vector select (with branches, 4 ns
// an element on random signs); `omp simd` lets the sum vectorise (a fixed order for a given build).
template <typename T>
inline float plane_backward(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                            float a, int64_t n) {
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; ++j) {
    const float v = load(x, j), g = load(dy, j);
    const float factor = v > 0.f ? 1.f : a;
    store(dx, j, factor * g);
    total += std::min(v, 0.f) * g;
  }
  return total;
}

// (B, C, S): partial[b, c] is plane (b, c)'s sum
template <typename T>
void backward_planes(const T* dys, const T* xs, const T* weight, T* dxs, float* partial,
                     int64_t B, int64_t C, int64_t S) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(S, 1));
  at::parallel_for(0, B * C, grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float a = static_cast<float>(weight[p % C]);
      partial[p] = plane_backward(dys + p * S, xs + p * S, dxs + p * S, a, S);
    }
  });
}

// (R, C): partial[block, c] sums channel c over the block's rows
template <typename T>
void backward_rows(const T* dys, const T* xs, const T* weight, T* dxs, float* partial, int64_t R,
                   int64_t C) {
  const int64_t blocks = row_blocks(R, C);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> slopes(C);
    for (int64_t c = 0; c < C; ++c) slopes[c] = static_cast<float>(weight[c]);
    const float* __restrict__ a = slopes.data();
    for (int64_t block = first; block < last; ++block) {
      float* __restrict__ acc = partial + block * C;
      const int64_t row_end = (block + 1) * R / blocks;
      for (int64_t r = block * R / blocks; r < row_end; ++r) {
        const T* __restrict__ x = xs + r * C;
        const T* __restrict__ dy = dys + r * C;
        T* __restrict__ dx = dxs + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float v = load(x, c), g = load(dy, c);
          const float factor = v > 0.f ? 1.f : a[c];
          store(dx, c, factor * g);
          acc[c] += std::min(v, 0.f) * g;
        }
      }
    }
  });
}

template <typename T>
void run(const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& weight,
         at::Tensor& grad_x, at::Tensor& partial) {
  const T* dy = grad_y.data_ptr<T>();
  const T* xs = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* dx = grad_x.data_ptr<T>();
  if (x.dim() == 3)
    backward_planes(dy, xs, w, dx, partial.data_ptr<float>(), x.size(0), x.size(1), x.size(2));
  else
    backward_rows(dy, xs, w, dx, partial.data_ptr<float>(), x.size(0), x.size(1));
}

std::tuple<at::Tensor, at::Tensor> prelu_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                  const at::Tensor& weight) {
  constexpr const char* kOp = "prelu_backward";
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, kOp,
              ": x must be (B, C, S) (channel-major) or (R, C) (channel-minor), got shape ",
              x.sizes());
  const char* dims = x.dim() == 3 ? "(B, C, S)" : "(R, C)";
  check_dense(kOp, x, "x", x.dim(), dims);
  TORCH_CHECK(grad_y.sizes().equals(x.sizes()), kOp, ": grad_y has shape ", grad_y.sizes(),
              ", expected x's shape ", x.sizes());
  check_dense(kOp, grad_y, "grad_y", x.dim(), dims);
  check_dense(kOp, weight, "weight", 1, "(C,)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, kOp,
              ": x must be float32, bfloat16 or float16, got ", dtype);
  const char* dtype_name =
      dtype == at::kFloat ? "float32" : dtype == at::kBFloat16 ? "bfloat16" : "float16";
  TORCH_CHECK(grad_y.scalar_type() == dtype, kOp, ": grad_y must be ", dtype_name,
              " as x, got ", grad_y.scalar_type());
  TORCH_CHECK(weight.scalar_type() == dtype, kOp, ": weight must be ", dtype_name,
              " as x, got ", weight.scalar_type());
  const int64_t C = x.size(1);
  check_shape(kOp, weight, "weight", {C}, "(C,), C of x ", x.sizes());

  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const int64_t parts = x.dim() == 3 ? x.size(0) : row_blocks(x.size(0), C);
  // (parts, C): each batch entry's (channel-major) or row block's (channel-minor) partial sums
  at::Tensor partial = at::zeros({std::max<int64_t>(parts, 1), C}, x.options().dtype(at::kFloat));
  switch (dtype) {
    case at::kFloat:
      run<float>(grad_y, x, weight, grad_x, partial);
      break;
    case at::kBFloat16:
      run<c10::BFloat16>(grad_y, x, weight, grad_x, partial);
      break;
    default:
      run<c10::Half>(grad_y, x, weight, grad_x, partial);
  }
  // the partial sums, added in order
  at::Tensor grad_weight = at::zeros({C}, x.options().dtype(at::kFloat));
  float* total = grad_weight.data_ptr<float>();
  const float* part = partial.data_ptr<float>();
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t c = 0; c < C; ++c) total[c] += part[p * C + c];
  return {grad_x, grad_weight};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightnets_cpu, m) {
  m.def("prelu_backward(Tensor grad_y, Tensor x, Tensor weight) -> (Tensor, Tensor)",
        &prelu_backward);
}
