// reference_trainer/model/cuda/cuda_stage_model.cu: the CUDA backend of StageModel: one
// pipeline stage of the GPT with cuBLAS matmuls (cublasGemmEx, fp32 accumulation) and
// the kernels of kernels.cuh; compute type bf16 or fp32, master weights, gradients and
// AdamW state in fp32 on the device. Everything runs on one stream; a call synchronizes
// only where it hands data to the host (the loss, activations for the next stage, the
// host copies). Attention materializes the (T, T) probabilities, like the CPU path.
#include "model/cuda/kernels.cuh"
#include "model/stage_model.hpp"

#include <dilocox/cuda/blas.hpp>
#include <dilocox/cuda/check.hpp>
#include <dilocox/cuda/memory.hpp>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace dilocox::trainer {
namespace {

namespace k = cuda_kernels;
using dilocox::cuda::BlasHandle;
using dilocox::cuda::DeviceBuffer;
using dilocox::cuda::GemmTypes;
using dilocox::cuda::PinnedBuffer;
using dilocox::cuda::gemm_rm;
using dilocox::cuda::gemm_rm_batched;

// Blocks of 256 threads for n elements (every kernel here is grid-stride).
inline unsigned grid_for(std::size_t n) { return dilocox::cuda::grid_size(n, 256); }

template <class Tc>
class CudaStageModel final : public StageModel {
 public:
  CudaStageModel(const GptConfig& cfg, int stages, int stage, int micro_batch, int seq_len, int slots, int gpu)
      : cfg_(cfg), layout_(cfg, stages, stage), B_(micro_batch), T_(seq_len), device_(select_device(gpu)),
        stream_(owned_stream_.get()), blas_(stream_) {
    check_training_shape(cfg, micro_batch, seq_len, slots, "CudaStageModel");
    const std::size_t P = layout_.size(), N = tokens(), C = cfg.n_embd, F = cfg.ffn_hidden(), V = cfg.vocab;
    for (auto* b : {&params_, &grads_, &m_, &v_}) b->resize(P);
    if constexpr (!std::is_same_v<Tc, float>) params_c_.resize(P);
    for (auto* b : {&h_params_, &h_grads_, &h_m_, &h_v_}) b->resize(P);
    grads_.zero(stream_);
    m_.zero(stream_);
    v_.zero(stream_);
    slots_.resize(static_cast<std::size_t>(slots));
    const std::size_t att = static_cast<std::size_t>(B_) * cfg.n_head * T_ * T_;
    for (auto& s : slots_) {
      s.x.resize(N * C);
      s.tokens.resize(N);
      s.targets.resize(N);
      s.input.resize(N * C);
      s.output.resize(N * C);
      s.layers.resize(layout_.layer_tensors().size());
      for (auto& a : s.layers) {
        for (auto* b : {&a.ln1, &a.yr, &a.atty, &a.res2, &a.ln2, &a.res3}) b->resize(N * C);
        for (auto* b : {&a.qkv, &a.qkvr}) b->resize(3 * N * C);
        a.att.resize(att);
        a.fch.resize(N * F);
        a.fch_gelu.resize(N * F);
        for (auto* b : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) b->resize(N);
      }
      if (last()) {
        s.lnf.resize(N * C);
        s.logits.resize(N * V);
        for (auto* b : {&s.lnf_mean, &s.lnf_rstd, &s.losses, &s.lse}) b->resize(N);
      }
    }
    for (auto* b : {&dres_, &dln_, &datty_, &dyr_}) b->resize(N * C);
    for (auto* b : {&dqkv_, &dqkvr_}) b->resize(3 * N * C);
    dfch_.resize(N * F);
    datt_.resize(att);
    staging_.resize(N * C);
    grad_out_h_.resize(N * C);
    grad_in_h_.resize(N * C);
    losses_h_.resize(N);
    norms_.resize(layout_.tensors().size());
    norms_h_.resize(layout_.tensors().size());
  }

  const ParamLayout& layout() const override { return layout_; }
  int slots() const override { return static_cast<int>(slots_.size()); }
  void init(std::uint64_t seed) override {
    layout_.init(std::span<float>(h_params_.data(), layout_.size()), seed);
    push_params();
  }

