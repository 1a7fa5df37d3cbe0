// reference_trainer/model/param_layout.hpp: which parameter tensors one pipeline stage
// of the GPT holds (names, global ids, shapes, offsets into the stage's flat buffer,
// weight decay), the GPT-2 initialization that fills them, and the shape and token checks
// a stage makes. Shared by the CPU and the CUDA backends, so both draw (and refuse) the
// same models; nothing here computes a layer.
#pragma once

#include "model/gpt_config.hpp"

#include <dilocox/random.hpp>
#include <dilocox/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct ParamTensor {
  std::string name;           // PyTorch-style, e.g. "h.3.attn.c_attn.weight"
  int global_id = 0;          // position in the whole model's tensor list (stage-independent)
  std::size_t offset = 0;     // into the stage's flat parameter buffer
  std::vector<int> shape;
  bool decay = false;         // AdamW weight decay: matrices yes, biases and norms no
  std::size_t numel() const {
    std::size_t n = 1;
    for (int d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  // The library's Shape (for OuterLoop tensors and wire payloads).
  Shape dims() const {
    Shape s;
    for (int d : shape) s.dims[s.ndim++] = static_cast<std::size_t>(d);
    return s;
  }
};

// Indices into ParamLayout::tensors() of one transformer layer's tensors.
struct LayerTensors {
  int ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};

// What every backend checks before it allocates a stage: a trainable model (full
// multi-head attention), a sequence within its context, at least one sequence and slot.
inline void check_training_shape(const GptConfig& cfg, int micro_batch, int seq_len, int slots, const char* where) {
  dilocox::detail::require(cfg.trainable(), where, cfg.name + " uses grouped-query attention: a planning shape only");
  dilocox::detail::require(seq_len >= 1 && seq_len <= cfg.max_seq, where,
                           "sequence length " + std::to_string(seq_len) + " must be in [1, " +
                               std::to_string(cfg.max_seq) + "] for this model");
  dilocox::detail::require(micro_batch >= 1 && slots >= 1, where, "micro-batch and slots must be >= 1");
}

// Every id in [0, vocab); `what` is "token" or "target".
inline void check_token_ids(std::span<const std::int32_t> ids, int vocab, const char* what, const char* where) {
  for (const std::int32_t id : ids)
    dilocox::detail::require(id >= 0 && id < vocab, where,
                             std::string(what) + " " + std::to_string(id) + " outside the vocabulary");
}

class ParamLayout {
 public:
  // Validates cfg (before anything is split or sized).
  ParamLayout(const GptConfig& cfg, int stages, int stage) : cfg_(cfg), stages_(stages), stage_(stage) {
    cfg.validate();
    range_ = stage_layers(cfg.n_layer, stages, stage);
    build_tensor_list();
  }

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  // The copy of the tied token embedding this stage holds (first and/or last stage), if any.
  const ParamTensor* tied_embedding() const { return wte_ >= 0 ? &tensor(wte_) : nullptr; }
  StageRange layers() const { return range_; }
  std::size_t size() const { return n_params_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const ParamTensor& tensor(int i) const { return tensors_[static_cast<std::size_t>(i)]; }
  const std::vector<LayerTensors>& layer_tensors() const { return layer_tensors_; }
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int lnfw() const { return lnfw_; }
  int lnfb() const { return lnfb_; }

  // GPT-2 initialization from a counter-based RNG keyed by (seed, global tensor id,
  // element), so every stage layout draws the same model.
  template <class T>
  void init(std::span<T> params, std::uint64_t seed) const {
    const double std0 = 0.02, std_proj = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
    for (const auto& t : tensors_) {
      auto p = params.subspan(t.offset, t.numel());
      const bool is_norm_weight = t.name.ends_with("ln_1.weight") || t.name.ends_with("ln_2.weight") ||
                                  t.name == "ln_f.weight";
      if (is_norm_weight) {
        std::fill(p.begin(), p.end(), T(1));
      } else if (t.shape.size() == 1) {
        std::fill(p.begin(), p.end(), T(0));
      } else {
        const double sd = t.name.ends_with("c_proj.weight") ? std_proj : std0;
        const std::uint64_t key = seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(t.global_id);
        for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<T>(sd * counter_normal(key, i));
      }
    }
  }

 private:
  int add_tensor(const std::string& name, int global_id, std::vector<int> shape, bool decay) {
    ParamTensor t{name, global_id, n_params_, std::move(shape), decay};
    n_params_ += t.numel();
    tensors_.push_back(std::move(t));
    return static_cast<int>(tensors_.size()) - 1;
  }

  // Global ids: wte 0, wpe 1, layer l tensor j at 2 + 12 l + j, ln_f 2 + 12 L and + 1.
  void build_tensor_list() {
    const int C = cfg_.n_embd, F = cfg_.ffn_hidden(), V = cfg_.vocab, L = cfg_.n_layer;
    if (first()) {
      wte_ = add_tensor("wte", 0, {V, C}, true);
      wpe_ = add_tensor("wpe", 1, {cfg_.max_seq, C}, true);
    }
    for (int l = range_.first; l < range_.last; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      const int g0 = 2 + 12 * l;
      LayerTensors w{};
      w.ln1w = add_tensor(h + "ln_1.weight", g0 + 0, {C}, false);
      w.ln1b = add_tensor(h + "ln_1.bias", g0 + 1, {C}, false);
      w.qkvw = add_tensor(h + "attn.c_attn.weight", g0 + 2, {3 * C, C}, true);
      w.qkvb = add_tensor(h + "attn.c_attn.bias", g0 + 3, {3 * C}, false);
      w.projw = add_tensor(h + "attn.c_proj.weight", g0 + 4, {C, C}, true);
      w.projb = add_tensor(h + "attn.c_proj.bias", g0 + 5, {C}, false);
      w.ln2w = add_tensor(h + "ln_2.weight", g0 + 6, {C}, false);
      w.ln2b = add_tensor(h + "ln_2.bias", g0 + 7, {C}, false);
      w.fcw = add_tensor(h + "mlp.c_fc.weight", g0 + 8, {F, C}, true);
      w.fcb = add_tensor(h + "mlp.c_fc.bias", g0 + 9, {F}, false);
      w.fcprojw = add_tensor(h + "mlp.c_proj.weight", g0 + 10, {C, F}, true);
      w.fcprojb = add_tensor(h + "mlp.c_proj.bias", g0 + 11, {C}, false);
      layer_tensors_.push_back(w);
    }
    if (last()) {
      lnfw_ = add_tensor("ln_f.weight", 2 + 12 * L, {C}, false);
      lnfb_ = add_tensor("ln_f.bias", 3 + 12 * L, {C}, false);
      if (!first()) wte_ = add_tensor("wte", 0, {V, C}, true);
    }
  }

  GptConfig cfg_;
  int stages_, stage_;
  StageRange range_;
  std::vector<ParamTensor> tensors_;
  std::vector<LayerTensors> layer_tensors_;
  int wte_ = -1, wpe_ = -1, lnfw_ = -1, lnfb_ = -1;
  std::size_t n_params_ = 0;
};

}  // namespace dilocox::trainer
