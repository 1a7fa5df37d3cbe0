// dilocox/tensor_eigen.hpp: tensor_traits for Eigen dense matrices and for Eigen::Map
// with default (contiguous) strides. Blocks, strided maps and expressions are
// deliberately not tensors: using one is a compile error, never a silent copy.
// Shape follows memory order: a column-major (r, c) matrix is the tensor (c, r).
#pragma once

#include <Eigen/Core>

#include "dilocox/tensor.hpp"

namespace dilocox {
namespace detail {
template <class M>
Shape eigen_shape(const M& m) {
  if constexpr (M::IsVectorAtCompileTime) {
    return {static_cast<std::size_t>(m.size())};
  } else if constexpr (M::IsRowMajor) {
    return {static_cast<std::size_t>(m.rows()), static_cast<std::size_t>(m.cols())};
  } else {
    return {static_cast<std::size_t>(m.cols()), static_cast<std::size_t>(m.rows())};
  }
}
}  // namespace detail

template <class S, int R, int C, int O, int MR, int MC>
struct tensor_traits<Eigen::Matrix<S, R, C, O, MR, MC>> {
  using M = Eigen::Matrix<S, R, C, O, MR, MC>;
  using element_type = S;
  using memory_space = host_space;
  static S* data(M& m) { return m.data(); }
  static const S* data(const M& m) { return m.data(); }
  static std::size_t numel(const M& m) { return static_cast<std::size_t>(m.size()); }
  static Shape shape(const M& m) { return detail::eigen_shape(m); }
};

// Only the default stride Eigen::Stride<0, 0> (contiguous) is a tensor.
template <class PlainM, int MapOptions>
struct tensor_traits<Eigen::Map<PlainM, MapOptions, Eigen::Stride<0, 0>>> {
  using M = Eigen::Map<PlainM, MapOptions, Eigen::Stride<0, 0>>;
  using element_type = std::remove_const_t<typename PlainM::Scalar>;
  using memory_space = host_space;
  static auto data(M& m) { return m.data(); }
  static auto data(const M& m) { return m.data(); }
  static std::size_t numel(const M& m) { return static_cast<std::size_t>(m.size()); }
  static Shape shape(const M& m) { return detail::eigen_shape(m); }
};

}  // namespace dilocox
