// reference_trainer/stage_trainer.hpp: what one rank does per training step: run its
// pipeline stage's share of the schedule over M micro-batches (receiving and sending
// activations and their gradients), sum the tied embedding's gradient, sum the gradient
// and the loss over the D data-parallel copies of the stage (each ran 1/D of the batch),
// agree with the other stages on the loss and the global gradient norm, clip, and take
// an AdamW step.
// Also evaluation (forward only) and the rank's part of a checkpoint.
#pragma once

#include "checkpoint.hpp"
#include "data/batch_sampler.hpp"
#include "model/adamw.hpp"
#include "model/stage_model.hpp"
#include "pipeline/schedule.hpp"
#include "pipeline/stage_link.hpp"

#include <dilocox/comm/cost.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace dilocox::trainer {

struct TrainShape {
  GptConfig model;
  int stages = 1;
  int batch = 16;          // sequences per optimizer step (per replica: all its D pipelines together)
  int dp = 1, dp_rank = 0; // D data-parallel pipelines split the batch; this rank's is dp_rank
  int micro_batches = 1;   // of this pipeline's batch / D sequences: batch / D / micro_batches each
  int seq_len = 128;
  Schedule schedule = Schedule::one_f_one_b;
  Backend backend;         // CPU, or CUDA in fp32 or bf16
  int pipeline_batch() const { return batch / dp; }
  int micro_batch() const { return pipeline_batch() / micro_batches; }
  std::int64_t tokens_per_step() const { return std::int64_t{batch} * seq_len; }
};

struct StepStats {
  double loss = 0;       // mean over the step's tokens
  double grad_norm = 0;  // before clipping
  float lr = 0;
  bool skipped = false;  // a NaN/Inf gradient: no update
  int contributors = 1;  // replicas whose gradient went into the update (AllReduce mode)
};

// Called with the stage's whole gradient after backward, before the norm: returns how
// many replicas contributed (0: skip the update). AllReduce mode averages here.
using GradientHook = std::function<int(std::span<float> grads, bool finite)>;

class StageTrainer {
 public:
  // data_parallel: the D ranks of this stage in this cluster (MPI_COMM_NULL when D = 1).
  StageTrainer(const TrainShape& shape, const AdamWConfig& opt, StageLink& link, MPI_Comm data_parallel,
               std::uint64_t seed)
      : shape_(shape),
        opt_config_(opt),
        link_(link),
        data_parallel_(data_parallel),
        ops_(pipeline_schedule(shape.schedule, shape.stages, link.stage(), shape.micro_batches)),
        model_(make_stage_model(shape.backend, shape.model, shape.stages, link.stage(), shape.micro_batch(),
                                shape.seq_len, pipeline_slots(shape.schedule, shape.stages, link.stage(), shape.micro_batches))) {
    model_->init(seed);
    const auto n = static_cast<std::size_t>(shape.pipeline_batch()) * static_cast<std::size_t>(shape.seq_len);
    inputs_.resize(n);
    targets_.resize(n);
    stats_.resize(static_cast<std::size_t>(2 + 12 * shape.model.n_layer + 2) + 1);
  }

  StageModel& model() { return *model_; }
  void set_gradient_hook(GradientHook hook) { hook_ = std::move(hook); }
  // Fault injection (tests): the next step's loss gradient is NaN on this stage, as a
  // batch with a NaN would make it (backward carries it to the other stages).
  void inject_nan_next_step() { inject_nan_ = true; }
  std::int64_t updates() const { return updates_; }
  // Bytes this rank put on the in-cluster link for the data-parallel gradient sums (ring).
  std::uint64_t data_parallel_bytes() const { return dp_bytes_; }

  // One optimizer step on sequences [step * batch, (step + 1) * batch) of the sampler,
  // of which this pipeline runs its 1/D share.
  StepStats train_step(std::int64_t step, std::int64_t total_steps, const BatchSampler& sampler) {
    const std::size_t B = static_cast<std::size_t>(shape_.micro_batch()), T = static_cast<std::size_t>(shape_.seq_len);
    const auto share = static_cast<std::uint64_t>(shape_.pipeline_batch());
    sampler.fill(static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(shape_.batch) +
                     static_cast<std::uint64_t>(shape_.dp_rank) * share,
                 static_cast<std::size_t>(share), inputs_, targets_);
    model_->zero_grads();
    const float scale = inject_nan_ ? std::numeric_limits<float>::quiet_NaN()
                                    : 1.0f / static_cast<float>(shape_.tokens_per_step());
    double loss_sum = 0;
    for (const auto& op : ops_) {
      const int slot = op.micro % model_->slots();
      if (op.kind == PipeOp::forward) {
        if (!model_->first()) link_.recv_forward(model_->input(slot), op.micro);
        const std::size_t off = static_cast<std::size_t>(op.micro) * B * T;
        loss_sum += model_->forward(slot, inputs_.data() + off, targets_.data() + off);
        if (!model_->last()) link_.send_forward(model_->output(slot), op.micro);
      } else {
        if (!model_->last()) link_.recv_backward(model_->grad_output(), op.micro);
        model_->backward(slot, scale);
        if (!model_->first()) link_.send_backward(model_->grad_input(), op.micro);
      }
    }
    link_.wait_sends();
    model_->finish_backward();
    // The host copy of the gradient, when something here works on it: the tied
    // embedding's two shares summed across stages, the AllReduce hook. One pull, one push.
    const ParamTensor* tied = shape_.stages > 1 ? model_->tied_embedding() : nullptr;
    const bool host = tied || hook_ || shape_.dp > 1;
    if (host) model_->pull_grads();
    if (tied) link_.sum_tied(model_->grad(*tied));
    if (inject_nan_ && model_->last()) loss_sum = std::numeric_limits<double>::quiet_NaN();
    inject_nan_ = false;
    if (shape_.dp > 1) loss_sum = sum_over_data_parallel(model_->grads(), loss_sum);
    int contributors = 1;
    if (hook_) {
      bool finite = true;
      for (float g : model_->grads()) finite = finite && std::isfinite(g);
      contributors = hook_(model_->grads(), finite);
    }
    if (host) model_->push_grads();

    // Squared norm per global tensor (the tied embedding once, on the first stage), the
    // loss, summed over stages; each entry has one contributor, so every stage layout
    // adds the same numbers in the same order.
    std::fill(stats_.begin(), stats_.end(), 0.0);
    model_->grad_square_norms(stats_);
    stats_[stats_.size() - 1] = loss_sum;
    link_.allreduce_sum(stats_);
    double sq = 0;
    for (std::size_t i = 0; i + 1 < stats_.size(); ++i) sq += stats_[i];

    StepStats out;
    out.loss = stats_.back() / static_cast<double>(shape_.tokens_per_step());
    out.grad_norm = std::sqrt(sq);
    out.lr = learning_rate(opt_config_, step, total_steps);
    out.contributors = contributors;
    out.skipped = contributors == 0 || !std::isfinite(out.grad_norm);
    if (!out.skipped) model_->adamw_step(opt_config_, out.lr, clip_scale(opt_config_, out.grad_norm), ++updates_);
    return out;
  }

