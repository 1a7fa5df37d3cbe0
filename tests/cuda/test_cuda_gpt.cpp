// tests/cuda/test_cuda_gpt.cpp (label gpu): the CUDA GPT backend against the CPU one on
// `tiny`: one training step's loss and every gradient, then the parameters after an
// AdamW step on equal gradients; in fp32 (tight: same math, other summation orders) and bf16 (loose: 8-bit
// mantissas). Also two CUDA stages chained by hand through their host activations
// against one CPU stage, and bad tokens refused. Skips without a CUDA device.
#include "model/stage_model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "gpu_test.hpp"

using namespace dilocox::trainer;

namespace {

struct Batch {
  int B = 4, T = 32;
  std::vector<std::int32_t> tokens, targets;
  explicit Batch(int vocab) : tokens(static_cast<std::size_t>(B * T)), targets(tokens.size()) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<std::int32_t>((i * 2654435761u) % static_cast<unsigned>(vocab));
      targets[i] = static_cast<std::int32_t>((i * 40503u + 7) % static_cast<unsigned>(vocab));
    }
  }
};

// Runs one forward + backward of `batch` through the stages (host activations between them).
double run_step(std::vector<StageModel*> stages, const Batch& b) {
  for (StageModel* s : stages) s->zero_grads();
  double loss = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (s > 0) {
      const auto out = stages[s - 1]->output(0);
      auto in = stages[s]->input(0);
      std::copy(out.begin(), out.end(), in.begin());
    }
    loss += stages[s]->forward(0, b.tokens.data(), b.targets.data());
  }
  const float scale = 1.0f / static_cast<float>(b.B * b.T);
  for (std::size_t s = stages.size(); s-- > 0;) {
    if (s + 1 < stages.size()) {
      const auto g = stages[s + 1]->grad_input();
      auto d = stages[s]->grad_output();
      std::copy(g.begin(), g.end(), d.begin());
    }
    stages[s]->backward(0, scale);
    stages[s]->finish_backward();
  }
  return loss / (b.B * b.T);
}

// Largest |a - b| over a tensor, relative to the tensor's largest |b|.
double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  double diff = 0, top = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    top = std::max(top, std::abs(static_cast<double>(b[i])));
  }
  return diff / top;
}

void compare_with_cpu(Precision precision, double loss_tol, double grad_tol, double param_tol) {
  const GptConfig cfg = gpt_preset("tiny");
  const Batch b(cfg.vocab);
  CpuStageModel cpu(cfg, 1, 0, b.B, b.T, 1);
  auto gpu = make_cuda_stage_model(cfg, 1, 0, b.B, b.T, 1, Backend{Device::cuda, precision, 0});
  cpu.init(11);
  gpu->init(11);
  const double l_cpu = run_step({&cpu}, b), l_gpu = run_step({gpu.get()}, b);
  EXPECT_NEAR(l_gpu, l_cpu, loss_tol * l_cpu);
  gpu->pull_grads();
  for (const auto& t : cpu.tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_LT(max_rel_diff(gpu->grad(t), cpu.grad(t)), grad_tol);
  }
  // AdamW on the same gradient (the CPU's, pushed to the device): at step 1 Adam moves
  // every element by about lr * sign(g), so gradients that differ in rounding would make
  // near-zero elements disagree; equal inputs test the update itself.
  std::copy(cpu.grads().begin(), cpu.grads().end(), gpu->grads().begin());
  gpu->push_grads();
  const AdamWConfig opt;
  cpu.adamw_step(opt, 1e-3f, 1.0f, 1);
  gpu->adamw_step(opt, 1e-3f, 1.0f, 1);
  gpu->pull_params();
  for (const auto& t : cpu.tensors()) {
    SCOPED_TRACE(t.name + " after AdamW");
    EXPECT_LT(max_rel_diff(gpu->param(t), cpu.param(t)), param_tol);
  }
}

}  // namespace

class CudaGpt : public dilocox::test::GpuTest {};

TEST_F(CudaGpt, Fp32StepMatchesCpu) { compare_with_cpu(Precision::fp32, 1e-5, 2e-3, 1e-6); }

TEST_F(CudaGpt, Bf16StepMatchesCpuLoosely) { compare_with_cpu(Precision::bf16, 1e-2, 8e-2, 1e-6); }

TEST_F(CudaGpt, TwoCudaStagesMatchOneCpuStage) {
  GptConfig cfg = gpt_preset("tiny");
  cfg.n_layer = 3;
  const Batch b(cfg.vocab);
  CpuStageModel cpu(cfg, 1, 0, b.B, b.T, 1);
  auto s0 = make_cuda_stage_model(cfg, 2, 0, b.B, b.T, 1, Backend{Device::cuda, Precision::fp32, 0});
  auto s1 = make_cuda_stage_model(cfg, 2, 1, b.B, b.T, 1, Backend{Device::cuda, Precision::fp32, 0});
  cpu.init(5);
  s0->init(5);
  s1->init(5);
  const double l_cpu = run_step({&cpu}, b), l_gpu = run_step({s0.get(), s1.get()}, b);
  EXPECT_NEAR(l_gpu, l_cpu, 1e-5 * l_cpu);
  s0->pull_grads();
  s1->pull_grads();
  for (StageModel* s : {s0.get(), s1.get()})
    for (const auto& t : s->tensors()) {
      if (t.name == "wte") continue;  // split over the two stages: summed by the pipeline
      const auto& whole = cpu.tensors();
      const auto it = std::find_if(whole.begin(), whole.end(), [&](const ParamTensor& w) { return w.name == t.name; });
      ASSERT_NE(it, whole.end());
      SCOPED_TRACE(t.name);
      EXPECT_LT(max_rel_diff(s->grad(t), cpu.grad(*it)), 2e-3);
    }
  // The tied embedding: the two stages' shares add up to the single stage's gradient.
  const auto g0 = s0->grad(*s0->tied_embedding()), g1 = s1->grad(*s1->tied_embedding());
  std::vector<float> sum(g0.size());
  for (std::size_t i = 0; i < sum.size(); ++i) sum[i] = g0[i] + g1[i];
  EXPECT_LT(max_rel_diff(sum, cpu.grad(*cpu.tied_embedding())), 2e-3);
}

TEST_F(CudaGpt, TokenOutsideVocabularyIsRefused) {
  const GptConfig cfg = gpt_preset("tiny");
  Batch b(cfg.vocab);
  b.tokens[5] = cfg.vocab;
  auto gpu = make_cuda_stage_model(cfg, 1, 0, b.B, b.T, 1, Backend{Device::cuda, Precision::bf16, 0});
  gpu->init(1);
  EXPECT_THROW(gpu->forward(0, b.tokens.data(), b.targets.data()), dilocox::Error);
}
