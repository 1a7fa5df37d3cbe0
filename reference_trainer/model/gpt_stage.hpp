// reference_trainer/model/gpt_stage.hpp: one pipeline stage of the GPT: layers
// [first, last) and, on the first stage, the token and position embeddings, on the
// last the final LayerNorm and the LM head (tied to the token embedding, so with
// S > 1 the first and the last stage each hold a copy of wte and the pipeline sums
// their gradients). Owns its parameters, gradients and the activations of `slots`
// micro-batches in flight; backend-neutral structure over the kernels in cpu/.
// Templated on the scalar: float trains, double runs the gradient check.
#pragma once

#include "model/cpu/kernels.hpp"
#include "model/gpt_config.hpp"
#include "model/param_layout.hpp"

#include <dilocox/random.hpp>
#include <dilocox/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

template <class T>
class GptStage {
 public:
  // micro_batch B sequences of seq_len tokens per micro-batch; slots = micro-batches in flight.
  GptStage(const GptConfig& cfg, int stages, int stage, int micro_batch, int seq_len, int slots)
      : layout_(cfg, stages, stage), cfg_(cfg), B_(micro_batch), T_(seq_len) {
    check_training_shape(cfg, micro_batch, seq_len, slots, "GptStage");
    params_.assign(layout_.size(), T(0));
    grads_.assign(layout_.size(), T(0));
    if (first() && last()) head_dwte_.assign(static_cast<std::size_t>(cfg.vocab) * cfg.n_embd, T(0));
    slots_.resize(static_cast<std::size_t>(slots));
    for (auto& s : slots_) allocate(s);
    const std::size_t N = tokens_per_micro(), C = cfg.n_embd, F = cfg.ffn_hidden();
    dres_.assign(N * C, T(0));
    dln_.assign(N * C, T(0));
    dqkv_.assign(N * 3 * C, T(0));
    datty_.assign(N * C, T(0));
    dfch_.assign(N * F, T(0));
    att_scratch_.assign(static_cast<std::size_t>(cpu::threads()) * T_ * T_, T(0));
  }

  bool first() const { return layout_.first(); }
  bool last() const { return layout_.last(); }
  const ParamLayout& layout() const { return layout_; }
  const GptConfig& config() const { return cfg_; }
  std::size_t tokens_per_micro() const { return static_cast<std::size_t>(B_) * T_; }
  int slots() const { return static_cast<int>(slots_.size()); }

  std::span<T> params() { return params_; }
  std::span<const T> params() const { return params_; }
  std::span<T> grads() { return grads_; }
  const std::vector<ParamTensor>& tensors() const { return layout_.tensors(); }
  std::span<T> param(const ParamTensor& t) { return std::span<T>(params_).subspan(t.offset, t.numel()); }
  std::span<T> grad(const ParamTensor& t) { return std::span<T>(grads_).subspan(t.offset, t.numel()); }
  // The copy of wte this stage holds (first and/or last stage); empty otherwise.
  const ParamTensor* tied_embedding() const { return layout_.tied_embedding(); }

  // GPT-2 initialization (ParamLayout::init): every stage layout draws the same model.
  void init(std::uint64_t seed) { layout_.init(std::span<T>(params_), seed); }

  void zero_grads() {
    for (auto* v : {&grads_, &head_dwte_})
      cpu::parallel_ranges(v->size(), 4096, [v](int, std::size_t b, std::size_t e) {
        std::fill(v->data() + b, v->data() + e, T(0));
      });
  }

  // Where a non-first stage receives its input activation (B, T, C) for a slot.
  std::span<T> input(int slot) { return slots_.at(static_cast<std::size_t>(slot)).x; }
  // The activation a non-last stage sends on (B, T, C).
  std::span<const T> output(int slot) const {
    const auto& s = slots_.at(static_cast<std::size_t>(slot));
    return s.layers.empty() ? std::span<const T>(s.x) : std::span<const T>(s.layers.back().res3);
  }
  // Where a non-last stage receives d(output) (B, T, C) before backward.
  std::span<T> grad_output() { return dres_; }
  // d(input) (B, T, C) a non-first stage sends back after backward.
  std::span<const T> grad_input() const { return dres_; }

