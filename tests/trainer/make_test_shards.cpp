// make_test_shards DIR: writes DIR/train.bin and DIR/val.bin, a small learnable token
// stream for the end-to-end trainer tests (vocabulary 64: mostly next = 5 x prev + 3
// mod 64, one token in ten random), so loss falls fast from ln 64 = 4.16.
#include "data/token_shard.hpp"

#include <cstdio>
#include <filesystem>
#include <random>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_test_shards DIR\n");
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  std::mt19937 rng(42);
  for (auto [name, n] : {std::pair{"train.bin", 60000}, std::pair{"val.bin", 6000}}) {
    std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
    std::uint16_t prev = 0;
    for (auto& x : t) {
      x = rng() % 10 == 0 ? static_cast<std::uint16_t>(rng() % 64) : static_cast<std::uint16_t>((5 * prev + 3) % 64);
      prev = x;
    }
    dilocox::trainer::write_token_shard((std::filesystem::path(argv[1]) / name).string(), t, 64);
  }
  return 0;
}
