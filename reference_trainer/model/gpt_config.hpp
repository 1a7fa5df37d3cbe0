// reference_trainer/model/gpt_config.hpp: the shape of a decoder-only GPT
// (pre-LayerNorm, causal multi-head attention, GELU MLP, learned positions, tied
// embeddings), its presets, and the arithmetic on it: parameter counts per tensor,
// per layer and per pipeline stage, and model FLOPs per token. Nothing here allocates.
#pragma once

#include <dilocox/config.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct GptConfig {
  int n_layer = 2;
  int n_embd = 64;      // C
  int n_head = 4;       // C % n_head == 0
  int n_kv_head = 0;    // 0: = n_head. Fewer (grouped-query) only for planning shapes
  int ffn = 0;          // MLP hidden size; 0: 4 * C
  int vocab = 4096;     // V
  int max_seq = 128;    // learned positions
  std::string name = "custom";

  int ffn_hidden() const { return ffn > 0 ? ffn : 4 * n_embd; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return n_embd / n_head; }
  int qkv_out() const { return n_embd + 2 * kv_heads() * head_dim(); }

  // Per-layer parameters: ln1, qkv, attn proj, ln2, fc, fc proj (weights and biases).
  std::int64_t layer_params() const {
    const std::int64_t C = n_embd, F = ffn_hidden(), Q = qkv_out();
    return 2 * C + (Q * C + Q) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  }
  std::int64_t embedding_params() const { return std::int64_t{vocab} * n_embd + std::int64_t{max_seq} * n_embd; }
  // Whole model, counting the tied token embedding once.
  std::int64_t params() const { return embedding_params() + n_layer * layer_params() + 2 * n_embd; }

  // Training FLOPs per token (forward + backward = 3 x forward; a multiply-add is 2):
  // 6 x (the matmul weights: layers + the tied LM head) + attention scores and values
  // 12 x L x T x C (the full T x T product, as the usual accounting does).
  double flops_per_token(int seq_len) const {
    const double matmul = static_cast<double>(n_layer) * static_cast<double>(layer_params() - 4 * n_embd) +
                          static_cast<double>(vocab) * n_embd;
    return 6.0 * matmul + 12.0 * n_layer * static_cast<double>(seq_len) * n_embd;
  }

  void validate() const {
    const char* w = "GptConfig";
    dilocox::detail::require(n_layer >= 1 && n_embd >= 1 && n_head >= 1 && vocab >= 2 && max_seq >= 1, w,
                    "layers, width, heads, vocabulary and sequence length must be positive");
    dilocox::detail::require(n_embd % n_head == 0, w,
                    "width " + std::to_string(n_embd) + " is not divisible by " + std::to_string(n_head) + " heads");
    dilocox::detail::require(n_head % kv_heads() == 0, w, "heads must be a multiple of kv heads");
  }
  // The training code implements full multi-head attention only.
  bool trainable() const { return kv_heads() == n_head; }
};

// Presets. tiny/small/medium train on a 2-core CPU; the last two are planning shapes.
// qwen1.5-107b: Qwen1.5's 80 x 8192 layout with 64 query / 8 key-value heads, its
// SwiGLU MLP (3 x 8192 x 49152) expressed as a 2-matrix MLP of the same size (73728).
inline GptConfig gpt_preset(const std::string& name) {
  GptConfig c;
  c.name = name;
  if (name == "tiny") {
    c.n_layer = 2, c.n_embd = 64, c.n_head = 4, c.vocab = 4096, c.max_seq = 64;
  } else if (name == "small") {
    c.n_layer = 4, c.n_embd = 256, c.n_head = 4, c.vocab = 4096, c.max_seq = 128;
  } else if (name == "medium") {
    c.n_layer = 8, c.n_embd = 512, c.n_head = 8, c.vocab = 4096, c.max_seq = 256;
  } else if (name == "opt-1.3b") {
    c.n_layer = 24, c.n_embd = 2048, c.n_head = 32, c.vocab = 50272, c.max_seq = 2048;
  } else if (name == "qwen1.5-107b") {
    c.n_layer = 80, c.n_embd = 8192, c.n_head = 64, c.n_kv_head = 8, c.ffn = 73728, c.vocab = 152064,
    c.max_seq = 4096;
  } else {
    throw Error("unknown model preset '" + name + "' (tiny, small, medium, opt-1.3b, qwen1.5-107b)");
  }
  return c;
}

inline std::vector<std::string> gpt_preset_names() { return {"tiny", "small", "medium", "opt-1.3b", "qwen1.5-107b"}; }

// Layers [first, last) of stage s when L layers are split over S stages: the first
// L % S stages take one more layer.
struct StageRange {
  int first = 0, last = 0;
};
inline StageRange stage_layers(int n_layer, int stages, int s) {
  dilocox::detail::require(stages >= 1 && stages <= n_layer, "stage_layers",
                  std::to_string(stages) + " stages for " + std::to_string(n_layer) +
                      " layers: need 1 <= stages <= layers");
  const int base = n_layer / stages, extra = n_layer % stages;
  const int first = s * base + std::min(s, extra);
  return {first, first + base + (s < extra ? 1 : 0)};
}

}  // namespace dilocox::trainer