  std::span<float> params() override { return h_params_.span(layout_.size()); }
  std::span<float> grads() override { return h_grads_.span(layout_.size()); }
  std::span<float> adam_m() override { return h_m_.span(layout_.size()); }
  std::span<float> adam_v() override { return h_v_.span(layout_.size()); }
  void pull_params() override { download(h_params_, params_); }
  void push_params() override {
    upload(params_, h_params_);
    refresh_compute_copy();
  }
  void pull_grads() override { download(h_grads_, grads_); }
  void push_grads() override { upload(grads_, h_grads_); }
  void pull_optimizer() override {
    download(h_m_, m_);
    download(h_v_, v_);
  }
  void push_optimizer() override {
    upload(m_, h_m_);
    upload(v_, h_v_);
  }

  std::span<float> input(int slot) override { return at(slot).input.span(tokens() * cfg_.n_embd); }
  std::span<const float> output(int slot) override {
    auto& s = at(slot);
    const Tc* top = s.layers.empty() ? s.x.data() : s.layers.back().res3.data();
    to_host(s.output, top);
    return s.output.span(tokens() * cfg_.n_embd);
  }
  std::span<float> grad_output() override { return grad_out_h_.span(tokens() * cfg_.n_embd); }
  std::span<const float> grad_input() override { return grad_in_h_.span(tokens() * cfg_.n_embd); }

