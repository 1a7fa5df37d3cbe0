// dilocox/error_feedback.hpp: the error-feedback residual of one tensor: what a
// compressor has not yet transmitted, added back before the next compression.
// Host memory; needs only the standard library. Not here: the device version
// (cuda/error_feedback.cuh) and the compressor that uses it (compressor.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dilocox/config.hpp"

namespace dilocox {

class ErrorFeedback {
 public:
  explicit ErrorFeedback(std::size_t n) : e_(n, 0.0f) {}

  std::size_t size() const { return e_.size(); }

  // x += e
  void add_to(std::span<float> x) const {
    check(x.size(), "add_to");
    const float* e = e_.data();
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += e[i];
  }

  // e = decay (x - sent): x is what was to be sent (input + old residual), sent what
  // the receivers decode; decay < 1 forgets old residual geometrically.
  void update(std::span<const float> x, std::span<const float> sent, float decay = 1.0f) {
    check(x.size(), "update");
    check(sent.size(), "update");
    float* e = e_.data();
    for (std::size_t i = 0; i < x.size(); ++i) e[i] = decay * (x[i] - sent[i]);
  }

  // e *= decay (after assign() and an in-place subtraction).
  void scale(float decay) {
    if (decay != 1.0f)
      for (float& v : e_) v *= decay;
  }

  // e = x, returned so that the caller subtracts what was sent in place (e -= sent) when
  // "sent" is a product not worth materializing (the low-rank compressor's P Q^T).
  std::span<float> assign(std::span<const float> x) {
    check(x.size(), "assign");
    std::copy_n(x.begin(), e_.size(), e_.begin());  // sizes checked equal
    return e_;
  }

  std::span<const float> residual() const { return e_; }
  std::span<float> residual() { return e_; }  // for checkpoints
  void reset() { std::fill(e_.begin(), e_.end(), 0.0f); }

 private:
  void check(std::size_t n, const char* what) const {
    detail::require(n == e_.size(), (std::string("ErrorFeedback::") + what).c_str(),
                    "span has " + std::to_string(n) + " elements, residual has " + std::to_string(e_.size()));
  }
  std::vector<float> e_;  // (n) host
};

}  // namespace dilocox
