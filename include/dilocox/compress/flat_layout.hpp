// dilocox/compress/flat_layout.hpp: the tensors of one sync laid end to end in one flat
// vector, each starting on an `align` boundary (so no quantization block mixes two
// tensors), and the gather/scatter between that vector and the tensors. Shared by the
// compressors that reduce everything in one payload. Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "dilocox/config.hpp"

namespace dilocox {

class FlatLayout {
 public:
  // Offsets for tensors of these lengths; reuses its storage (no allocation once grown).
  void assign(std::span<const std::size_t> lengths, std::size_t align) {
    detail::require(align >= 1, "FlatLayout", "align must be >= 1");
    offset_.clear();
    length_.assign(lengths.begin(), lengths.end());
    total_ = 0;
    for (std::size_t n : lengths) {
      offset_.push_back(total_);
      total_ += (n + align - 1) / align * align;
    }
  }
  std::size_t size() const { return length_.size(); }
  std::size_t total() const { return total_; }
  std::size_t offset(std::size_t j) const { return offset_[j]; }
  std::size_t length(std::size_t j) const { return length_[j]; }
  template <class T>
  std::span<T> part(std::span<T> flat, std::size_t j) const {
    return flat.subspan(offset_[j], length_[j]);
  }

  // flat (total) = the parts end to end, zeros in the padding.
  void gather(std::span<const std::span<float>> parts, std::vector<float>& flat) const {
    flat.assign(total_, 0.0f);
    for (std::size_t j = 0; j < length_.size(); ++j)
      std::copy_n(parts[j].begin(), length_[j], flat.begin() + static_cast<std::ptrdiff_t>(offset_[j]));
  }
  // parts[j] = the j-th part of flat.
  void scatter(std::span<const float> flat, std::span<const std::span<float>> parts) const {
    for (std::size_t j = 0; j < length_.size(); ++j)
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(offset_[j]), length_[j], parts[j].begin());
  }

 private:
  std::vector<std::size_t> offset_, length_;
  std::size_t total_ = 0;
};

}  // namespace dilocox
