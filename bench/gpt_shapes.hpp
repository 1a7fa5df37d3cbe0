// Benchmark helper: the parameter tensors of a GPT-style model (per layer: qkv,
// attention projection, MLP up and down, two LayerNorms, biases), filled with
// pseudo-gradient-like values, as a set OuterLoop or a compressor can take.
#pragma once

#include <dilocox/compress/compressor.hpp>
#include <dilocox/random.hpp>

#include <string>
#include <vector>

struct GptTensors {
  std::vector<dilocox::TensorSpec> specs;
  std::vector<std::vector<float>> data;
  std::size_t numel = 0;

  // Layers of width d until about `target` parameters.
  GptTensors(std::size_t d, std::size_t target, std::uint64_t seed) {
    for (int layer = 0; numel < target; ++layer) {
      const std::string p = "blocks." + std::to_string(layer) + ".";
      add(p + "attn.qkv.weight", {3 * d, d}, seed);
      add(p + "attn.qkv.bias", {3 * d}, seed);
      add(p + "attn.proj.weight", {d, d}, seed);
      add(p + "mlp.fc1.weight", {4 * d, d}, seed);
      add(p + "mlp.fc1.bias", {4 * d}, seed);
      add(p + "mlp.fc2.weight", {d, 4 * d}, seed);
      add(p + "ln1.weight", {d}, seed);
      add(p + "ln2.weight", {d}, seed);
    }
  }
  void add(std::string name, dilocox::Shape shape, std::uint64_t seed) {
    std::vector<float> v(shape.numel());
    // low-rank-ish signal plus noise, at pseudo-gradient scale
    const auto [m, n] = dilocox::matrix_shape(shape);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = 1e-3f * (dilocox::counter_normal(seed + 1, i / n) * dilocox::counter_normal(seed + 2, i % n) +
                      0.3f * dilocox::counter_normal(seed + 3 + specs.size(), i));
    (void)m;
    numel += v.size();
    specs.push_back({std::move(name), shape});
    data.push_back(std::move(v));
  }
};
