// Pipeline structure without MPI: the schedules (every micro-batch forward before its
// backward, backwards in order, the slots each stage needs), a simulated run of the
// schedule with blocking receives (no deadlock for S x M up to 8 x 16), and two
// GptStages chained by hand computing exactly the loss and gradients of one stage.
#include "model/gpt_stage.hpp"
#include "pipeline/schedule.hpp"

#include <gtest/gtest.h>

#include <map>
#include <vector>

using namespace dilocox::trainer;

TEST(PipelineSchedule, EveryMicroBatchForwardThenBackwardInOrder) {
  for (auto sched : {Schedule::gpipe, Schedule::one_f_one_b}) {
    for (int S = 1; S <= 8; ++S) {
      for (int M = 1; M <= 16; ++M) {
        for (int s = 0; s < S; ++s) {
          SCOPED_TRACE(testing::Message() << "S " << S << " M " << M << " stage " << s);
          const auto ops = pipeline_schedule(sched, S, s, M);
          ASSERT_EQ(ops.size(), static_cast<std::size_t>(2 * M));
          int next_f = 0, next_b = 0, in_flight = 0, most = 0;
          for (const auto& op : ops) {
            if (op.kind == PipeOp::forward) {
              ASSERT_EQ(op.micro, next_f++);
              most = std::max(most, ++in_flight);
            } else {
              ASSERT_EQ(op.micro, next_b++);
              ASSERT_LT(op.micro, next_f);
              --in_flight;
            }
          }
          EXPECT_LE(most, pipeline_slots(sched, S, s, M));
          if (sched == Schedule::one_f_one_b) {
            EXPECT_LE(most, S - s);
          }
        }
      }
    }
  }
}

// Runs all stages' schedules against each other: a forward of micro m on stage s > 0
// waits for stage s-1's forward of m, a backward on s < S-1 for stage s+1's backward.
TEST(PipelineSchedule, RunsWithoutDeadlock) {
  for (auto sched : {Schedule::gpipe, Schedule::one_f_one_b})
    for (int S = 1; S <= 8; ++S)
      for (int M = 1; M <= 16; ++M) {
        SCOPED_TRACE(testing::Message() << "S " << S << " M " << M);
        std::vector<std::vector<PipeOp>> ops(static_cast<std::size_t>(S));
        for (int s = 0; s < S; ++s) ops[static_cast<std::size_t>(s)] = pipeline_schedule(sched, S, s, M);
        std::vector<std::size_t> pc(static_cast<std::size_t>(S), 0);
        std::map<std::tuple<int, int, int>, bool> done;  // (stage, kind, micro)
        bool progress = true;
        while (progress) {
          progress = false;
          for (int s = 0; s < S; ++s) {
            auto& i = pc[static_cast<std::size_t>(s)];
            if (i == ops[static_cast<std::size_t>(s)].size()) continue;
            const auto op = ops[static_cast<std::size_t>(s)][i];
            const bool ready = op.kind == PipeOp::forward ? (s == 0 || done[{s - 1, 0, op.micro}])
                                                          : (s == S - 1 || done[{s + 1, 1, op.micro}]);
            if (ready) {
              done[{s, op.kind == PipeOp::forward ? 0 : 1, op.micro}] = true;
              ++i;
              progress = true;
            }
          }
        }
        for (int s = 0; s < S; ++s) EXPECT_EQ(pc[static_cast<std::size_t>(s)], static_cast<std::size_t>(2 * M));
      }
}

TEST(PipelineStages, TwoStagesComputeExactlyWhatOneStageDoes) {
  GptConfig cfg = gpt_preset("tiny");
  cfg.n_layer = 3;  // uneven split: stage 0 gets 2 layers
  const int B = 2, T = 16, M = 3;
  std::vector<std::int32_t> tokens(M * B * T), targets(M * B * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(dilocox::counter_bits(5, i) % 4096);
    targets[i] = static_cast<std::int32_t>(dilocox::counter_bits(6, i) % 4096);
  }
  const float scale = 1.0f / (M * B * T);
  GptStage<float> whole(cfg, 1, 0, B, T, 1);
  whole.init(3);
  whole.zero_grads();
  double loss_whole = 0;
  for (int m = 0; m < M; ++m) {
    loss_whole += whole.forward(0, tokens.data() + m * B * T, targets.data() + m * B * T);
    whole.backward(0, scale);
  }
  whole.finish_backward();

  GptStage<float> s0(cfg, 2, 0, B, T, M), s1(cfg, 2, 1, B, T, 1);
  s0.init(3);
  s1.init(3);
  s0.zero_grads();
  s1.zero_grads();
  double loss_split = 0;
  for (int m = 0; m < M; ++m) {  // GPipe order on stage 0, one slot on stage 1
    s0.forward(m, tokens.data() + m * B * T, nullptr);
  }
  for (int m = 0; m < M; ++m) {
    std::copy(s0.output(m).begin(), s0.output(m).end(), s1.input(0).begin());
    loss_split += s1.forward(0, nullptr, targets.data() + m * B * T);
    s1.backward(0, scale);
    std::copy(s1.grad_input().begin(), s1.grad_input().end(), s0.grad_output().begin());
    s0.backward(m, scale);
  }
  EXPECT_EQ(loss_split, loss_whole);
  // The tied embedding: first + last share, as StageLink::sum_tied adds them.
  auto g0 = s0.grad(*s0.tied_embedding()), g1 = s1.grad(*s1.tied_embedding());
  for (std::size_t i = 0; i < g0.size(); ++i) g0[i] = g0[i] + g1[i];
  std::map<std::string, std::vector<float>> split;
  for (auto* s : {&s0, &s1})
    for (const auto& t : s->tensors()) {
      auto g = s->grad(t);
      if (!split.count(t.name)) split[t.name].assign(g.begin(), g.end());
    }
  for (const auto& t : whole.tensors()) {
    SCOPED_TRACE(t.name);
    auto g = whole.grad(t);
    ASSERT_TRUE(split.count(t.name));
    EXPECT_TRUE(std::equal(g.begin(), g.end(), split[t.name].begin())) << "gradients differ";
  }
}
