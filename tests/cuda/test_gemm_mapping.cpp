// tests/cuda/test_gemm_mapping.cpp (label unit, runs without a GPU): the row-major GEMM
// helper's translation into cuBLAS's column-major call (blas.hpp column_major_call),
// executed by a host model of cuBLAS's documented semantics and compared with the
// row-major product, for every transpose pair with padded strides; then the argument
// patterns the projector and the CUDA GPT use, against the math each one stands for.
#include <dilocox/cuda/blas.hpp>

#include <gtest/gtest.h>

#include <vector>

namespace {

using dilocox::cuda::column_major_call;

// cuBLAS: C (m, n) = alpha op(A) op(B) + beta C, all column-major with leading dims.
void cublas_model(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k, const double* A, int lda,
                  const double* B, int ldb, double* C, int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l) {
        const double a = opa == CUBLAS_OP_N ? A[i + l * lda] : A[l + i * lda];
        const double b = opb == CUBLAS_OP_N ? B[l + j * ldb] : B[j + l * ldb];
        s += a * b;
      }
      C[i + j * ldc] = s;
    }
}

// Row-major C = op(A) op(B) through the mapping and the cuBLAS model.
std::vector<double> via_mapping(bool ta, bool tb, int m, int n, int k, const std::vector<double>& A, int lda,
                                const std::vector<double>& B, int ldb, int ldc) {
  std::vector<double> C(static_cast<std::size_t>(m) * ldc, 0.0);
  const auto c = column_major_call(ta, tb, m, n, k);
  cublas_model(c.op_first, c.op_second, c.m, c.n, c.k, B.data(), ldb, A.data(), lda, C.data(), ldc);
  return C;
}

std::vector<double> filled(std::size_t n, int seed) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>((i * 37 + static_cast<std::size_t>(seed) * 11) % 17) - 8;
  return v;
}

}  // namespace

TEST(GemmRowMajor, EveryTransposePairWithPaddedStrides) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int m = 5, n = 3, k = 4;
      const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
      const int lda = a_cols + 2, ldb = b_cols + 1, ldc = n + 3;
      const auto A = filled(static_cast<std::size_t>(a_rows) * lda, 1), B = filled(static_cast<std::size_t>(b_rows) * ldb, 2);
      const auto C = via_mapping(ta, tb, m, n, k, A, lda, B, ldb, ldc);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double want = 0;
          for (int l = 0; l < k; ++l)
            want += (ta ? A[l * lda + i] : A[i * lda + l]) * (tb ? B[j * ldb + l] : B[l * ldb + j]);
          EXPECT_EQ(C[i * ldc + j], want) << "trans_a " << ta << " trans_b " << tb << " at " << i << ", " << j;
        }
    }
}

// The call patterns of cuda/lowrank.cuh and model/cuda/cuda_stage_model.cu.
TEST(GemmRowMajor, CallSitesComputeTheirProducts) {
  const int R = 3, M = 6, Nn = 5;  // X (M, Nn), rank R
  const auto X = filled(static_cast<std::size_t>(M) * Nn, 3), Q = filled(static_cast<std::size_t>(Nn) * R, 4);
  const auto P = filled(static_cast<std::size_t>(M) * R, 5);
  auto at = [](const std::vector<double>& v, int ld, int i, int j) { return v[static_cast<std::size_t>(i) * ld + j]; };
  // left: P = X Q
  auto got = via_mapping(false, false, M, R, Nn, X, Nn, Q, R, R);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < R; ++j) {
      double w = 0;
      for (int l = 0; l < Nn; ++l) w += at(X, Nn, i, l) * at(Q, R, l, j);
      EXPECT_EQ(at(got, R, i, j), w);
    }
  // right: Q = X^T P
  got = via_mapping(true, false, Nn, R, M, X, Nn, P, R, R);
  for (int i = 0; i < Nn; ++i)
    for (int j = 0; j < R; ++j) {
      double w = 0;
      for (int l = 0; l < M; ++l) w += at(X, Nn, l, i) * at(P, R, l, j);
      EXPECT_EQ(at(got, R, i, j), w);
    }
  // reconstruct: out = P Q^T
  got = via_mapping(false, true, M, Nn, R, P, R, Q, R, Nn);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < Nn; ++j) {
      double w = 0;
      for (int l = 0; l < R; ++l) w += at(P, R, i, l) * at(Q, R, j, l);
      EXPECT_EQ(at(got, Nn, i, j), w);
    }
  // matmul forward out (N, OC) = x (N, IC) W^T with W (OC, IC); backward dW (OC, IC) = dout^T x
  const int N = 4, IC = 3, OC = 5;
  const auto x = filled(static_cast<std::size_t>(N) * IC, 6), W = filled(static_cast<std::size_t>(OC) * IC, 7);
  const auto dout = filled(static_cast<std::size_t>(N) * OC, 8);
  got = via_mapping(false, true, N, OC, IC, x, IC, W, IC, OC);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < OC; ++j) {
      double w = 0;
      for (int l = 0; l < IC; ++l) w += at(x, IC, i, l) * at(W, IC, j, l);
      EXPECT_EQ(at(got, OC, i, j), w);
    }
  got = via_mapping(true, false, OC, IC, N, dout, OC, x, IC, IC);
  for (int i = 0; i < OC; ++i)
    for (int j = 0; j < IC; ++j) {
      double w = 0;
      for (int l = 0; l < N; ++l) w += at(dout, OC, l, i) * at(x, IC, l, j);
      EXPECT_EQ(at(got, IC, i, j), w);
    }
  // dx (N, IC) = dout (N, OC) W (OC, IC)
  got = via_mapping(false, false, N, IC, OC, dout, OC, W, IC, IC);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < IC; ++j) {
      double w = 0;
      for (int l = 0; l < OC; ++l) w += at(dout, OC, i, l) * at(W, IC, l, j);
      EXPECT_EQ(at(got, IC, i, j), w);
    }
}
