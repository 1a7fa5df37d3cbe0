// Data path: Brown tag stripping and the by-document split, the BPE tokenizer (round
// trip on any bytes, determinism, save/load), and token shards (round trip; every
// truncation, a flipped byte, a foreign file, a token outside the vocabulary are
// refused with a message naming the file and the fault).
#include "data/batch_sampler.hpp"
#include "data/bpe.hpp"
#include "data/brown_corpus.hpp"
#include "data/token_shard.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

using namespace dilocox::trainer;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("dilocox_test_data_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
void write_file(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }
std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const dilocox::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no dilocox::Error";
  return {};
}
const char* sample_text =
    "The jury said it did find that many of Georgia's registration and election laws\n"
    "\"are outmoded or inadequate and often ambiguous\". It recommended 1,200 changes (maybe).\n";
}  // namespace

TEST(BrownCorpus, StripsTagsAndJoinsPunctuation) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, and/cc 1/2/cd (/( it/pps )/) ./.\n\n";
  EXPECT_EQ(strip_brown_tags(tagged), "The jury said \"no evidence\", and 1/2 (it).\n");
}

TEST(BrownCorpus, SplitsByDocumentDeterministically) {
  const auto dir = temp_dir("brown");
  for (int i = 1; i <= 40; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "c%c%02d", 'a' + i % 3, i);
    std::string doc = "\tWord/nn ";
    doc += std::to_string(i);
    doc += "/cd ./.\n";
    write_file(dir / name, doc);
  }
  write_file(dir / "README", "not a corpus file");
  const auto split = read_brown_corpus(dir, 20);
  EXPECT_EQ(split.train.size(), 38u);
  EXPECT_EQ(split.validation.size(), 2u);
  const auto again = read_brown_corpus(dir, 20);
  EXPECT_EQ(split.validation_names, again.validation_names);
  EXPECT_NE(expect_error([&] { read_brown_corpus(dir / "missing", 20); }).find("missing"), std::string::npos);
  fs::remove_all(dir);
}

TEST(BpeTokenizer, RoundTripsAnyBytesAndCompresses) {
  const auto tok = BpeTokenizer::train({sample_text, sample_text}, 400);
  EXPECT_GT(tok.vocab_size(), 256);
  const auto ids = tok.encode(sample_text);
  EXPECT_LT(ids.size(), std::string(sample_text).size() / 2);
  EXPECT_EQ(tok.decode(ids), sample_text);
  std::mt19937 rng(1);
  std::string random_bytes(4097, '\0');
  for (auto& c : random_bytes) c = static_cast<char>(rng() & 0xff);
  EXPECT_EQ(tok.decode(tok.encode(random_bytes)), random_bytes);
  EXPECT_EQ(tok.decode(tok.encode("")), "");
}

TEST(BpeTokenizer, TrainingIsDeterministicAndSavesLoads) {
  const auto a = BpeTokenizer::train({sample_text}, 280), b = BpeTokenizer::train({sample_text}, 280);
  EXPECT_EQ(a.encode(sample_text), b.encode(sample_text));
  const auto dir = temp_dir("bpe");
  a.save((dir / "t.bpe").string());
  const auto c = BpeTokenizer::load((dir / "t.bpe").string());
  EXPECT_EQ(c.vocab_size(), a.vocab_size());
  EXPECT_EQ(c.encode(sample_text), a.encode(sample_text));
  write_file(dir / "bad.bpe", "dilocox-bpe 1\nvocab 258\n0 300\n");
  EXPECT_NE(expect_error([&] { BpeTokenizer::load((dir / "bad.bpe").string()); }).find("unknown token"),
            std::string::npos);
  EXPECT_NE(expect_error([&] { BpeTokenizer::train({sample_text}, 100); }).find("256"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TokenShard, RoundTripsAndRefusesEveryDamagedFile) {
  const auto dir = temp_dir("shard");
  std::vector<std::uint16_t> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>((i * 7) % 300);
  const auto path = (dir / "s.bin").string();
  write_token_shard(path, tokens, 300);
  const auto s = read_token_shard(path);
  EXPECT_EQ(s.vocab, 300);
  EXPECT_EQ(s.tokens, tokens);

  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto bad = (dir / "bad.bin").string();
  for (std::size_t cut = 0; cut < bytes.size(); cut += 37) {
    SCOPED_TRACE(cut);
    write_file(bad, bytes.substr(0, cut));
    EXPECT_NE(expect_error([&] { read_token_shard(bad); }).find(bad), std::string::npos);
  }
  std::string flipped = bytes;
  flipped[500] ^= 0x10;
  write_file(bad, flipped);
  EXPECT_NE(expect_error([&] { read_token_shard(bad); }).find("checksum"), std::string::npos);
  std::string foreign = bytes;
  foreign[0] = 'X';
  write_file(bad, foreign);
  EXPECT_NE(expect_error([&] { read_token_shard(bad); }).find("magic"), std::string::npos);
  write_token_shard(bad, tokens, 200);  // valid checksum, tokens up to 299 >= 200
  EXPECT_NE(expect_error([&] { read_token_shard(bad); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(expect_error([&] { read_token_shard((dir / "none.bin").string()); }).find("cannot open"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(BatchSampler, SameStepSameWindowsAndStreamsDiffer) {
  TokenShard shard{500, std::vector<std::uint16_t>(10000)};
  for (std::size_t i = 0; i < shard.tokens.size(); ++i) shard.tokens[i] = static_cast<std::uint16_t>(i % 500);
  const BatchSampler a(shard, 32, 1, 0), b(shard, 32, 1, 1);
  std::vector<std::int32_t> x1(4 * 32), y1(4 * 32), x2(4 * 32), y2(4 * 32);
  a.fill(8, 4, x1, y1);
  a.fill(8, 4, x2, y2);
  EXPECT_EQ(x1, x2);
  for (std::size_t i = 0; i < x1.size(); ++i) EXPECT_EQ((x1[i] + 1) % 500, y1[i]);
  b.fill(8, 4, x2, y2);
  EXPECT_NE(x1, x2);
  TokenShard small{500, std::vector<std::uint16_t>(20)};
  EXPECT_NE(expect_error([&] { BatchSampler(small, 32, 1, 0); }).find("fewer than one window"), std::string::npos);
}
