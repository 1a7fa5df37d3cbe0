// bindings/torch/tensor_shape.hpp: the library's Shape of a torch tensor's sizes, for the outer loop
// and the DDP hook alike. Callers check the number of dimensions first (max_ndim).
#pragma once

#include <torch/torch.h>

#include <dilocox/tensor.hpp>

#include <cstddef>

namespace dilocox::torch_binding {

// A 0-d tensor (a scalar parameter) is one element.
inline Shape shape_of(c10::IntArrayRef sizes) {
  Shape s;
  for (auto d : sizes) s.dims[s.ndim++] = static_cast<std::size_t>(d);
  return s.ndim == 0 ? Shape{1} : s;
}

}  // namespace dilocox::torch_binding
