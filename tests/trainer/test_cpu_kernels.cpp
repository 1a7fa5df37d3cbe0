// The CPU kernels' own contracts, beyond the golden and gradient tests: gemm against a
// double-precision reference for every transpose, beta and odd shape (it swaps operands
// for the column-major BLAS); the same bits for every thread count (a whole GPT step and
// the AdamW update, 1, 2 and 3 threads) and wherever a buffer lies in memory (the
// element-wise kernels at every offset within a cache line); the vectorized AdamW loop
// equal, bit for bit, to the per-element rule it applies.
#include "model/adamw.hpp"
#include "model/cpu/kernels.hpp"
#include "model/gpt_stage.hpp"

#include <dilocox/random.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace dilocox::trainer;
using cpu::Op;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(scale * dilocox::counter_normal(seed, i));
  return v;
}

bool same_bits(const auto& a, const auto& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
}

// Runs body with the kernels on n threads, then back on one.
template <class Body>
void with_threads(int n, Body&& body) {
  cpu::set_threads(n);
  body();
  cpu::set_threads(1);
}

}  // namespace

TEST(CpuGemm, MatchesDoubleReferenceForEveryTransposeAndBeta) {
  for (int m : {1, 2, 31, 65, 130})
    for (int n : {1, 17, 64})
      for (int k : {1, 2, 33, 200})
        for (Op ta : {Op::none, Op::trans})
          for (Op tb : {Op::none, Op::trans})
            for (double beta : {0.0, 1.0, 0.5}) {
              SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k << " ta " << (ta == Op::trans)
                                              << " tb " << (tb == Op::trans) << " beta " << beta);
              // Leading dimensions wider than the matrices, as the kernels' strided views are.
              const int lda = (ta == Op::trans ? m : k) + 3, ldb = (tb == Op::trans ? k : n) + 5, ldc = n + 2;
              const auto a = random_values<double>(static_cast<std::size_t>((ta == Op::trans ? k : m) * lda), 1);
              const auto b = random_values<double>(static_cast<std::size_t>((tb == Op::trans ? n : k) * ldb), 2);
              auto c = random_values<double>(static_cast<std::size_t>(m * ldc), 3);
              std::vector<double> want = c;
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                  double s = 0;
                  for (int p = 0; p < k; ++p)
                    s += (ta == Op::trans ? a[p * lda + i] : a[i * lda + p]) * (tb == Op::trans ? b[j * ldb + p] : b[p * ldb + j]);
                  want[i * ldc + j] = 0.75 * s + (beta == 0 ? 0.0 : beta * c[i * ldc + j]);
                }
              if (beta == 0) std::fill(c.begin(), c.end(), std::nan(""));  // beta 0 must not read C
              for (int i = 0; i < m; ++i)
                for (int j = n; j < ldc; ++j) c[i * ldc + j] = want[i * ldc + j];  // the padding stays
              cpu::gemm(ta, tb, m, n, k, 0.75, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
              double worst = 0;
              for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - want[i]));
              EXPECT_LE(worst, 1e-12 * (k + 1));
            }
}

TEST(CpuGemm, RowSplitGivesTheBitsOfOneCall) {
  const int m = 300, n = 96, k = 257;
  for (Op ta : {Op::none, Op::trans})
    for (Op tb : {Op::none, Op::trans}) {
      SCOPED_TRACE(testing::Message() << "ta " << (ta == Op::trans) << " tb " << (tb == Op::trans));
      const auto a = random_values<float>(static_cast<std::size_t>(m) * k, 4);
      const auto b = random_values<float>(static_cast<std::size_t>(n) * k, 5);
      const int lda = ta == Op::trans ? m : k, ldb = tb == Op::trans ? k : n;
      const auto c0 = random_values<float>(static_cast<std::size_t>(m) * n, 6);
      auto one = c0;
      cpu::gemm(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, one.data(), n);
      for (int t : {2, 3}) {
        auto split = c0;
        with_threads(t, [&] { cpu::gemm_rows(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 1.0f, split.data(), n); });
        EXPECT_TRUE(same_bits(one, split)) << t << " threads";
      }
    }
}

// The element-wise kernels on the same values at 16 different offsets into a buffer.
TEST(CpuKernels, SameBitsWhereverTheBuffersLie) {
  const int N = 5, V = 77, C = 40;
  const auto x = random_values<float>(static_cast<std::size_t>(N) * V, 7, 3.0);
  const auto w = random_values<float>(static_cast<std::size_t>(C), 8), bias = random_values<float>(static_cast<std::size_t>(C), 9);
  std::vector<std::int32_t> targets = {0, 76, 5, 40, 13};
  std::vector<float> first_gelu, first_dgelu, first_probs, first_ln;
  for (std::size_t off = 0; off < 16; ++off) {
    SCOPED_TRACE(off);
    std::vector<float> in(off + x.size()), out(off + x.size()), d(off + x.size());
    std::copy(x.begin(), x.end(), in.begin() + static_cast<long>(off));
    std::copy(x.rbegin(), x.rend(), d.begin() + static_cast<long>(off));
    cpu::gelu_forward(out.data() + off, in.data() + off, x.size());
    std::vector<float> gelu(out.begin() + static_cast<long>(off), out.end());
    cpu::gelu_backward(d.data() + off, in.data() + off, d.data() + off, x.size());
    std::vector<float> dgelu(d.begin() + static_cast<long>(off), d.end());
    std::vector<float> losses(N), mean(N), rstd(N);
    cpu::layernorm_forward(out.data() + off, mean.data(), rstd.data(), in.data() + off, w.data(), bias.data(), N, C);
    std::vector<float> ln(out.begin() + static_cast<long>(off), out.begin() + static_cast<long>(off) + N * C);
    cpu::softmax_cross_entropy(in.data() + off, losses.data(), targets.data(), N, V);
    std::vector<float> probs(in.begin() + static_cast<long>(off), in.end());
    if (off == 0) {
      first_gelu = gelu, first_dgelu = dgelu, first_probs = probs, first_ln = ln;
      continue;
    }
    EXPECT_TRUE(same_bits(gelu, first_gelu)) << "gelu_forward";
    EXPECT_TRUE(same_bits(dgelu, first_dgelu)) << "gelu_backward";
    EXPECT_TRUE(same_bits(ln, first_ln)) << "layernorm_forward";
    EXPECT_TRUE(same_bits(probs, first_probs)) << "softmax_cross_entropy";
  }
}

