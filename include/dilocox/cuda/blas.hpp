// dilocox/cuda/blas.hpp: cuBLAS and cuSOLVER handles (RAII, bound to a stream) and
// status checks that throw dilocox::Error, plus gemm_rm: a row-major GEMM written as
// the column-major call it is (C^T = op(B)^T op(A)^T). Host code; links cublas/cusolver.
// Not here: kernels, NCCL.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <string>
#include <utility>

#include "dilocox/cuda/check.hpp"

namespace dilocox::cuda {

inline void check(cublasStatus_t rc, const char* where, const char* what) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string(where) + ": " + what + ": " + cublasGetStatusString(rc));
}

inline void check(cusolverStatus_t rc, const char* where, const char* what) {
  if (rc == CUSOLVER_STATUS_SUCCESS) return;
  throw Error(std::string(where) + ": " + what + ": cuSOLVER status " + std::to_string(static_cast<int>(rc)));
}

class BlasHandle {
 public:
  explicit BlasHandle(cudaStream_t s = nullptr) {
    check(cublasCreate(&h_), "BlasHandle", "cublasCreate");
    check(cublasSetStream(h_, s), "BlasHandle", "cublasSetStream");
  }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  ~BlasHandle() {
    if (h_) cublasDestroy(h_);
  }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

class SolverHandle {
 public:
  explicit SolverHandle(cudaStream_t s = nullptr) {
    check(cusolverDnCreate(&h_), "SolverHandle", "cusolverDnCreate");
    check(cusolverDnSetStream(h_, s), "SolverHandle", "cusolverDnSetStream");
  }
  SolverHandle(const SolverHandle&) = delete;
  SolverHandle& operator=(const SolverHandle&) = delete;
  ~SolverHandle() {
    if (h_) cusolverDnDestroy(h_);
  }
  cusolverDnHandle_t get() const { return h_; }

 private:
  cusolverDnHandle_t h_ = nullptr;
};

// Row-major C (m, n) = alpha op(A) op(B) + beta C, op(A) (m, k), op(B) (k, n); lda, ldb,
// ldc are row strides of the stored matrices. Types and compute type as cublasGemmEx.
struct GemmTypes {
  cudaDataType_t a = CUDA_R_32F, b = CUDA_R_32F, c = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

// The column-major call that computes a row-major product: C^T = op(B)^T op(A)^T, so
// cuBLAS gets B first with the dimensions swapped. Separate so a host test can check it.
struct ColumnMajorCall {
  cublasOperation_t op_first, op_second;  // applied to B, then A
  int m, n, k;                            // cuBLAS's m, n, k
};
inline ColumnMajorCall column_major_call(bool trans_a, bool trans_b, int m, int n, int k) {
  return {trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k};
}

inline void gemm_rm(cublasHandle_t h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* A,
                    int lda, const void* B, int ldb, float beta, void* C, int ldc, GemmTypes t, const char* where) {
  const ColumnMajorCall c = column_major_call(trans_a, trans_b, m, n, k);
  check(cublasGemmEx(h, c.op_first, c.op_second, c.m, c.n, c.k, &alpha, B, t.b, ldb, A, t.a, lda, &beta, C, t.c, ldc,
                     t.compute, CUBLAS_GEMM_DEFAULT),
        where, "cublasGemmEx");
}

// The same over `batch` matrices at fixed element strides.
inline void gemm_rm_batched(cublasHandle_t h, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            const void* A, int lda, long long stride_a, const void* B, int ldb, long long stride_b,
                            float beta, void* C, int ldc, long long stride_c, int batch, GemmTypes t,
                            const char* where) {
  const ColumnMajorCall c = column_major_call(trans_a, trans_b, m, n, k);
  check(cublasGemmStridedBatchedEx(h, c.op_first, c.op_second, c.m, c.n, c.k, &alpha, B, t.b, ldb, stride_b, A, t.a,
                                   lda, stride_a, &beta, C, t.c, ldc, stride_c, batch, t.compute, CUBLAS_GEMM_DEFAULT),
        where, "cublasGemmStridedBatchedEx");
}

}  // namespace dilocox::cuda
