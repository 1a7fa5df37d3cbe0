// reference_trainer/data/bpe.hpp: a byte-level BPE tokenizer (GPT-2 style): text is
// split into pieces (an optional leading space + a run of letters, of digits or of
// other symbols; runs of whitespace), every byte is a base token, and merges learned
// on the training text join adjacent tokens. No special tokens, no regex engine.
// Training is the classic greedy algorithm with incremental pair counts.
#pragma once

#include <dilocox/config.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dilocox::trainer {

namespace detail {
inline int byte_class(unsigned char c) {  // 0 space, 1 letter, 2 digit, 3 other
  if (c == ' ' || c == '\n' || c == '\t' || c == '\r') return 0;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 128 || c == '\'') return 1;
  if (c >= '0' && c <= '9') return 2;
  return 3;
}
}  // namespace detail

// Calls f(piece) for each pre-token piece of text, in order; the pieces concatenate to text.
template <class F>
void for_each_piece(std::string_view text, F&& f) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    std::size_t start = i;
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == ' ' && i + 1 < n && detail::byte_class(static_cast<unsigned char>(text[i + 1])) != 0) {
      ++i;  // a single space joins the word after it
    } else if (detail::byte_class(c) == 0) {
      while (i < n && detail::byte_class(static_cast<unsigned char>(text[i])) == 0 &&
             !(text[i] == ' ' && i + 1 < n && i > start &&
               detail::byte_class(static_cast<unsigned char>(text[i + 1])) != 0))
        ++i;
      f(text.substr(start, i - start));
      continue;
    }
    const int cls = detail::byte_class(static_cast<unsigned char>(text[i]));
    while (i < n && detail::byte_class(static_cast<unsigned char>(text[i])) == cls) ++i;
    f(text.substr(start, i - start));
  }
}

class BpeTokenizer {
 public:
  static constexpr int byte_tokens = 256;

  BpeTokenizer() { rebuild_tables(); }

  // Learns merges until the vocabulary holds vocab_size tokens (or no pair occurs twice).
  static BpeTokenizer train(const std::vector<std::string_view>& texts, int vocab_size) {
    dilocox::detail::require(vocab_size >= byte_tokens && vocab_size <= 65536, "BpeTokenizer::train",
                             "vocabulary " + std::to_string(vocab_size) + " must be in [256, 65536]");
    std::unordered_map<std::string, std::int64_t> piece_counts;
    for (auto text : texts) for_each_piece(text, [&](std::string_view p) { ++piece_counts[std::string(p)]; });
    // Deterministic word order, whatever the hash map did.
    std::vector<std::pair<std::string, std::int64_t>> sorted(piece_counts.begin(), piece_counts.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::vector<int>> words(sorted.size());
    std::vector<std::int64_t> freq(sorted.size());
    for (std::size_t w = 0; w < sorted.size(); ++w) {
      for (char ch : sorted[w].first) words[w].push_back(static_cast<unsigned char>(ch));
      freq[w] = sorted[w].second;
    }
    std::unordered_map<std::uint64_t, std::int64_t> counts;
    std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> where;  // may hold stale word ids
    auto key = [](int a, int b) { return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint32_t>(b); };
    for (std::size_t w = 0; w < words.size(); ++w)
      for (std::size_t i = 0; i + 1 < words[w].size(); ++i) {
        const auto k = key(words[w][i], words[w][i + 1]);
        counts[k] += freq[w];
        where[k].push_back(static_cast<std::uint32_t>(w));
      }
    BpeTokenizer tok;
    std::vector<char> seen(words.size(), 0);
    while (static_cast<int>(tok.merges_.size()) + byte_tokens < vocab_size) {
      std::uint64_t best = 0;
      std::int64_t best_count = 1;  // a merge must occur at least twice
      for (const auto& [k, c] : counts)
        if (c > best_count || (c == best_count && best_count > 1 && k < best)) best = k, best_count = c;
      if (best_count < 2) break;
      const int a = static_cast<int>(best >> 32), b = static_cast<int>(best & 0xffffffffu);
      const int merged = byte_tokens + static_cast<int>(tok.merges_.size());
      tok.merges_.emplace_back(a, b);
      auto ids = std::move(where[best]);
      where.erase(best);
      for (auto w : ids) {
        if (seen[w]) continue;
        seen[w] = 1;
        auto& s = words[w];
        for (std::size_t i = 0; i + 1 < s.size(); ++i) counts[key(s[i], s[i + 1])] -= freq[w];
        std::vector<int> out;
        out.reserve(s.size());
        for (std::size_t i = 0; i < s.size(); ++i) {
          if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
            out.push_back(merged);
            ++i;
          } else {
            out.push_back(s[i]);
          }
        }
        s = std::move(out);
        for (std::size_t i = 0; i + 1 < s.size(); ++i) {
          const auto k = key(s[i], s[i + 1]);
          counts[k] += freq[w];
          if (s[i] == merged || s[i + 1] == merged) where[k].push_back(w);
        }
      }
      for (auto w : ids) seen[w] = 0;
      for (auto it = counts.begin(); it != counts.end();) it = it->second <= 0 ? counts.erase(it) : std::next(it);
    }
    tok.rebuild_tables();
    return tok;
  }

