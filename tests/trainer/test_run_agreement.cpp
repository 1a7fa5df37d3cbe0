// The start agreement's logic without MPI: every flag of dilocox-train has a row in the
// fingerprint table; values are the effective ones; mismatches across ranks and against
// a checkpoint name the flag, the ranks or both values; the verdict puts an unparsed flag
// first, then flags that differ, then failed checks (identical ones grouped); the
// metrics file is cut back to a step. (The collective itself runs in faults_test.sh.)
#include "metrics_file.hpp"
#include "run_agreement.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <unistd.h>

using namespace dilocox::trainer;
using json = nlohmann::json;

namespace {
TrainOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dilocox-train");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto r = parse_train_options(static_cast<int>(argv.size()), argv.data());
  if (auto* e = std::get_if<ParseExit>(&r)) ADD_FAILURE() << "parse failed: " << e->text;
  return std::get<TrainOptions>(r);
}
json report(const TrainOptions& o, const std::string& where) {
  return {{"parsed", true}, {"code", 0}, {"where", where}, {"flags", flag_values(o, false)}};
}
}  // namespace

TEST(FlagTable, EveryFlagHasARow) {
  EXPECT_EQ(unclassified_flags(), std::vector<std::string>{});
  EXPECT_GT(train_flag_names().size(), 40u);
}

TEST(FlagTable, ValuesAreTheEffectiveOnes) {
  const auto a = flag_values(parse({"--model", "tiny", "--stages", "2", "--batch", "8"}), false);
  const auto b = flag_values(parse({"--model", "tiny", "--stages", "2", "--batch", "8", "--micro-batches", "4",
                                    "--seq-len", "64", "--lr", "0.001"}), false);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a["--lr"], "0.001");
  EXPECT_EQ(a["--seq-len"], "64");
  EXPECT_FALSE(a.contains("--sync"));  // one cluster: no sync flag is used
  const auto c = flag_values(parse({"--clusters", "2", "--sync", "diloco"}), true);
  EXPECT_EQ(c["--bits"], "4");
  EXPECT_FALSE(c.contains("--rank"));  // diloco has no rank
  EXPECT_FALSE(c.contains("--eval-every"));  // may change on resume
  EXPECT_FALSE(c.contains("--wan-bandwidth"));  // no --step-seconds: the link changes no number
  const auto d = flag_values(parse({"--clusters", "2", "--step-seconds", "0.5", "--wan-bandwidth", "20Mbps"}), true);
  EXPECT_EQ(d["--wan-bandwidth"], "2e+07");  // the effective bits per second, shortest form
}

TEST(FlagTable, RankRanges) {
  EXPECT_EQ(rank_ranges({0, 1, 2, 4, 6, 7}), "0-2, 4, 6-7");
  EXPECT_EQ(rank_ranges({3}), "3");
}

TEST(RankMismatch, NamesTheFlagAndWhichRanksHoldWhich) {
  const auto a = parse({"--clusters", "2", "--stages", "2"});
  const auto b = parse({"--clusters", "2", "--stages", "2", "--sync", "allreduce", "--lr", "0.003"});
  std::vector<json> v = {flag_values(a, false), flag_values(a, false), flag_values(b, false), flag_values(b, false)};
  EXPECT_EQ(describe_rank_mismatches(v),
            "--lr: 0.001 on ranks 0-1, 0.003 on ranks 2-3; --sync: dilocox on ranks 0-1, allreduce on ranks 2-3");
  v[2]["data"] = "train 1";
  v[0]["data"] = "train 2";  // ranks 1 and 3 read no data: left out of that comparison
  EXPECT_NE(describe_rank_mismatches(v).find("--data-dir contents: train 2 on rank 0, train 1 on rank 2"),
            std::string::npos);
  EXPECT_EQ(describe_rank_mismatches({flag_values(a, false), flag_values(a, false)}), "");
}

TEST(ResumeMismatch, NamesTheFlagTheCheckpointsValueAndTheNewOne) {
  const auto saved = flag_values(parse({"--clusters", "2", "--rank", "8", "--tokens", "1000"}), true);
  const auto now = flag_values(parse({"--clusters", "2", "--rank", "16", "--tokens", "1000", "--eval-every", "3"}), true);
  EXPECT_EQ(describe_resume_mismatches(saved, now), "--rank: 8 in the checkpoint, 16 now");
  const auto overlap = flag_values(parse({"--clusters", "2", "--rank", "8", "--tokens", "1000", "--no-overlap"}), true);
  EXPECT_EQ(describe_resume_mismatches(saved, overlap), "--overlap: on in the checkpoint, off (--no-overlap) now");
  EXPECT_EQ(describe_resume_mismatches(saved, saved), "");
}