  // Forward of one micro-batch. tokens (B, T) on the first stage, targets (B, T) on the
  // last; both must stay valid until backward of this slot. Returns the sum of the
  // B x T token losses on the last stage, 0 elsewhere.
  double forward(int slot, const std::int32_t* tokens, const std::int32_t* targets) {
    auto& s = slots_.at(static_cast<std::size_t>(slot));
    s.tokens = tokens;
    s.targets = targets;
    const int N = static_cast<int>(tokens_per_micro()), C = cfg_.n_embd, F = cfg_.ffn_hidden(), NH = cfg_.n_head;
    if (first()) {
      check_token_ids({tokens, tokens_per_micro()}, cfg_.vocab, "token", "GptStage::forward");
      cpu::embedding_forward(s.x.data(), tokens, p(layout_.wte()), p(layout_.wpe()), B_, T_, C);
    }
    const T* in = s.x.data();
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      auto& a = s.layers[l];
      const auto& w = layout_.layer_tensors()[l];
      cpu::layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), in, p(w.ln1w), p(w.ln1b), N, C);
      cpu::matmul_forward(a.qkv.data(), a.ln1.data(), p(w.qkvw), p(w.qkvb), N, C, 3 * C);
      cpu::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B_, T_, C, NH);
      cpu::matmul_forward(a.res2.data(), a.atty.data(), p(w.projw), p(w.projb), N, C, C, in);
      cpu::layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p(w.ln2w),
                             p(w.ln2b), N, C);
      cpu::matmul_forward(a.fch.data(), a.ln2.data(), p(w.fcw), p(w.fcb), N, C, F);
      cpu::gelu_forward(a.fch_gelu.data(), a.fch.data(), a.fch.size());
      cpu::matmul_forward(a.res3.data(), a.fch_gelu.data(), p(w.fcprojw), p(w.fcprojb), N, F, C, a.res2.data());
      in = a.res3.data();
    }
    if (!last()) return 0.0;
    cpu::layernorm_forward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), in, p(layout_.lnfw()), p(layout_.lnfb()), N, C);
    cpu::matmul_forward(s.logits.data(), s.lnf.data(), p(layout_.wte()), static_cast<const T*>(nullptr), N, C, cfg_.vocab);
    check_token_ids({targets, tokens_per_micro()}, cfg_.vocab, "target", "GptStage::forward");
    return cpu::softmax_cross_entropy(s.logits.data(), s.losses.data(), targets, N, cfg_.vocab);
  }

  // The last forward's softmax probabilities on the last stage (B, T, V): the loss turns
  // the logits into them in place (tests compare them with softmax of reference logits).
  std::span<const T> probabilities(int slot) const { return slots_.at(static_cast<std::size_t>(slot)).logits; }
  std::span<const T> token_losses(int slot) const { return slots_.at(static_cast<std::size_t>(slot)).losses; }

  // Backward of one micro-batch; accumulates parameter gradients. On the last stage
  // loss_scale multiplies d(loss) per token (1 / tokens in the whole step); elsewhere
  // grad_output() must hold d(output) first. Leaves d(input) in grad_input().
  void backward(int slot, T loss_scale) {
    auto& s = slots_.at(static_cast<std::size_t>(slot));
    const int N = static_cast<int>(tokens_per_micro()), C = cfg_.n_embd, F = cfg_.ffn_hidden(), NH = cfg_.n_head;
    const T* top = s.layers.empty() ? s.x.data() : s.layers.back().res3.data();
    if (last()) {
      cpu::cross_entropy_backward(s.logits.data(), s.targets, N, cfg_.vocab, loss_scale);
      T* dwte_head = first() ? head_dwte_.data() : g(layout_.wte());
      cpu::matmul_backward(dln_.data(), dwte_head, static_cast<T*>(nullptr), s.logits.data(), s.lnf.data(), p(layout_.wte()),
                           N, C, cfg_.vocab, /*overwrite_dx=*/true);
      std::fill(dres_.begin(), dres_.end(), T(0));
      cpu::layernorm_backward(dres_.data(), g(layout_.lnfw()), g(layout_.lnfb()), dln_.data(), top, p(layout_.lnfw()), s.lnf_mean.data(),
                              s.lnf_rstd.data(), N, C);
    }
    for (std::size_t l = s.layers.size(); l-- > 0;) {
      auto& a = s.layers[l];
      const auto& w = layout_.layer_tensors()[l];
      const T* in = l == 0 ? s.x.data() : s.layers[l - 1].res3.data();
      // res3 = res2 + c_proj(gelu(c_fc(ln_2(res2))))
      cpu::matmul_backward(dfch_.data(), g(w.fcprojw), g(w.fcprojb), dres_.data(), a.fch_gelu.data(), p(w.fcprojw), N,
                           F, C, true);
      cpu::gelu_backward(dfch_.data(), a.fch.data(), dfch_.data(), dfch_.size());
      cpu::matmul_backward(dln_.data(), g(w.fcw), g(w.fcb), dfch_.data(), a.ln2.data(), p(w.fcw), N, C, F, true);
      cpu::layernorm_backward(dres_.data(), g(w.ln2w), g(w.ln2b), dln_.data(), a.res2.data(), p(w.ln2w),
                              a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
      // res2 = in + c_proj(attention(c_attn(ln_1(in))))
      cpu::matmul_backward(datty_.data(), g(w.projw), g(w.projb), dres_.data(), a.atty.data(), p(w.projw), N, C, C,
                           true);
      const std::size_t scratch = static_cast<std::size_t>(cpu::threads()) * T_ * T_;
      if (att_scratch_.size() < scratch) att_scratch_.assign(scratch, T(0));  // set_threads raised since construction
      cpu::attention_backward(dqkv_.data(), att_scratch_.data(), datty_.data(), a.qkv.data(), a.att.data(), B_, T_, C,
                              NH);
      cpu::matmul_backward(dln_.data(), g(w.qkvw), g(w.qkvb), dqkv_.data(), a.ln1.data(), p(w.qkvw), N, C, 3 * C,
                           true);
      cpu::layernorm_backward(dres_.data(), g(w.ln1w), g(w.ln1b), dln_.data(), in, p(w.ln1w), a.ln1_mean.data(),
                              a.ln1_rstd.data(), N, C);
    }
    if (first()) cpu::embedding_backward(g(layout_.wte()), g(layout_.wpe()), dres_.data(), s.tokens, B_, T_, C);
  }

  // After the last backward of a step: on a single-stage model, add the LM head's share
  // of the tied embedding's gradient (kept apart so the sum is the same as the
  // pipeline's embedding + head sum across stages).
  void finish_backward() {
    if (head_dwte_.empty()) return;
    T* d = g(layout_.wte());
    cpu::parallel_ranges(head_dwte_.size(), 4096, [&](int, std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) d[i] = d[i] + head_dwte_[i];
    });
  }

 private:
  struct LayerActs {
    std::vector<T> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
  };
  struct Slot {
    std::vector<T> x;  // (B, T, C): embeddings on the first stage, the received input elsewhere
    std::vector<LayerActs> layers;
    std::vector<T> lnf, lnf_mean, lnf_rstd, logits, losses;  // last stage
    const std::int32_t* tokens = nullptr;
    const std::int32_t* targets = nullptr;
  };
  void allocate(Slot& s) {
    const std::size_t N = tokens_per_micro(), C = cfg_.n_embd, F = cfg_.ffn_hidden();
    const std::size_t att = static_cast<std::size_t>(B_) * cfg_.n_head * T_ * T_;
    s.x.assign(N * C, T(0));
    s.layers.resize(layout_.layer_tensors().size());
    for (auto& a : s.layers) {
      for (auto* v : {&a.ln1, &a.atty, &a.res2, &a.ln2, &a.res3}) v->assign(N * C, T(0));
      for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) v->assign(N, T(0));
      a.qkv.assign(N * 3 * C, T(0));
      a.att.assign(att, T(0));
      a.fch.assign(N * F, T(0));
      a.fch_gelu.assign(N * F, T(0));
    }
    if (last()) {
      s.lnf.assign(N * C, T(0));
      s.lnf_mean.assign(N, T(0));
      s.lnf_rstd.assign(N, T(0));
      s.logits.assign(N * static_cast<std::size_t>(cfg_.vocab), T(0));
      s.losses.assign(N, T(0));
    }
  }

  T* p(int i) { return params_.data() + layout_.tensor(i).offset; }
  T* g(int i) { return grads_.data() + layout_.tensor(i).offset; }

  ParamLayout layout_;  // first: it validates the config
  GptConfig cfg_;
  int B_, T_;
  std::vector<T> params_, grads_;  // flat, in tensors_ order
  std::vector<T> head_dwte_;       // (V, C): the LM head's share of d(wte) on a single-stage model
  std::vector<Slot> slots_;
  // Backward scratch, one micro-batch at a time: (N, C), (N, C), (N, 3C), (N, C), (N, F),
  // and (threads, T, T) for attention (one (T, T) per thread; grows if threads do).
  std::vector<T> dres_, dln_, dqkv_, datty_, dfch_, att_scratch_;
};

}  // namespace dilocox::trainer
