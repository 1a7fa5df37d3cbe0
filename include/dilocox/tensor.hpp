// dilocox/tensor.hpp: memory spaces, the row-major MatrixView, the Tensor concept
// (through tensor_traits), adapters for std::vector / std::span / raw pointer + shape,
// and the reshape rule (first dim x the rest). Views never own and never copy:
// a type that is not contiguous does not satisfy Tensor. Eigen adapters live in
// tensor_eigen.hpp so that this header needs only the standard library.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dilocox/config.hpp"

namespace dilocox {

struct host_space {};
struct cuda_space {};

// A contiguous row-major matrix that the view does not own.
template <class T, class Space = host_space>
struct MatrixView {
  using element_type = T;
  using memory_space = Space;
  T* data = nullptr;  // (rows, cols) row-major, in Space
  std::size_t rows = 0, cols = 0;

  DILOCOX_HOST_DEVICE constexpr std::size_t size() const { return rows * cols; }
  DILOCOX_HOST_DEVICE constexpr T& operator()(std::size_t r, std::size_t c) const {
    return data[r * cols + c];
  }
  // A MatrixView<T> converts to MatrixView<const T>.
  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  constexpr operator MatrixView<U, Space>() const {
    return {data, rows, cols};
  }
  std::span<T> span() const
    requires std::is_same_v<Space, host_space>
  {
    return {data, rows * cols};
  }
};

// The most dimensions a Shape holds; enough for every tensor of a transformer.
inline constexpr std::size_t max_ndim = 6;

struct Shape {
  std::array<std::size_t, max_ndim> dims{};
  std::size_t ndim = 0;  // number of dimensions (not a matrix rank)

  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<std::size_t> d) {
    if (d.size() > max_ndim) throw Error("Shape: more than " + std::to_string(max_ndim) + " dimensions");
    for (std::size_t v : d) dims[ndim++] = v;
  }
  constexpr std::size_t operator[](std::size_t i) const { return dims[i]; }
  constexpr std::size_t numel() const {
    std::size_t n = 1;
    for (std::size_t i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.ndim != b.ndim) return false;
    for (std::size_t i = 0; i < a.ndim; ++i)
      if (a.dims[i] != b.dims[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "(";
    for (std::size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + ")";
  }
};

// A raw pointer with a shape: the adapter for any contiguous buffer, host or device.
template <class T, class Space = host_space>
struct TensorView {
  T* data = nullptr;  // shape.numel() elements, row-major, in Space
  Shape shape;
  // A TensorView<T> converts to TensorView<const T>.
  template <class U>
    requires(std::is_same_v<U, const T> && !std::is_const_v<T>)
  constexpr operator TensorView<U, Space>() const {
    return {data, shape};
  }
};

// tensor_traits<T> tells how to see T as a contiguous tensor. Specialize it for your
// own types: element_type, memory_space, data(t), numel(t), shape(t).
template <class T>
struct tensor_traits;  // undefined: T is not a tensor

template <class E, class A>
struct tensor_traits<std::vector<E, A>> {
  using element_type = E;
  using memory_space = host_space;
  static E* data(std::vector<E, A>& v) { return v.data(); }
  static const E* data(const std::vector<E, A>& v) { return v.data(); }
  static std::size_t numel(const std::vector<E, A>& v) { return v.size(); }
  static Shape shape(const std::vector<E, A>& v) { return {v.size()}; }
};

template <class E, std::size_t N>
struct tensor_traits<std::span<E, N>> {
  using element_type = std::remove_const_t<E>;
  using memory_space = host_space;
  static E* data(std::span<E, N> s) { return s.data(); }
  static std::size_t numel(std::span<E, N> s) { return s.size(); }
  static Shape shape(std::span<E, N> s) { return {s.size()}; }
};

template <class E, class S>
struct tensor_traits<TensorView<E, S>> {
  using element_type = std::remove_const_t<E>;
  using memory_space = S;
  static E* data(const TensorView<E, S>& t) { return t.data; }
  static std::size_t numel(const TensorView<E, S>& t) { return t.shape.numel(); }
  static Shape shape(const TensorView<E, S>& t) { return t.shape; }
};

template <class E, class S>
struct tensor_traits<MatrixView<E, S>> {
  using element_type = std::remove_const_t<E>;
  using memory_space = S;
  static E* data(const MatrixView<E, S>& m) { return m.data; }
  static std::size_t numel(const MatrixView<E, S>& m) { return m.size(); }
  static Shape shape(const MatrixView<E, S>& m) { return {m.rows, m.cols}; }
};

// A type is a Tensor when tensor_traits describes it as contiguous storage.
template <class T>
concept Tensor = requires(T& t) {
  typename tensor_traits<std::remove_cvref_t<T>>::element_type;
  typename tensor_traits<std::remove_cvref_t<T>>::memory_space;
  { tensor_traits<std::remove_cvref_t<T>>::data(t) };
  { tensor_traits<std::remove_cvref_t<T>>::numel(t) } -> std::convertible_to<std::size_t>;
  { tensor_traits<std::remove_cvref_t<T>>::shape(t) } -> std::same_as<Shape>;
};

template <Tensor T>
using element_type_t = typename tensor_traits<std::remove_cvref_t<T>>::element_type;
template <Tensor T>
using memory_space_t = typename tensor_traits<std::remove_cvref_t<T>>::memory_space;

template <Tensor T>
auto tensor_data(T& t) {
  return tensor_traits<std::remove_cvref_t<T>>::data(t);
}
template <Tensor T>
std::size_t tensor_numel(const T& t) {
  return tensor_traits<std::remove_cvref_t<T>>::numel(const_cast<T&>(t));
}
template <Tensor T>
Shape tensor_shape(const T& t) {
  return tensor_traits<std::remove_cvref_t<T>>::shape(const_cast<T&>(t));
}

// The reshape rule: a tensor of shape (d0, d1, ..., dk) is the matrix
// (d0, d1*...*dk). A vector (n) is (n, 1); a scalar is (1, 1).
constexpr std::array<std::size_t, 2> matrix_shape(const Shape& s) {
  if (s.ndim == 0) return {1, 1};
  const std::size_t rows = s.dims[0];
  std::size_t cols = 1;
  for (std::size_t i = 1; i < s.ndim; ++i) cols *= s.dims[i];
  return {rows, cols};
}

template <Tensor T>
auto as_matrix(T& t) {
  using E = std::remove_pointer_t<decltype(tensor_data(t))>;
  const auto [rows, cols] = matrix_shape(tensor_shape(t));
  return MatrixView<E, memory_space_t<T>>{tensor_data(t), rows, cols};
}

// A host tensor's elements as a flat span.
template <Tensor T>
  requires std::is_same_v<memory_space_t<T>, host_space>
auto as_span(T& t) {
  using E = std::remove_pointer_t<decltype(tensor_data(t))>;
  return std::span<E>(tensor_data(t), tensor_numel(t));
}

}  // namespace dilocox
