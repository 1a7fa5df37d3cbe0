// dilocox/cuda/lowrank.cuh: the PowerSGD projector on the device: P = X Q, Q = X^T P
// and P Q^T as cuBLAS GEMMs (fp32), P orthonormalized by cuSOLVER's Householder QR
// (geqrf + orgqr) with the signs fixed so that R has a non-negative diagonal: the same
// basis the host's Gram-Schmidt gives, to rounding. The hot path (left, orthonormalize,
// right, reconstruct) only enqueues work on the projector's stream; singular_values(),
// sketch_energy(), set_rank() and the state calls synchronize (they return host data).
// Differences from the host projector (lowrank.hpp): a column that vanishes (zero or
// dependent input) becomes Householder's completion of the basis, not a random
// direction; replaced_columns() counts such columns all the same.
#pragma once

#include <cuda_runtime.h>

#include <Eigen/Core>
#include <Eigen/Eigenvalues>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dilocox/cuda/blas.hpp"
#include "dilocox/cuda/check.hpp"
#include "dilocox/cuda/memory.hpp"
#include "dilocox/lowrank.hpp"
#include "dilocox/random.hpp"
#include "dilocox/state.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox::cuda {

namespace kernels {

// m[i] = standard normal for counter first + i under seed (the host's fill_random).
template <class T>
__global__ void fill_normal(T* m, std::size_t n, std::uint64_t seed, std::uint64_t first) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    m[i] = static_cast<T>(counter_normal(seed, first + i));
}

// Column-major (rows, r) <- row-major (rows, r), and each column's norm.
template <class T>
__global__ void to_columns(T* __restrict__ pc, const T* __restrict__ p, std::size_t rows, int r, T* norms) {
  const int j = blockIdx.x;
  T sum = 0;
  for (std::size_t i = threadIdx.x; i < rows; i += blockDim.x) {
    const T v = p[i * r + j];
    pc[i + j * rows] = v;
    sum += v * v;
  }
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    T s = 0;
    for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) s += part[w];
    norms[j] = sqrt(s);
  }
}

// After geqrf: sign[j] = sign(R_jj) (+1 for 0); counts columns whose R_jj vanished
// (<= tiny, or <= fraction of the column's norm before orthogonalization).
template <class T>
__global__ void qr_signs(const T* __restrict__ qr, std::size_t rows, int r, const T* __restrict__ norms, T* sign,
                         T tiny, T fraction, unsigned long long* vanished) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= r) return;
  const T d = qr[static_cast<std::size_t>(j) + static_cast<std::size_t>(j) * rows];
  sign[j] = d < T(0) ? T(-1) : T(1);
  const T a = fabs(d);
  if (!(a > tiny && a > fraction * norms[j])) atomicAdd(vanished, 1ULL);
}

// Row-major (rows, r) <- column-major Q (rows, r) with column j multiplied by sign[j].
template <class T>
__global__ void from_columns(T* __restrict__ p, const T* __restrict__ q, std::size_t rows, int r,
                             const T* __restrict__ sign) {
  const std::size_t n = rows * static_cast<std::size_t>(r), stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t k = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; k < n; k += stride) {
    const std::size_t i = k / static_cast<std::size_t>(r);
    const int j = static_cast<int>(k % static_cast<std::size_t>(r));
    p[k] = q[i + static_cast<std::size_t>(j) * rows] * sign[j];
  }
}

}  // namespace kernels