  double forward(int slot, const std::int32_t* tokens_in, const std::int32_t* targets_in) override {
    auto& s = at(slot);
    const int N = static_cast<int>(tokens()), C = cfg_.n_embd, F = cfg_.ffn_hidden();
    const std::size_t NC = tokens() * C;
    if (first()) {
      check_token_ids({tokens_in, tokens()}, cfg_.vocab, "token", "CudaStageModel::forward");
      dilocox::cuda::copy_to_device(s.tokens.data(), std::span<const std::int32_t>(tokens_in, tokens()), stream_, where);
      k::embedding_forward<<<grid_for(NC), 256, 0, stream_>>>(s.x.data(), s.tokens.data(), p(layout_.wte()),
                                                               p(layout_.wpe()), N, T_, C);
      launched();
    } else {
      from_host(s.x.data(), s.input);
    }
    const Tc* in = s.x.data();
    for (std::size_t l = 0; l < s.layers.size(); ++l) {
      auto& a = s.layers[l];
      const auto& w = layout_.layer_tensors()[l];
      layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), in, w.ln1w, w.ln1b);
      matmul_forward(a.qkv.data(), a.ln1.data(), w.qkvw, w.qkvb, N, C, 3 * C);
      attention_forward(a);
      matmul_forward(a.res2.data(), a.atty.data(), w.projw, w.projb, N, C, C);
      add_into(a.res2.data(), in, NC);
      layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), w.ln2w, w.ln2b);
      matmul_forward(a.fch.data(), a.ln2.data(), w.fcw, w.fcb, N, C, F);
      k::gelu_forward<<<grid_for(a.fch.size()), 256, 0, stream_>>>(a.fch_gelu.data(), a.fch.data(), a.fch.size());
      launched();
      matmul_forward(a.res3.data(), a.fch_gelu.data(), w.fcprojw, w.fcprojb, N, F, C);
      add_into(a.res3.data(), a.res2.data(), NC);
      in = a.res3.data();
    }
    if (!last()) return 0.0;
    layernorm_forward(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), in, layout_.lnfw(), layout_.lnfb());
    gemm_rm(blas_.get(), false, true, N, cfg_.vocab, C, 1.0f, s.lnf.data(), C, p(layout_.wte()), C, 0.0f,
            s.logits.data(), cfg_.vocab, act_types(), where);
    check_token_ids({targets_in, tokens()}, cfg_.vocab, "target", "CudaStageModel::forward");
    dilocox::cuda::copy_to_device(s.targets.data(), std::span<const std::int32_t>(targets_in, tokens()), stream_, where);
    k::cross_entropy_forward<<<N, 256, 0, stream_>>>(s.losses.data(), s.lse.data(), s.logits.data(), s.targets.data(),
                                                     cfg_.vocab);
    launched();
    dilocox::cuda::copy_to_host(losses_h_.span(tokens()), s.losses.data(), stream_, where);
    synchronize();
    double total = 0;
    for (std::size_t i = 0; i < tokens(); ++i) total += static_cast<double>(losses_h_.data()[i]);
    return total;
  }

  void backward(int slot, float loss_scale) override {
    auto& s = at(slot);
    const int N = static_cast<int>(tokens()), C = cfg_.n_embd, F = cfg_.ffn_hidden(), V = cfg_.vocab;
    const std::size_t NC = tokens() * C;
    const Tc* top = s.layers.empty() ? s.x.data() : s.layers.back().res3.data();
    if (last()) {
      k::cross_entropy_backward<<<grid_for(tokens() * V), 256, 0, stream_>>>(s.logits.data(), s.lse.data(),
                                                                            s.targets.data(), N, V, loss_scale);
      launched();
      gemm_rm(blas_.get(), false, false, N, C, V, 1.0f, s.logits.data(), V, p(layout_.wte()), C, 0.0f, dln_.data(), C,
              act_types(), where);
      gemm_rm(blas_.get(), true, false, V, C, N, 1.0f, s.logits.data(), V, s.lnf.data(), C, 1.0f, g(layout_.wte()), C,
              grad_types(), where);
      dres_.zero(stream_);
      layernorm_backward(dres_.data(), layout_.lnfw(), layout_.lnfb(), dln_.data(), top, s.lnf_mean.data(),
                         s.lnf_rstd.data());
    } else {
      from_host(dres_.data(), grad_out_h_);
    }
    for (std::size_t l = s.layers.size(); l-- > 0;) {
      auto& a = s.layers[l];
      const auto& w = layout_.layer_tensors()[l];
      const Tc* in = l == 0 ? s.x.data() : s.layers[l - 1].res3.data();
      matmul_backward(dfch_.data(), w.fcprojw, w.fcprojb, dres_.data(), a.fch_gelu.data(), N, F, C);
      k::gelu_backward<<<grid_for(dfch_.size()), 256, 0, stream_>>>(dfch_.data(), a.fch.data(), dfch_.data(), dfch_.size());
      launched();
      matmul_backward(dln_.data(), w.fcw, w.fcb, dfch_.data(), a.ln2.data(), N, C, F);
      layernorm_backward(dres_.data(), w.ln2w, w.ln2b, dln_.data(), a.res2.data(), a.ln2_mean.data(), a.ln2_rstd.data());
      matmul_backward(datty_.data(), w.projw, w.projb, dres_.data(), a.atty.data(), N, C, C);
      attention_backward(a);
      matmul_backward(dln_.data(), w.qkvw, w.qkvb, dqkv_.data(), a.ln1.data(), N, C, 3 * C);
      layernorm_backward(dres_.data(), w.ln1w, w.ln1b, dln_.data(), in, a.ln1_mean.data(), a.ln1_rstd.data());
    }
    if (first()) {
      k::embedding_backward<<<grid_for(NC), 256, 0, stream_>>>(g(layout_.wte()), g(layout_.wpe()), dres_.data(),
                                                                s.tokens.data(), N, T_, C);
      launched();
    } else {
      to_host(grad_in_h_, dres_.data());
    }
  }

  void finish_backward() override {}  // the LM head adds into wte's gradient directly
  void zero_grads() override { grads_.zero(stream_); }

  void grad_square_norms(std::span<double> by_id) override {
    norms_.zero(stream_);
    const auto& ts = layout_.tensors();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      const std::size_t n = ts[i].numel();
      k::square_norm<<<std::min(grid_for(n), 1024u), 256, 0, stream_>>>(norms_.data() + i, grads_.data() + ts[i].offset, n);
      launched();
    }
    dilocox::cuda::copy_to_host(norms_h_.span(ts.size()), norms_.data(), stream_, where);
    synchronize();
    for (std::size_t i = 0; i < ts.size(); ++i)
      if (counts_in_norm(ts[i])) by_id[static_cast<std::size_t>(ts[i].global_id)] = norms_h_.data()[i];
  }

  void adamw_step(const AdamWConfig& c, float lr, float grad_scale, std::int64_t t) override {
    const AdamWUpdate u(c, lr, grad_scale, t);
    for (const auto& ts : layout_.tensors()) {
      const std::size_t o = ts.offset, n = ts.numel();
      k::adamw<Tc><<<grid_for(n), 256, 0, stream_>>>(params_.data() + o, compute_params() + o, grads_.data() + o,
                                                      m_.data() + o, v_.data() + o, n, u,
                                                      ts.decay ? c.weight_decay : 0.0f);
      launched();
    }
  }

 private:
  static constexpr const char* where = "CudaStageModel";
  template <class E>
  using Buf = DeviceBuffer<E>;

  struct LayerActs {
    Buf<Tc> ln1, qkv, qkvr, att, yr, atty, res2, ln2, fch, fch_gelu, res3;  // (N, C), (N, 3C), (3, B, NH, T, hs), ...
    Buf<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;                       // (N)
  };
  struct Slot {
    Buf<Tc> x;                       // (N, C): embeddings, or the previous stage's output
    Buf<std::int32_t> tokens, targets;  // (N)
    std::vector<LayerActs> layers;
    Buf<Tc> lnf, logits;             // (N, C), (N, V): last stage
    Buf<float> lnf_mean, lnf_rstd, losses, lse;  // (N)
    PinnedBuffer<float> input, output;  // (N, C) host: activations from / to the neighbouring stages
  };

  // Makes device gpu % count current (before any member allocates); returns its index.
  static int select_device(int gpu) {
    int count = 0;
    dilocox::cuda::check(cudaGetDeviceCount(&count), "--device cuda", "no usable CUDA device");
    dilocox::detail::require(count > 0, "--device cuda", "no CUDA device");
    dilocox::cuda::check(cudaSetDevice(gpu % count), where, "cudaSetDevice");
    return gpu % count;
  }

  static GemmTypes act_types() {
    constexpr cudaDataType_t t = std::is_same_v<Tc, float> ? CUDA_R_32F : CUDA_R_16BF;
    return {t, t, t, CUBLAS_COMPUTE_32F};
  }
  static GemmTypes grad_types() {  // activations in, fp32 parameter gradient out
    constexpr cudaDataType_t t = std::is_same_v<Tc, float> ? CUDA_R_32F : CUDA_R_16BF;
    return {t, t, CUDA_R_32F, CUBLAS_COMPUTE_32F};
  }

  std::size_t tokens() const { return static_cast<std::size_t>(B_) * T_; }
  Slot& at(int slot) { return slots_.at(static_cast<std::size_t>(slot)); }
  Tc* compute_params() {
    if constexpr (std::is_same_v<Tc, float>) return params_.data();
    else return params_c_.data();
  }
  const Tc* p(int i) { return compute_params() + layout_.tensor(i).offset; }
  float* g(int i) { return grads_.data() + layout_.tensor(i).offset; }

  void launched() { dilocox::cuda::check_launch(where); }
  void synchronize() { dilocox::cuda::check(cudaStreamSynchronize(stream_), where, "cudaStreamSynchronize"); }

  void download(PinnedBuffer<float>& h, const Buf<float>& d) {
    dilocox::cuda::copy_to_host(h.span(d.size()), d.data(), stream_, where);
    synchronize();
  }
  void upload(Buf<float>& d, PinnedBuffer<float>& h) {
    dilocox::cuda::copy_to_device(d.data(), std::span<const float>(h.data(), d.size()), stream_, where);
    synchronize();  // the host copy may be written again as soon as this returns
  }
  void refresh_compute_copy() {
    if constexpr (!std::is_same_v<Tc, float>) {
      k::convert<Tc><<<grid_for(params_.size()), 256, 0, stream_>>>(params_c_.data(), params_.data(), params_.size());
      launched();
    }
  }
  // Host float (N, C) -> device Tc, through the fp32 staging buffer.
  void from_host(Tc* dst, PinnedBuffer<float>& h) {
    const std::size_t n = tokens() * cfg_.n_embd;
    dilocox::cuda::copy_to_device(staging_.data(), std::span<const float>(h.data(), n), stream_, where);
    k::convert<Tc><<<grid_for(n), 256, 0, stream_>>>(dst, staging_.data(), n);
    launched();
  }
  // Device Tc (N, C) -> host float; synchronizes.
  void to_host(PinnedBuffer<float>& h, const Tc* src) {
    const std::size_t n = tokens() * cfg_.n_embd;
    k::to_float<Tc><<<grid_for(n), 256, 0, stream_>>>(staging_.data(), src, n);
    launched();
    dilocox::cuda::copy_to_host(h.span(n), staging_.data(), stream_, where);
    synchronize();
  }

  void layernorm_forward(Tc* out, float* mean, float* rstd, const Tc* x, int w, int b) {
    const int N = static_cast<int>(tokens());
    k::layernorm_forward<<<(N + 7) / 8, 256, 0, stream_>>>(out, mean, rstd, x, p(w), p(b), N, cfg_.n_embd);
    launched();
  }
  void layernorm_backward(Tc* dx, int w, int b, const Tc* dout, const Tc* x, const float* mean, const float* rstd) {
    const int N = static_cast<int>(tokens()), C = cfg_.n_embd;
    const unsigned grid = std::min<unsigned>((N + 7) / 8, 264);
    k::layernorm_backward<<<grid, 256, 2 * C * sizeof(float), stream_>>>(dx, g(w), g(b), dout, x, p(w), mean, rstd, N, C);
    launched();
  }
  void add_into(Tc* y, const Tc* x, std::size_t n) {
    k::add_into<<<grid_for(n), 256, 0, stream_>>>(y, x, n);
    launched();
  }
  // out (N, OC) = x (N, IC) W^T + b
  void matmul_forward(Tc* out, const Tc* x, int w, int b, int N, int IC, int OC) {
    gemm_rm(blas_.get(), false, true, N, OC, IC, 1.0f, x, IC, p(w), IC, 0.0f, out, OC, act_types(), where);
    k::add_bias<<<grid_for(static_cast<std::size_t>(N) * OC), 256, 0, stream_>>>(out, p(b), N, OC);
    launched();
  }
  // dx = dout W (written), dW += dout^T x, db += column sums of dout.
  void matmul_backward(Tc* dx, int w, int b, const Tc* dout, const Tc* x, int N, int IC, int OC) {
    gemm_rm(blas_.get(), false, false, N, IC, OC, 1.0f, dout, OC, p(w), IC, 0.0f, dx, IC, act_types(), where);
    gemm_rm(blas_.get(), true, false, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, g(w), IC, grad_types(), where);
    k::bias_backward<<<(OC + 31) / 32, dim3(32, 8), 0, stream_>>>(g(b), dout, N, OC);
    launched();
  }

  void attention_forward(LayerActs& a) {
    const int NH = cfg_.n_head, hs = cfg_.n_embd / NH, Tn = T_;
    const std::size_t NC = tokens() * cfg_.n_embd;
    Tc *q = a.qkvr.data(), *kk = q + NC, *v = kk + NC;
    k::qkv_permute<Tc, false><<<grid_for(3 * NC), 256, 0, stream_>>>(a.qkv.data(), q, kk, v, B_, Tn, NH, hs);
    launched();
    const long long th = static_cast<long long>(Tn) * hs, tt = static_cast<long long>(Tn) * Tn;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    gemm_rm_batched(blas_.get(), false, true, Tn, Tn, hs, scale, q, hs, th, kk, hs, th, 0.0f, a.att.data(), Tn, tt,
                    B_ * NH, act_types(), where);
    const std::size_t rows = static_cast<std::size_t>(B_) * NH * Tn;
    k::softmax_causal_forward<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream_>>>(a.att.data(), rows, Tn);
    launched();
    gemm_rm_batched(blas_.get(), false, false, Tn, hs, Tn, 1.0f, a.att.data(), Tn, tt, v, hs, th, 0.0f, a.yr.data(),
                    hs, th, B_ * NH, act_types(), where);
    k::heads_permute<Tc, false><<<grid_for(NC), 256, 0, stream_>>>(a.atty.data(), a.yr.data(), B_, Tn, NH, hs);
    launched();
  }

  // dqkv_ = attention'(datty_)
  void attention_backward(LayerActs& a) {
    const int NH = cfg_.n_head, hs = cfg_.n_embd / NH, Tn = T_;
    const std::size_t NC = tokens() * cfg_.n_embd;
    const Tc *q = a.qkvr.data(), *kk = q + NC, *v = kk + NC;
    Tc *dq = dqkvr_.data(), *dk = dq + NC, *dv = dk + NC;
    k::heads_permute<Tc, true><<<grid_for(NC), 256, 0, stream_>>>(datty_.data(), dyr_.data(), B_, Tn, NH, hs);
    launched();
    const long long th = static_cast<long long>(Tn) * hs, tt = static_cast<long long>(Tn) * Tn;
    const int batch = B_ * NH;
    gemm_rm_batched(blas_.get(), true, false, Tn, hs, Tn, 1.0f, a.att.data(), Tn, tt, dyr_.data(), hs, th, 0.0f, dv, hs,
                    th, batch, act_types(), where);
    gemm_rm_batched(blas_.get(), false, true, Tn, Tn, hs, 1.0f, dyr_.data(), hs, th, v, hs, th, 0.0f, datt_.data(), Tn,
                    tt, batch, act_types(), where);
    const std::size_t rows = static_cast<std::size_t>(batch) * Tn;
    k::softmax_causal_backward<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream_>>>(datt_.data(), a.att.data(), rows, Tn,
                                                                         1.0f / std::sqrt(static_cast<float>(hs)));
    launched();
    gemm_rm_batched(blas_.get(), false, false, Tn, hs, Tn, 1.0f, datt_.data(), Tn, tt, kk, hs, th, 0.0f, dq, hs, th,
                    batch, act_types(), where);
    gemm_rm_batched(blas_.get(), true, false, Tn, hs, Tn, 1.0f, datt_.data(), Tn, tt, q, hs, th, 0.0f, dk, hs, th,
                    batch, act_types(), where);
    k::qkv_permute<Tc, true><<<grid_for(3 * NC), 256, 0, stream_>>>(dqkv_.data(), dq, dk, dv, B_, Tn, NH, hs);
    launched();
  }

  GptConfig cfg_;
  ParamLayout layout_;
  int B_, T_;
  int device_;
  dilocox::cuda::Stream owned_stream_;  // declared before everything that uses it: destroyed last
  cudaStream_t stream_;
  BlasHandle blas_;
  Buf<float> params_, grads_, m_, v_;  // (P) fp32 master weights, gradients, AdamW moments
  Buf<Tc> params_c_;                   // (P) compute copy (bf16 only; fp32 uses params_)
  PinnedBuffer<float> h_params_, h_grads_, h_m_, h_v_;  // (P) host copies
  std::vector<Slot> slots_;
  Buf<Tc> dres_, dln_, datty_, dyr_, dqkv_, dqkvr_, dfch_, datt_;  // backward scratch, one micro-batch
  Buf<float> staging_;                  // (N, C) fp32 activations on their way to or from the host
  PinnedBuffer<float> grad_out_h_, grad_in_h_, losses_h_;
  Buf<double> norms_;                   // (tensors) squared gradient norms
  PinnedBuffer<double> norms_h_;
};

}  // namespace

std::unique_ptr<StageModel> make_cuda_stage_model(const GptConfig& cfg, int stages, int stage, int micro_batch,
                                                  int seq_len, int slots, const Backend& backend) {
  if (backend.precision == Precision::fp32)
    return std::make_unique<CudaStageModel<float>>(cfg, stages, stage, micro_batch, seq_len, slots, backend.gpu);
  return std::make_unique<CudaStageModel<__nv_bfloat16>>(cfg, stages, stage, micro_batch, seq_len, slots, backend.gpu);
}

}  // namespace dilocox::trainer