// One step of a GPT (forward, backward, AdamW) on 1, 2 and 3 threads: the same bits.
TEST(CpuKernels, ThreadCountDoesNotChangeAStep) {
  GptConfig cfg = gpt_preset("tiny");
  cfg.n_layer = 2, cfg.vocab = 600;  // V not a multiple of 16: ragged row ends
  const int B = 3, T = 50;
  std::vector<std::int32_t> tokens(B * T), targets(B * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(dilocox::counter_bits(21, i) % 600);
    targets[i] = static_cast<std::int32_t>(dilocox::counter_bits(22, i) % 600);
  }
  struct Result {
    double loss;
    std::vector<float> probs, grads, params;
  };
  auto run = [&](int threads) {
    Result r;
    with_threads(threads, [&] {
      GptStage<float> m(cfg, 1, 0, B, T, 1);
      m.init(5);
      m.zero_grads();
      r.loss = m.forward(0, tokens.data(), targets.data());
      r.probs.assign(m.probabilities(0).begin(), m.probabilities(0).end());
      m.backward(0, 1.0f / (B * T));
      m.finish_backward();
      r.grads.assign(m.grads().begin(), m.grads().end());
      AdamW adam(m.params().size());
      adam.step(m.params(), m.grads(), m.tensors(), AdamWConfig{}, 1e-3f, 0.5f, 1);
      r.params.assign(m.params().begin(), m.params().end());
    });
    return r;
  };
  const Result one = run(1);
  for (int t : {2, 3}) {
    SCOPED_TRACE(testing::Message() << t << " threads");
    const Result r = run(t);
    EXPECT_EQ(r.loss, one.loss);
    EXPECT_TRUE(same_bits(r.probs, one.probs)) << "probabilities";
    EXPECT_TRUE(same_bits(r.grads, one.grads)) << "gradients";
    EXPECT_TRUE(same_bits(r.params, one.params)) << "parameters after AdamW";
  }
}

// AdamW::step (vectorized, split over threads) against AdamWUpdate::apply one element at
// a time, on tensors of odd sizes at odd offsets, one of them split over the threads.
TEST(AdamW, StepIsTheRuleElementByElement) {
  std::vector<ParamTensor> tensors;
  std::size_t off = 0;
  for (int n : {1, 7, 33, 40000}) {
    ParamTensor t;
    t.name = "t", t.offset = off, t.shape = {n}, t.decay = n % 2 == 1;
    off += static_cast<std::size_t>(n);
    tensors.push_back(t);
  }
  const auto g = random_values<float>(off, 11, 0.1);
  AdamWConfig c;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    auto p = random_values<float>(off, 12), ref = p;
    AdamW adam(off);
    std::vector<float> m(off, 0.0f), v(off, 0.0f);
    for (std::int64_t step = 1; step <= 3; ++step) {
      with_threads(threads, [&] { adam.step(p, g, tensors, c, 1e-2f, 0.7f, step); });
      const AdamWUpdate u(c, 1e-2f, 0.7f, step);
      for (const auto& t : tensors)
        for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i) u.apply(ref[i], m[i], v[i], g[i], t.decay ? c.weight_decay : 0.0f);
    }
    EXPECT_TRUE(same_bits(p, ref));
    EXPECT_TRUE(same_bits(std::vector<float>(adam.m().begin(), adam.m().end()), m));
    EXPECT_TRUE(same_bits(std::vector<float>(adam.v().begin(), adam.v().end()), v));
  }
}

// The pool behind parallel_ranges: over many back-to-back jobs of varying size (workers
// late, early, asleep), every index runs exactly once, nested calls run inline, and the
// thread count can change between jobs.
TEST(CpuThreads, EveryIndexRunsOnceAcrossManyJobs) {
  for (int threads : {2, 3, 8}) {
    SCOPED_TRACE(threads);
    with_threads(threads, [&] {
      std::vector<int> count(5000);
      for (int job = 0; job < 3000; ++job) {
        const std::size_t n = dilocox::counter_bits(31, static_cast<std::uint64_t>(job)) % count.size();
        std::fill(count.begin(), count.end(), 0);
        cpu::parallel_ranges(n, 1 + static_cast<std::size_t>(job % 7), [&](int part, std::size_t b, std::size_t e) {
          ASSERT_LT(part, threads);
          cpu::parallel_for(e - b, [&](std::size_t i) { ++count[b + i]; });  // nested: inline
        });
        for (std::size_t i = 0; i < count.size(); ++i) ASSERT_EQ(count[i], i < n ? 1 : 0) << "job " << job << " index " << i;
      }
    });
  }
}