  // Mean loss over `sequences` evaluation windows (rounded down to whole micro-batches);
  // the D pipelines of a replica take every D-th micro-batch each and sum their losses.
  double evaluate(const BatchSampler& val, std::size_t sequences) {
    const std::size_t B = static_cast<std::size_t>(shape_.micro_batch()), T = static_cast<std::size_t>(shape_.seq_len);
    const std::size_t micro = std::max<std::size_t>(1, sequences / B);
    eval_inputs_.resize(B * T);
    eval_targets_.resize(B * T);
    double loss_sum = 0;
    for (std::size_t m = static_cast<std::size_t>(shape_.dp_rank); m < micro; m += static_cast<std::size_t>(shape_.dp)) {
      val.fill_eval(m * B, B, eval_inputs_, eval_targets_);
      if (!model_->first()) link_.recv_forward(model_->input(0), static_cast<int>(m));
      loss_sum += model_->forward(0, eval_inputs_.data(), eval_targets_.data());
      if (!model_->last()) link_.send_forward(model_->output(0), static_cast<int>(m));
    }
    link_.wait_sends();
    double v[1] = {loss_sum};
    link_.allreduce_sum(v);
    if (shape_.dp > 1)
      detail::mpi_ok(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_SUM, data_parallel_),
                     "MPI_Allreduce (data-parallel evaluation)");
    return v[0] / static_cast<double>(micro * B * T);
  }

  // The parameters and AdamW state (pulled to the host first).
  void save(Checkpoint& c) {
    model_->pull_params();
    model_->pull_optimizer();
    c.put("params", std::span<const float>(model_->params()));
    c.put("adamw.m", std::span<const float>(model_->adam_m()));
    c.put("adamw.v", std::span<const float>(model_->adam_v()));
    const std::int64_t u[1] = {updates_};
    c.put("adamw.updates", std::span<const std::int64_t>(u));
  }
  void load(const Checkpoint& c) {
    c.get("params", model_->params());
    c.get("adamw.m", model_->adam_m());
    c.get("adamw.v", model_->adam_v());
    model_->push_params();
    model_->push_optimizer();
    std::int64_t u[1] = {0};
    c.get("adamw.updates", std::span<std::int64_t>(u));
    updates_ = u[0];
  }

 private:
  // The gradient and the loss summed over the stage's D copies (each scaled its loss by
  // the whole batch's tokens, so the sum is the batch's gradient); the same bits on each.
  double sum_over_data_parallel(std::span<float> grads, double loss_sum) {
    detail::mpi_ok(MPI_Allreduce(MPI_IN_PLACE, grads.data(), detail::mpi_count(grads), MPI_FLOAT, MPI_SUM, data_parallel_),
                   "MPI_Allreduce (data-parallel gradient)");
    detail::mpi_ok(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, data_parallel_),
                   "MPI_Allreduce (data-parallel loss)");
    dp_bytes_ += ring_allreduce_cost(grads.size_bytes(), shape_.dp).bytes + ring_allreduce_cost(8, shape_.dp).bytes;
    return loss_sum;
  }

  TrainShape shape_;
  AdamWConfig opt_config_;
  StageLink& link_;
  MPI_Comm data_parallel_;
  std::uint64_t dp_bytes_ = 0;
  std::vector<PipeOp> ops_;
  std::unique_ptr<StageModel> model_;
  std::int64_t updates_ = 0;
  GradientHook hook_;
  bool inject_nan_ = false;
  std::vector<std::int32_t> inputs_, targets_;            // (batch, T): the step's sequences
  std::vector<std::int32_t> eval_inputs_, eval_targets_;  // (micro-batch, T)
  std::vector<double> stats_;  // squared gradient norm per global tensor, then the loss sum
};

}  // namespace dilocox::trainer
