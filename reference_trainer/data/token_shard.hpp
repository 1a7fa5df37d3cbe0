// reference_trainer/data/token_shard.hpp: token files. A shard is a 40-byte header
// (magic "DLXTOKS\0", version, vocabulary, token count, checksum of the tokens) and
// then the tokens as little-endian uint16. read_token_shard checks everything it can
// (size, magic, version, vocabulary, checksum, every token < vocabulary) and names the
// file and the fault; it never returns a partial shard.
#pragma once

#include <dilocox/checksum.hpp>
#include <dilocox/config.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct TokenShard {
  int vocab = 0;
  std::vector<std::uint16_t> tokens;
};

namespace detail {
inline constexpr char shard_magic[8] = {'D', 'L', 'X', 'T', 'O', 'K', 'S', '\0'};
inline constexpr std::uint32_t shard_version = 1;
struct ShardHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t vocab;
  std::uint64_t count;
  std::uint64_t checksum;
  std::uint64_t reserved;
};
static_assert(sizeof(ShardHeader) == 40);
}  // namespace detail

inline void write_token_shard(const std::string& path, std::span<const std::uint16_t> tokens, int vocab) {
  detail::ShardHeader h{};
  std::memcpy(h.magic, detail::shard_magic, 8);
  h.version = detail::shard_version;
  h.vocab = static_cast<std::uint32_t>(vocab);
  h.count = tokens.size();
  h.checksum = checksum64(std::as_bytes(tokens));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
    f.flush();
    dilocox::detail::require(static_cast<bool>(f), "write_token_shard", "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

inline TokenShard read_token_shard(const std::string& path) {
  const char* where = "read_token_shard";
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  dilocox::detail::require(!ec, where, "cannot open " + path + ": " + ec.message());
  dilocox::detail::require(size >= sizeof(detail::ShardHeader), where,
                           path + " is " + std::to_string(size) + " bytes, shorter than the 40-byte header");
  std::ifstream f(path, std::ios::binary);
  detail::ShardHeader h{};
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  dilocox::detail::require(static_cast<bool>(f), where, "cannot read the header of " + path);
  dilocox::detail::require(std::memcmp(h.magic, detail::shard_magic, 8) == 0, where,
                           path + " is not a dilocox token shard (bad magic)");
  dilocox::detail::require(h.version == detail::shard_version, where,
                           path + " has version " + std::to_string(h.version) + ", this build reads version 1");
  dilocox::detail::require(h.vocab >= 2 && h.vocab <= 65536, where,
                           path + ": vocabulary " + std::to_string(h.vocab) + " is outside [2, 65536]");
  const std::uint64_t expect = sizeof h + 2 * h.count;
  dilocox::detail::require(h.count <= (size - sizeof h) / 2 + 1 && size == expect, where,
                           path + " is " + std::to_string(size) + " bytes, the header's " +
                               std::to_string(h.count) + " tokens need " + std::to_string(expect) +
                               " (truncated or padded file)");
  TokenShard s;
  s.vocab = static_cast<int>(h.vocab);
  s.tokens.resize(h.count);
  f.read(reinterpret_cast<char*>(s.tokens.data()), static_cast<std::streamsize>(2 * h.count));
  dilocox::detail::require(static_cast<bool>(f), where, "cannot read the tokens of " + path);
  dilocox::detail::require(checksum64(std::as_bytes(std::span<const std::uint16_t>(s.tokens))) == h.checksum, where,
                           path + ": checksum mismatch (corrupted file)");
  for (std::size_t i = 0; i < s.tokens.size(); ++i)
    dilocox::detail::require(s.tokens[i] < h.vocab, where,
                             path + ": token " + std::to_string(i) + " = " + std::to_string(s.tokens[i]) +
                                 " is outside the vocabulary of " + std::to_string(h.vocab));
  return s;
}

}  // namespace dilocox::trainer