TEST(Judge, GoWhenEveryRankAgrees) {
  const auto o = parse({"--clusters", "2"});
  const auto v = judge({report(o, "stage 0, replica 0"), report(o, "stage 0, replica 1")});
  EXPECT_FALSE(v.stop);
  EXPECT_EQ(v.code, 0);
}

TEST(Judge, FailedChecksAreQuotedWithTheirRanksIdenticalOnesOnce) {
  const auto o = parse({"--clusters", "2", "--stages", "2"});
  std::vector<json> r = {report(o, "stage 0, replica 0"), report(o, "stage 1, replica 0"),
                         report(o, "stage 0, replica 1"), report(o, "stage 1, replica 1")};
  for (int k : {2, 3}) {
    r[static_cast<std::size_t>(k)]["code"] = 2;
    r[static_cast<std::size_t>(k)]["message"] = "nodata/train.bin not found";
  }
  const auto v = judge(r);
  EXPECT_TRUE(v.stop);
  EXPECT_EQ(v.code, 2);
  ASSERT_EQ(v.lines.size(), 1u);
  EXPECT_EQ(v.lines[0], "rank 2 (stage 0, replica 1): nodata/train.bin not found [also rank 3]");
  r[1]["code"] = 1;
  r[1]["message"] = "disk on fire";
  const auto w = judge(r);
  EXPECT_EQ(w.code, 1);  // the first failing rank's code
  ASSERT_EQ(w.lines.size(), 2u);
  EXPECT_EQ(w.lines[0], "rank 1 (stage 1, replica 0): disk on fire");
}

TEST(Judge, AnUnparsedFlagComesFirstThenDifferingFlagsThenChecks) {
  const auto a = parse({"--clusters", "2"});
  const auto b = parse({"--clusters", "2", "--batch", "8"});
  std::vector<json> r = {report(a, "replica 0"), report(b, "replica 1")};
  r[0]["code"] = 2;
  r[0]["message"] = "data missing";
  auto v = judge(r);
  ASSERT_EQ(v.lines.size(), 1u);
  EXPECT_EQ(v.lines[0],
            "flags differ between ranks (every rank must run the same configuration): --batch: 16 on rank 0, 8 on rank 1");
  r[1] = json{{"parsed", false}, {"code", 2}, {"message", "The following argument was not expected: --bogus"}};
  v = judge(r);
  ASSERT_EQ(v.lines.size(), 1u);
  EXPECT_EQ(v.lines[0], "rank 1: The following argument was not expected: --bogus");
  EXPECT_EQ(v.code, 2);
}

TEST(Judge, ARunOfOnePrintsTheMessageAlone) {
  json r = report(parse({}), "");
  r["code"] = 2;
  r["message"] = "--inject-nan 7:5: replica 5 does not exist";
  const auto v = judge({r});
  ASSERT_EQ(v.lines.size(), 1u);
  EXPECT_EQ(v.lines[0], "--inject-nan 7:5: replica 5 does not exist");
}

TEST(MetricsFile, CutBackToAStepDroppingTornLines) {
  const auto path = std::filesystem::temp_directory_path() / ("dilocox_metrics_" + std::to_string(::getpid()));
  {
    std::ofstream f(path);
    f << R"({"type":"step","step":1,"loss":4})" << '\n'
      << R"({"type":"eval","step":2,"eval_loss":3})" << '\n'
      << R"({"type":"step","step":2,"loss":3})" << '\n'
      << R"({"type":"step","step":3,"loss":2})" << '\n'
      << R"({"type":"step","st)";  // a line cut short by a kill
  }
  EXPECT_EQ(cut_metrics_after(path.string(), 2), 2u);
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "{\"type\":\"step\",\"step\":1,\"loss\":4}\n{\"type\":\"eval\",\"step\":2,\"eval_loss\":3}\n"
                 "{\"type\":\"step\",\"step\":2,\"loss\":3}\n");
  std::filesystem::remove(path);
  EXPECT_EQ(cut_metrics_after(path.string(), 2), 0u);  // a missing file stays missing
  EXPECT_FALSE(std::filesystem::exists(path));
}
