// dilocox/state.hpp: StateWriter / StateReader, a small versionless byte format for
// checkpointing the library's stateful objects (projector warm starts, adaptive rank
// windows, outer momentum, error feedback, the OuterLoop's round state). Values are
// raw host bytes (same build, same machine kind); every read checks the remaining
// length and the recorded element counts, and a mismatch is a dilocox::Error.
// Not here: files, checksums, atomic writes (the trainer's checkpoint does that).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dilocox/config.hpp"

namespace dilocox {

class StateWriter {
 public:
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void value(const T& v) {
    const auto* b = reinterpret_cast<const std::byte*>(&v);
    bytes_.insert(bytes_.end(), b, b + sizeof(T));
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void values(std::span<const T> v) {
    value<std::uint64_t>(v.size());
    const auto* b = reinterpret_cast<const std::byte*>(v.data());
    bytes_.insert(bytes_.end(), b, b + v.size_bytes());
  }
  const std::vector<std::byte>& bytes() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class StateReader {
 public:
  explicit StateReader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  template <class T>
    requires std::is_trivially_copyable_v<T>
  T value() {
    T v;
    take(&v, sizeof(T));
    return v;
  }
  // Reads a sequence recorded with values() into out, which must have its length.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void values(std::span<T> out) {
    const auto n = value<std::uint64_t>();
    detail::require(n == out.size(), "StateReader",
                    "state holds " + std::to_string(n) + " elements where " + std::to_string(out.size()) +
                        " are expected (a different configuration?)");
    take(out.data(), out.size_bytes());
  }
  // Reads a sequence of any recorded length.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  std::vector<T> vector() {
    const auto n = value<std::uint64_t>();
    detail::require(n <= (bytes_.size() - at_) / std::max<std::size_t>(sizeof(T), 1), "StateReader",
                    "truncated state");
    std::vector<T> v(n);
    take(v.data(), n * sizeof(T));
    return v;
  }
  bool done() const { return at_ == bytes_.size(); }

 private:
  void take(void* out, std::size_t n) {
    detail::require(n <= bytes_.size() - at_, "StateReader", "truncated state");
    if (n) std::memcpy(out, bytes_.data() + at_, n);
    at_ += n;
  }
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

}  // namespace dilocox
