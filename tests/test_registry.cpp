// The methods by name (compress/registry.hpp): the built-ins build the compressors their
// configs describe, knobs override defaults, bad names and values are errors naming
// them, and a user's method is found like the built-ins.
#include <dilocox/comm/thread.hpp>
#include <dilocox/compress/registry.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace dx = dilocox;

namespace {

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const dx::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, TheBuiltInsInTheirOrder) {
  std::vector<std::string> names;
  for (const auto& m : dx::methods()) names.push_back(m.name);
  const std::vector<std::string> first = {"allreduce", "diloco", "cocktail", "sparseloco", "dilocox"};
  ASSERT_GE(names.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 5), first);
  EXPECT_TRUE(dx::method("allreduce").per_step);
  EXPECT_EQ(dx::method("diloco").overlap_steps, 1);
  EXPECT_EQ(dx::method("diloco").momentum_at, dx::MomentumAt::mean);
  EXPECT_EQ(dx::method("dilocox").momentum_at, dx::MomentumAt::replica);
  for (const auto& m : dx::methods()) {
    EXPECT_FALSE(m.help.empty()) << m.name;
    EXPECT_FALSE(m.defaults.empty()) << m.name;
    for (const auto& k : m.knobs) EXPECT_FALSE(k.help.empty()) << m.name << "." << k.name;
  }
}

// Each built-in at its defaults is the compressor its library config's defaults (with the
// method's documented choices) describe.
TEST(Registry, DefaultsAreTheLibraryConfigs) {
  EXPECT_EQ(dx::make_compressor("dilocox").describe(), dx::LowRankCompressor().describe());
  EXPECT_EQ(dx::make_compressor("sparseloco").describe(), dx::SparseLoCoCompressor().describe());
  EXPECT_EQ(dx::make_compressor("cocktail").describe(), dx::CocktailCompressor().describe());
  dx::DenseConfig d{.codec = {dx::Encoding::quantized, {.bits = 4, .block = 128}}};
  EXPECT_EQ(dx::make_compressor("diloco").describe(), dx::DenseCompressor(d).describe());
  EXPECT_EQ(dx::make_compressor("diloco", {{"bits", 32}}).describe(), dx::DenseCompressor().describe());
}

TEST(Registry, KnobsOverrideTheDefaults) {
  dx::LowRankCompressorConfig c;
  c.rank = 16, c.factor_quant.bits = 8, c.adaptive_config.r_max = 64;
  EXPECT_EQ(dx::make_compressor("dilocox", {{"rank", 16}, {"bits", 8}, {"max_rank", 64}}).describe(),
            dx::LowRankCompressor(c).describe());
  dx::SparseLoCoConfig s;
  s.keep_residual = true, s.k = 32;
  EXPECT_EQ(dx::make_compressor("sparseloco", {{"keep_residual", 1}, {"k", 32}}).describe(),
            dx::SparseLoCoCompressor(s).describe());
  // Without the adaptive rank, max_rank does not bound the fixed rank.
  EXPECT_NO_THROW(dx::make_compressor("dilocox", {{"rank", 64}, {"adaptive", 0}}));
}

TEST(Registry, BadNamesAndValuesAreErrorsNamingThem) {
  EXPECT_EQ(error_of([] { dx::method("dense"); }),
            "unknown method 'dense' (" + dx::method_names() + ")");
  EXPECT_EQ(error_of([] { dx::make_compressor("dilocox", {{"tile", 3}}); }),
            "dilocox: has no knob 'tile' (its knobs: bits, rank, max_rank, adaptive, error_feedback, error_decay)");
  EXPECT_EQ(error_of([] { dx::make_compressor("diloco", {{"bits", 3}}); }), "diloco: bits 3 is not one of 4, 8, 16, 32");
  EXPECT_EQ(error_of([] { dx::make_compressor("dilocox", {{"rank", 2.5}}); }),
            "dilocox: rank must be an integer, got 2.5");
  EXPECT_EQ(error_of([] { dx::make_compressor("dilocox", {{"rank", 40}}); }), "dilocox: max_rank 32 is below rank 40");
  EXPECT_EQ(error_of([] { dx::make_compressor("allreduce"); }),
            "allreduce: runs every step without an outer loop: it has no compressor");
  // The compressor's own checks still run.
  EXPECT_NE(error_of([] { dx::make_compressor("cocktail", {{"topk_fraction", 0}}); }).find("topk_fraction"),
            std::string::npos);
}