  int vocab_size() const { return byte_tokens + static_cast<int>(merges_.size()); }

  std::vector<std::uint16_t> encode(std::string_view text) const {
    std::vector<std::uint16_t> out;
    for_each_piece(text, [&](std::string_view p) {
      auto it = cache_.find(std::string(p));
      if (it == cache_.end()) it = cache_.emplace(std::string(p), encode_piece(p)).first;
      out.insert(out.end(), it->second.begin(), it->second.end());
    });
    return out;
  }

  std::string decode(const std::vector<std::uint16_t>& tokens) const {
    std::string s;
    for (auto t : tokens) {
      dilocox::detail::require(t < vocab_size(), "BpeTokenizer::decode",
                               "token " + std::to_string(t) + " is outside the vocabulary of " +
                                   std::to_string(vocab_size()));
      s += bytes_[t];
    }
    return s;
  }

  // Text format: "dilocox-bpe 1", "vocab N", then one merge "a b" per line.
  void save(const std::string& path) const {
    std::ofstream f(path);
    f << "dilocox-bpe 1\nvocab " << vocab_size() << "\n";
    for (auto [a, b] : merges_) f << a << ' ' << b << '\n';
    f.flush();
    dilocox::detail::require(static_cast<bool>(f), "BpeTokenizer::save", "cannot write " + path);
  }

  static BpeTokenizer load(const std::string& path) {
    std::ifstream f(path);
    dilocox::detail::require(static_cast<bool>(f), "BpeTokenizer::load", "cannot open " + path);
    std::string magic, word;
    int version = 0, vocab = 0;
    f >> magic >> version >> word >> vocab;
    dilocox::detail::require(magic == "dilocox-bpe" && version == 1 && word == "vocab", "BpeTokenizer::load",
                             path + " is not a dilocox BPE file (version 1)");
    BpeTokenizer tok;
    int a = 0, b = 0;
    while (f >> a >> b) {
      const int next = tok.vocab_size();
      dilocox::detail::require(a >= 0 && b >= 0 && a < next && b < next, "BpeTokenizer::load",
                               path + ": merge " + std::to_string(next) + " names an unknown token");
      tok.merges_.emplace_back(a, b);
    }
    dilocox::detail::require(tok.vocab_size() == vocab, "BpeTokenizer::load",
                             path + ": holds " + std::to_string(tok.vocab_size()) + " tokens, header says " +
                                 std::to_string(vocab));
    tok.rebuild_tables();
    return tok;
  }

 private:
  void rebuild_tables() {
    bytes_.assign(byte_tokens, {});
    for (int i = 0; i < byte_tokens; ++i) bytes_[i] = std::string(1, static_cast<char>(i));
    rank_.clear();
    for (std::size_t m = 0; m < merges_.size(); ++m) {
      bytes_.push_back(bytes_[merges_[m].first] + bytes_[merges_[m].second]);
      rank_[(static_cast<std::uint64_t>(merges_[m].first) << 32) | static_cast<std::uint32_t>(merges_[m].second)] =
          static_cast<int>(m);
    }
    cache_.clear();
  }

  std::vector<std::uint16_t> encode_piece(std::string_view p) const {
    std::vector<int> s;
    for (char ch : p) s.push_back(static_cast<unsigned char>(ch));
    while (s.size() > 1) {  // merge the lowest-ranked adjacent pair, as training did
      int best_rank = -1;
      std::size_t at = 0;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        auto it = rank_.find((static_cast<std::uint64_t>(s[i]) << 32) | static_cast<std::uint32_t>(s[i + 1]));
        if (it != rank_.end() && (best_rank < 0 || it->second < best_rank)) best_rank = it->second, at = i;
      }
      if (best_rank < 0) break;
      const auto [a, b] = merges_[static_cast<std::size_t>(best_rank)];
      std::vector<int> out;
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (i >= at && i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          out.push_back(byte_tokens + best_rank);
          ++i;
        } else {
          out.push_back(s[i]);
        }
      }
      s = std::move(out);
    }
    return {s.begin(), s.end()};
  }

  std::vector<std::pair<int, int>> merges_;           // merge m makes token 256 + m
  std::vector<std::string> bytes_;                    // token -> bytes
  std::unordered_map<std::uint64_t, int> rank_;       // (a, b) -> merge index
  mutable std::unordered_map<std::string, std::vector<std::uint16_t>> cache_;
};

}  // namespace dilocox::trainer