class PowerIterationProjector {
 public:
  PowerIterationProjector(std::size_t rows, std::size_t cols, LowRankConfig config, cudaStream_t stream = nullptr)
      : rows_(rows), cols_(cols), config_(config), stream_(stream), blas_(stream), solver_(stream), vanished_(1) {
    detail::check_projector_config(rows, cols, config, "cuda::PowerIterationProjector");
    vanished_.zero(stream_);
    resize(checked_rank(config.rank));
    fill_random(q_.data(), q_.size(), 0);
  }

  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }
  int rank() const { return rank_; }
  const LowRankConfig& config() const { return config_; }
  cudaStream_t stream() const { return stream_; }

  // P = X Q: P (rows, r) row-major on the device, which the caller may reduce in place.
  MatrixView<float, cuda_space> left(MatrixView<const float, cuda_space> x) {
    check_input(x, "left");
    if (!config_.warm_start) fill_random(q_.data(), q_.size(), ++draws_);
    gemm_rm(blas_.get(), false, false, static_cast<int>(rows_), rank_, static_cast<int>(cols_), 1.0f, x.data,
            static_cast<int>(cols_), q_.data(), rank_, 0.0f, p_.data(), rank_, {}, "cuda::PowerIterationProjector::left");
    return {p_.data(), rows_, static_cast<std::size_t>(rank_)};
  }

  // P <- the orthonormal basis of span(P) whose R has a non-negative diagonal.
  void orthonormalize_left() {
    const char* where = "cuda::PowerIterationProjector::orthonormalize_left";
    const int m = static_cast<int>(rows_);
    kernels::to_columns<<<rank_, 256, 0, stream_>>>(pc_.data(), p_.data(), rows_, rank_, norms_.data());
    check_launch(where);
    check(cusolverDnSgeqrf(solver_.get(), m, rank_, pc_.data(), m, tau_.data(), work_.data(),
                           static_cast<int>(work_.size()), info_.data()),
          where, "cusolverDnSgeqrf");
    kernels::qr_signs<<<grid_size(static_cast<std::size_t>(rank_), 256), 256, 0, stream_>>>(
        pc_.data(), rows_, rank_, norms_.data(), sign_.data(), detail::vanishing_norm(config_), detail::dependent_fraction,
        reinterpret_cast<unsigned long long*>(vanished_.data()));
    check_launch(where);
    check(cusolverDnSorgqr(solver_.get(), m, rank_, rank_, pc_.data(), m, tau_.data(), work_.data(),
                           static_cast<int>(work_.size()), info_.data()),
          where, "cusolverDnSorgqr");
    kernels::from_columns<<<grid_size(p_.size(), 256), 256, 0, stream_>>>(p_.data(), pc_.data(), rows_, rank_,
                                                                         sign_.data());
    check_launch(where);
    ++draws_;
  }

  // Q = X^T P: Q (cols, r) row-major on the device, which the caller may reduce in place.
  MatrixView<float, cuda_space> right(MatrixView<const float, cuda_space> x) {
    check_input(x, "right");
    gemm_rm(blas_.get(), true, false, static_cast<int>(cols_), rank_, static_cast<int>(rows_), 1.0f, x.data,
            static_cast<int>(cols_), p_.data(), rank_, 0.0f, q_.data(), rank_, {}, "cuda::PowerIterationProjector::right");
    return {q_.data(), cols_, static_cast<std::size_t>(rank_)};
  }

  // out = P Q^T, (rows, cols) row-major on the device.
  void reconstruct(MatrixView<float, cuda_space> out) const {
    detail::check_projector_operand(out, rows_, cols_, "cuda::PowerIterationProjector::reconstruct", "output");
    gemm_rm(blas_.get(), false, true, static_cast<int>(rows_), static_cast<int>(cols_), rank_, 1.0f, p_.data(), rank_,
            q_.data(), rank_, 0.0f, out.data, static_cast<int>(cols_), {}, "cuda::PowerIterationProjector::reconstruct");
  }

  void approximate(MatrixView<const float, cuda_space> x, MatrixView<float, cuda_space> out) {
    left(x);
    orthonormalize_left();
    right(x);
    reconstruct(out);
  }

  // Estimates of the top r singular values, descending (after right()). Synchronizes.
  std::span<const float> singular_values() const {
    gemm_rm(blas_.get(), true, false, rank_, rank_, static_cast<int>(cols_), 1.0f, q_.data(), rank_, q_.data(), rank_,
            0.0f, gram_.data(), rank_, {}, "cuda::PowerIterationProjector::singular_values");
    std::vector<float> g(static_cast<std::size_t>(rank_) * rank_);
    copy_to_host(std::span<float>(g), gram_.data(), stream_, "cuda::PowerIterationProjector::singular_values");
    synchronize("singular_values");
    const Eigen::MatrixXd gd = Eigen::Map<const Eigen::MatrixXf>(g.data(), rank_, rank_).cast<double>();
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(gd, Eigen::EigenvaluesOnly);
    sigma_.resize(static_cast<std::size_t>(rank_));
    for (int i = 0; i < rank_; ++i)
      sigma_[static_cast<std::size_t>(i)] = static_cast<float>(std::sqrt(std::max(0.0, es.eigenvalues()[rank_ - 1 - i])));
    return sigma_;
  }

  // ||Q||_F^2. Synchronizes.
  double sketch_energy() const {
    float s = 0;
    check(cublasSnrm2(blas_.get(), static_cast<int>(q_.size()), q_.data(), 1, &s), "cuda::PowerIterationProjector",
          "cublasSnrm2");  // host pointer mode: returns after the result is ready
    return static_cast<double>(s) * s;
  }

  // As the host projector's set_rank (the same numbers for the same Q). Synchronizes, allocates.
  void set_rank(int r) {
    r = checked_rank(r);
    if (r == rank_) return;
    const detail::RowMatrixF q = detail::resized_factor(download_q(), r, config_.seed ^ PowerIterationProjectorHost::growth_salt, draws_);
    resize(r);
    upload_q(q);
    config_.rank = r;
  }

  MatrixView<float, cuda_space> left_factor() { return {p_.data(), rows_, static_cast<std::size_t>(rank_)}; }
  MatrixView<float, cuda_space> right_factor() { return {q_.data(), cols_, static_cast<std::size_t>(rank_)}; }

  // The host projector's state format: rank, draw counters, Q. Synchronize.
  void save_state(StateWriter& w) const {
    const detail::RowMatrixF q = download_q();
    w.value<std::int32_t>(rank_);
    w.value(draws_);
    w.value(replaced_columns());
    w.values(std::span<const float>(q.data(), static_cast<std::size_t>(q.size())));
  }
  void load_state(StateReader& r) {
    const int rank = r.value<std::int32_t>();
    if (rank != rank_) resize(checked_rank(rank)), config_.rank = rank;
    draws_ = r.value<std::uint64_t>();
    const std::uint64_t replaced = r.value<std::uint64_t>();
    detail::RowMatrixF q(static_cast<Eigen::Index>(cols_), rank_);
    r.values(std::span<float>(q.data(), static_cast<std::size_t>(q.size())));
    upload_q(q);
    check(cudaMemcpyAsync(vanished_.data(), &replaced, sizeof replaced, cudaMemcpyHostToDevice, stream_),
          "cuda::PowerIterationProjector::load_state", "cudaMemcpyAsync");
    synchronize("load_state");
  }

  // Columns that vanished in orthonormalize_left() so far. Synchronizes.
  std::uint64_t replaced_columns() const {
    std::uint64_t v = 0;
    copy_to_host(std::span<std::uint64_t>(&v, 1), vanished_.data(), stream_, "cuda::PowerIterationProjector");
    synchronize("replaced_columns");
    return v;
  }

 private:
  using PowerIterationProjectorHost = dilocox::PowerIterationProjector;

  int checked_rank(int r) const {
    return detail::checked_projector_rank(rows_, cols_, r, "cuda::PowerIterationProjector");
  }

  void resize(int r) {
    rank_ = r;
    const auto ru = static_cast<std::size_t>(r);
    p_.resize(rows_ * ru);
    pc_.resize(rows_ * ru);
    q_.resize(cols_ * ru);
    tau_.resize(ru);
    norms_.resize(ru);
    sign_.resize(ru);
    gram_.resize(ru * ru);
    info_.resize(1);
    int lq = 0, lo = 0;
    const int m = static_cast<int>(rows_);
    check(cusolverDnSgeqrf_bufferSize(solver_.get(), m, r, pc_.data(), m, &lq), "cuda::PowerIterationProjector",
          "cusolverDnSgeqrf_bufferSize");
    check(cusolverDnSorgqr_bufferSize(solver_.get(), m, r, r, pc_.data(), m, tau_.data(), &lo),
          "cuda::PowerIterationProjector", "cusolverDnSorgqr_bufferSize");
    work_.resize(static_cast<std::size_t>(std::max({lq, lo, 1})));
  }

  void fill_random(float* m, std::size_t n, std::uint64_t draw) {
    kernels::fill_normal<<<grid_size(n, 256), 256, 0, stream_>>>(m, n, config_.seed, draw * n);
    check_launch("cuda::PowerIterationProjector");
  }

  detail::RowMatrixF download_q() const {
    detail::RowMatrixF q(static_cast<Eigen::Index>(cols_), rank_);
    copy_to_host(std::span<float>(q.data(), static_cast<std::size_t>(q.size())), q_.data(), stream_,
                 "cuda::PowerIterationProjector");
    synchronize("download");
    return q;
  }
  void upload_q(const detail::RowMatrixF& q) {
    copy_to_device(q_.data(), std::span<const float>(q.data(), static_cast<std::size_t>(q.size())), stream_,
                   "cuda::PowerIterationProjector");
    synchronize("upload");
  }

  void synchronize(const char* what) const {
    check(cudaStreamSynchronize(stream_), "cuda::PowerIterationProjector", what);
  }

  void check_input(MatrixView<const float, cuda_space> x, const char* step) const {
    detail::check_projector_operand(x, rows_, cols_, std::string("cuda::PowerIterationProjector::") + step, "input");
  }

  std::size_t rows_, cols_;
  LowRankConfig config_;
  cudaStream_t stream_;
  BlasHandle blas_;
  SolverHandle solver_;
  int rank_ = 0;
  std::uint64_t draws_ = 0;
  DeviceBuffer<float> p_;      // (rows, r) row-major: the left factor
  DeviceBuffer<float> q_;      // (cols, r) row-major: the right factor, warm start
  DeviceBuffer<float> pc_;     // (rows, r) column-major: QR workspace
  DeviceBuffer<float> tau_;    // (r) Householder scalars
  DeviceBuffer<float> norms_;  // (r) column norms before orthogonalization
  DeviceBuffer<float> sign_;   // (r) sign of R's diagonal
  mutable DeviceBuffer<float> gram_;  // (r, r) Q^T Q
  DeviceBuffer<float> work_;   // cuSOLVER workspace
  DeviceBuffer<int> info_;     // (1) cuSOLVER status
  DeviceBuffer<std::uint64_t> vanished_;  // (1) columns that vanished so far
  mutable std::vector<float> sigma_;      // (r) host
};

}  // namespace dilocox::cuda