// A compressor of the user's: one value per tensor, the replicas' mean of x's mean.
struct MeanCompressor {
  std::vector<dx::TensorSpec> specs;
  void setup(std::span<const dx::TensorSpec> s) { specs.assign(s.begin(), s.end()); }
  std::string describe() const { return "the mean of each tensor"; }
  dx::SyncReport sync(dx::AnyCommunicator& comm, const dx::SyncInput& in, dx::TensorSpans x, dx::TensorSpans mean) {
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      float m = 0;
      for (float v : x[j]) m += v / static_cast<float>(x[j].size());
      std::vector<float> one{m};
      comm.allreduce_sum(std::span<float>(one));
      std::fill(mean[j].begin(), mean[j].end(), one[0] / static_cast<float>(comm.size()));
      std::fill(x[j].begin(), x[j].end(), 0.0f);
    }
    return {.contributors = comm.size()};
  }
};

std::atomic<double> seen_scale{0};

TEST(Registry, AUsersMethodIsFoundLikeTheBuiltIns) {
  const std::string name = "test_registry.mean";
  dx::add_method({.name = name, .help = "the mean of each tensor", .defaults = "none", .knobs = {{"scale", 1, "unused", {}}},
                  .make = [](const dx::KnobReader& k) {
                    seen_scale = k.number("scale");
                    return dx::AnyCompressor(MeanCompressor{});
                  }});
  EXPECT_EQ(dx::method(name).name, name);
  EXPECT_EQ(dx::make_compressor(name, {{"scale", 2}}).describe(), "the mean of each tensor");
  EXPECT_EQ(seen_scale, 2.0);
  dx::make_compressor(name);
  EXPECT_EQ(seen_scale, 1.0);  // the default
  EXPECT_EQ(error_of([&] { dx::add_method({.name = name, .make = [](const dx::KnobReader&) {
                                             return dx::AnyCompressor(MeanCompressor{}); }}); }),
            "add_method: a method called '" + name + "' exists");
  EXPECT_EQ(error_of([] { dx::add_method({.name = "test_registry.nothing"}); }),
            "add_method: 'test_registry.nothing': a method has a compressor factory, or is per_step without one");
  EXPECT_EQ(error_of([] {
              dx::add_method({.name = "test_registry.twice", .knobs = {{"a", 0, "x", {}}, {"a", 1, "y", {}}},
                              .make = [](const dx::KnobReader&) { return dx::AnyCompressor(MeanCompressor{}); }});
            }),
            "add_method: 'test_registry.twice' declares knob 'a' twice");

  // It runs in an OuterLoop like any compressor: two replicas, one round.
  auto comms = dx::make_thread_communicators(2);
  std::vector<std::vector<float>> w(2, std::vector<float>(4, 1.0f));
  std::vector<std::thread> t;
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      dx::OuterLoop loop(comms[static_cast<std::size_t>(r)], {{"w", {4}, w[static_cast<std::size_t>(r)]}},
                         dx::make_compressor(name),
                         {.local_steps = 1, .overlap = false, .outer = dx::NesterovConfig{.lr = 1, .momentum = 0}});
      for (float& v : w[static_cast<std::size_t>(r)]) v += r == 0 ? 1.0f : 3.0f;
      loop.step();
      loop.finish();
    });
  for (auto& th : t) th.join();
  for (int r = 0; r < 2; ++r)
    for (float v : w[static_cast<std::size_t>(r)]) EXPECT_FLOAT_EQ(v, 3.0f) << "replica " << r;
}

}  // namespace
