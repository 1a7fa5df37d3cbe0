// Compile check (no GPU needed): every DILOCOX_HOST_DEVICE helper that the CUDA path
// will share with the host (rounding, scales, the counter RNG, fp16/bf16 conversion,
// MatrixView) instantiated in device code for the configured architectures. A header
// change that breaks nvcc fails the build here.
#include <dilocox/half.hpp>
#include <dilocox/quantize.hpp>
#include <dilocox/random.hpp>
#include <dilocox/tensor.hpp>

namespace dx = dilocox;

__global__ void quantize_helpers(const float* x, int* codes, float* scales, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = dx::detail::block_scale(fabsf(x[i]), 4, dx::ScaleFormat::bf16);
  const dx::detail::BlockRatio r = dx::detail::block_ratio(s);
  const float v = dx::detail::clamp_ratio(r.divide ? x[i] / r.scale : x[i] * r.inv, 7.0f);
  const float u = dx::bits_to_unit(dx::counter_bits(dx::counter_key(7, i), i));
  codes[i] = dx::detail::round_nearest(v) + dx::detail::round_stochastic(v, u, 7);
  scales[i] = s + dx::counter_uniform(3, i) + dx::counter_normal(3, i);
}

__global__ void conversions(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = dx::half_to_float(dx::float_to_half(x[i])) + dx::bf16_to_float(dx::float_to_bf16(x[i]));
}

__global__ void matrix_view(dx::MatrixView<float, dx::cuda_space> m) {
  const auto r = static_cast<std::size_t>(blockIdx.x), c = static_cast<std::size_t>(threadIdx.x);
  if (r < m.rows && c < m.cols) m(r, c) = static_cast<float>(dx::num_blocks(m.size(), 128) + dx::code_bytes(c, 4));
}
