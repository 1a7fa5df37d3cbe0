// Checkpoint files: round trip of named sections; every truncation and any flipped
// byte refused with a message naming the file; the atomic write leaves no temporary
// file and replaces the old file whole; listing finds the steps newest first; the
// folder's layouts, stale temporaries of one prefix, and the test write.
#include "checkpoint.hpp"
#include "checkpoint_folder.hpp"
#include "metrics_file.hpp"

#include <gtest/gtest.h>

#include <fstream>

using namespace dilocox::trainer;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  auto d = fs::temp_directory_path() / ("dilocox_test_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST(Checkpoint, RoundTripsSections) {
  const auto dir = temp_dir();
  std::vector<float> params(1000);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = 0.001f * static_cast<float>(i) - 0.3f;
  Checkpoint c;
  c.put("params", std::span<const float>(params));
  c.put_text("meta", "{\"step\": 7}");
  const auto path = checkpoint_path(dir, "stage0of1", 7);
  c.write_atomically(path);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  const auto r = Checkpoint::read(path);
  std::vector<float> back(1000);
  r.get("params", std::span<float>(back));
  EXPECT_EQ(back, params);
  EXPECT_EQ(r.get_text("meta"), "{\"step\": 7}");
  std::vector<float> wrong(999);
  EXPECT_THROW(r.get("params", std::span<float>(wrong)), dilocox::Error);
  EXPECT_THROW(r.get_text("missing"), dilocox::Error);
  fs::remove_all(dir);
}

TEST(Checkpoint, RefusesTruncatedAndCorruptedFiles) {
  const auto dir = temp_dir();
  std::vector<float> params(300, 1.5f);
  Checkpoint c;
  c.put("params", std::span<const float>(params));
  const auto path = dir / "good.ckpt";
  c.write_atomically(path);
  const std::string bytes = read_all(path);
  const auto bad = dir / "bad.ckpt";
  for (std::size_t cut = 0; cut < bytes.size(); cut += 13) {
    SCOPED_TRACE(cut);
    std::ofstream(bad, std::ios::binary) << bytes.substr(0, cut);
    try {
      Checkpoint::read(bad);
      ADD_FAILURE() << "accepted a truncated file";
    } catch (const dilocox::Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos);
    }
  }
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{20}, bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE(at);
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x01);
    std::ofstream(bad, std::ios::binary) << flipped;
    EXPECT_THROW(Checkpoint::read(bad), dilocox::Error);
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, ListsStepsNewestFirstAndReplacesWhole) {
  const auto dir = temp_dir();
  Checkpoint a, b;
  std::vector<float> x(10, 1.0f), y(20, 2.0f);
  a.put("params", std::span<const float>(x));
  b.put("params", std::span<const float>(y));
  for (int s : {5, 40, 12}) a.write_atomically(checkpoint_path(dir, "stage0of2", s));
  a.write_atomically(checkpoint_path(dir, "stage1of2", 99));
  std::ofstream(dir / "stage0of2-stepXXXXXXXX.ckpt") << "junk";
  EXPECT_EQ(list_checkpoints(dir, "stage0of2"), (std::vector<std::int64_t>{40, 12, 5}));
  b.write_atomically(checkpoint_path(dir, "stage0of2", 40));
  std::vector<float> back(20);
  Checkpoint::read(checkpoint_path(dir, "stage0of2", 40)).get("params", std::span<float>(back));
  EXPECT_EQ(back, y);
  fs::remove_all(dir);
}

