// dilocox/named_tensor.hpp: NamedTensor, one parameter tensor the outer loop keeps a
// view of (name, shape, the trainer's live floats), and named(), which makes one from
// anything the Tensor concept accepts, with one short error for what it does not.
// Not here: the loop (diloco.hpp), the Tensor concept (tensor.hpp).
#pragma once

#include <concepts>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "dilocox/tensor.hpp"

namespace dilocox {

struct NamedTensor {
  std::string name;
  Shape shape;
  std::span<float> data;  // phi: the trainer's live parameters, host, shape.numel() floats
};

// A NamedTensor from anything the Tensor concept accepts (std::vector + shape through
// TensorView, std::span, Eigen matrices and maps of either storage order): the shape
// comes from the type (a column-major (r, c) Eigen matrix is the tensor (c, r), its
// memory order), never from the caller. Strided views do not compile.
template <Tensor T>
  requires std::same_as<element_type_t<T>, float> && std::same_as<memory_space_t<T>, host_space>
NamedTensor named(std::string name, T& tensor) {
  return {std::move(name), tensor_shape(tensor), as_span(tensor)};
}
// A raw buffer with its shape (e.g. a std::vector<float> holding a (rows, cols) matrix).
inline NamedTensor named(std::string name, TensorView<float> view) {
  return {std::move(name), view.shape, {view.data, view.shape.numel()}};
}
// A temporary (an m.block(...), an expression, a Map made in the call): one short error.
template <class T>
  requires(!std::is_lvalue_reference_v<T>)
NamedTensor named(std::string, T&&) {
  static_assert(sizeof(T) == 0,
                "dilocox::named: pass the parameter tensor itself, a named object (an lvalue): the loop keeps a "
                "view of its memory, which a temporary's may not outlive (a raw buffer: dilocox::TensorView)");
  return {};
}
// Anything else: one short error instead of a page of template diagnostics.
template <class T>
NamedTensor named(std::string, T&) {
  static_assert(Tensor<T>,
                "dilocox::named: this type is not a dilocox::Tensor (contiguous host floats): a strided view, block "
                "or expression is not; pass a contiguous copy, or specialize dilocox::tensor_traits for your type");
  static_assert(!Tensor<T>, "dilocox::named: a dilocox::Tensor of float in host memory is needed");
  return {};
}

}  // namespace dilocox