TEST(Checkpoint, ListsLayoutsAndRemovesOnlyThisPrefixsTemporaries) {
  const auto dir = temp_dir();
  Checkpoint a;
  std::vector<float> x(4, 1.0f);
  a.put("params", std::span<const float>(x));
  for (const char* p : {"stage0of2-replica0of2", "stage1of2-replica0of2", "stage0of2"})
    a.write_atomically(checkpoint_path(dir, p, 8));
  std::ofstream(dir / "stage0of2-replica0of2-step00000010.ckpt.tmp") << "cut";
  std::ofstream(dir / "stage1of2-replica0of2-step00000010.ckpt.tmp") << "cut";
  std::ofstream(dir / "notes-stepABC.ckpt") << "junk";
  EXPECT_EQ(checkpoint_layouts(dir),
            (std::vector<std::string>{"stage0of2", "stage0of2-replica0of2", "stage1of2-replica0of2"}));
  EXPECT_EQ(remove_stale_temporaries(dir, "stage0of2-replica0of2"), 1);
  EXPECT_FALSE(fs::exists(dir / "stage0of2-replica0of2-step00000010.ckpt.tmp"));
  EXPECT_TRUE(fs::exists(dir / "stage1of2-replica0of2-step00000010.ckpt.tmp"));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, "stage0of2-replica0of2", 8)));
  fs::remove_all(dir);
}

TEST(Checkpoint, TestWriteNamesAnUnusableFolder) {
  const auto dir = temp_dir();
  EXPECT_NO_THROW(probe_checkpoint_dir(dir / "new" / "deeper", "stage0of1"));
  EXPECT_TRUE(fs::is_directory(dir / "new" / "deeper"));
  EXPECT_TRUE(fs::is_empty(dir / "new" / "deeper"));  // the test file is gone
  std::ofstream(dir / "afile") << "x";
  try {
    probe_checkpoint_dir(dir / "afile" / "x", "stage0of1");
    ADD_FAILURE() << "a folder under a file was accepted";
  } catch (const dilocox::Error& e) {
    EXPECT_NE(std::string(e.what()).find("afile/x: cannot create the folder"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointFolder, TestWriteUsesTheLongestNameTheRunWrites) {
  const auto dir = temp_dir();
  EXPECT_EQ(longest_checkpoint_name("stage0of1", 32), std::string("stage0of1-step00000032.ckpt.tmp").size());
  EXPECT_EQ(longest_checkpoint_name("stage0of1", 1234567890), std::string("stage0of1-step1234567890.ckpt.tmp").size());
  // A name of 300 characters exceeds NAME_MAX (255): the probe fails where the short
  // "<prefix>.write-test" alone would pass.
  EXPECT_NO_THROW(probe_checkpoint_dir(dir, "stage0of1", 40));
  try {
    probe_checkpoint_dir(dir, "stage0of1", 300);
    ADD_FAILURE() << "a 300-character file name was accepted";
  } catch (const dilocox::Error& e) {
    EXPECT_NE(std::string(e.what()).find("File name too long"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST(CheckpointFolder, ASecondLockIsRefusedNamingTheHolder) {
  const auto dir = temp_dir();
  fs::create_directories(dir);
  {
    FolderLock held(dir, "dilocox.lock");
    try {
      FolderLock second(dir, "dilocox.lock");  // another open file: flock refuses it even in one process
      ADD_FAILURE() << "the lock was taken twice";
    } catch (const dilocox::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("is in use by another run (host "), std::string::npos) << what;
      EXPECT_NE(what.find("pid " + std::to_string(::getpid()) + ", started "), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(FolderLock(dir, "dilocox.lock"));  // released with its holder
  fs::remove_all(dir);
}

TEST(MetricsFile, ALostLineIsCountedAndNeverLeftHalfWritten) {
  MetricsFile full;
  full.open("/dev/full", true);
  EXPECT_NE(full.write("{\"step\":1}").find("No space left on device"), std::string::npos);
  EXPECT_EQ(full.write("{\"step\":2}"), "");  // warned once
  EXPECT_EQ(full.lost_lines(), 2u);
  const auto dir = temp_dir();
  fs::create_directories(dir);
  const auto path = (dir / "m.jsonl").string();
  MetricsFile m;
  m.open(path, false);
  EXPECT_EQ(m.write("{\"step\":1}"), "");
  fs::remove(path);
  EXPECT_NE(m.write("{\"step\":2}").find("removed or replaced"), std::string::npos);
  EXPECT_EQ(m.write("{\"step\":3}"), "");
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "{\"step\":2}\n{\"step\":3}\n");
  EXPECT_EQ(m.lost_lines(), 0u);
  fs::remove_all(dir);
}
