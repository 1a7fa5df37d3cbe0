// examples/tensor_file.hpp: reads the tensors of one file as (name, shape, floats), for
// the tools: NumPy .npy (v1.0-3.0, '<f4' or '<f8', C or Fortran order), dilocox wire
// payloads back to back (every kind read_payload + decode_add accept), or raw
// little-endian float32 with a shape the caller gives. The magic bytes tell which.
// Every refusal is one dilocox::Error "FILE: problem"; sizes are checked against the
// file and a limit before anything is allocated. Does not write; does not read .npz.
#pragma once

#include <dilocox/codec.hpp>
#include <dilocox/tensor.hpp>
#include <dilocox/wire.hpp>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dilocox::examples {

// One tensor of a file.
struct NamedArray {
  std::string name;           // the payload's name; the file's name for .npy and raw files
  Shape shape;                // up to max_ndim dimensions
  std::vector<float> values;  // (shape.numel()) row-major (C order), host
};

// Tensors larger than this (8 GiB of floats) are refused before allocation.
inline constexpr std::size_t max_tensor_elements = std::size_t{1} << 31;

// Text from a file (a name, a dtype), fit for a one-line message: control bytes as \xNN.
inline std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    const char* hex = "0123456789abcdef";
    out += {'\\', 'x', hex[u >> 4], hex[u & 15]};
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Shapes: "768x3072", "64x3x3x3"
// ---------------------------------------------------------------------------------------

namespace detail {
// Elements of a shape, or nullopt when the product overflows 64 bits.
inline std::optional<std::uint64_t> checked_numel(const Shape& s) {
  std::uint64_t n = 1;
  for (std::size_t i = 0; i < s.ndim; ++i) {
    if (s.dims[i] != 0 && n > std::numeric_limits<std::uint64_t>::max() / s.dims[i]) return std::nullopt;
    n *= s.dims[i];
  }
  return n;
}
}  // namespace detail

// "768x3072" -> (768, 3072): 1 to max_ndim positive integers joined by 'x'.
inline Shape parse_shape(std::string_view text) {
  const std::string quoted = "shape '" + printable(text) + "'";
  Shape s;
  std::size_t at = 0;
  while (true) {
    const std::size_t end = std::min(text.find('x', at), text.size());
    const std::string_view d = text.substr(at, end - at);
    if (d.empty() || d.find_first_not_of("0123456789") != std::string_view::npos)
      throw Error(quoted + ": expected positive integers joined by 'x', like 768x3072");
    if (s.ndim == max_ndim) throw Error(quoted + ": more than " + std::to_string(max_ndim) + " dimensions");
    std::uint64_t v = 0;
    for (char c : d) {
      if (v > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) throw Error(quoted + ": dimension too large");
      v = v * 10 + static_cast<std::uint64_t>(c - '0');
    }
    if (v == 0) throw Error(quoted + ": a dimension is zero");
    s.dims[s.ndim++] = v;
    if (end == text.size()) break;
    at = end + 1;
  }
  if (!detail::checked_numel(s)) throw Error(quoted + ": the element count overflows 64 bits");
  return s;
}

namespace detail {

// ---------------------------------------------------------------------------------------
// The file: checked once (exists, regular, not empty), then read by offset
// ---------------------------------------------------------------------------------------

class InputFile {
 public:
  explicit InputFile(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) throw Error("no such file");
    if (ec) throw Error("cannot inspect: " + ec.message());
    if (fs::is_directory(st)) throw Error("is a directory, not a file");
    if (!fs::is_regular_file(st)) throw Error("not a regular file (a pipe or a device?)");
    size_ = fs::file_size(path, ec);
    if (ec) throw Error("cannot read its size: " + ec.message());
    if (size_ == 0) throw Error("empty file (0 bytes)");
    in_.open(path, std::ios::binary);
    if (!in_) throw Error(std::string("cannot open: ") + std::strerror(errno));
  }
  std::uint64_t size() const { return size_; }

  // The bytes [at, at + out.size()); callers have checked that they lie in the file.
  void read_at(std::uint64_t at, std::span<std::byte> out) {
    in_.seekg(static_cast<std::streamoff>(at));
    in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!in_) throw Error("read error at byte " + std::to_string(at) + " (did the file change?)");
  }
  void read_at(std::uint64_t at, std::span<float> out) { read_at(at, std::as_writable_bytes(out)); }

 private:
  std::ifstream in_;
  std::uint64_t size_ = 0;
};

inline void check_elements(const Shape& s, std::uint64_t n, std::size_t max_elements) {
  if (n > max_elements)
    throw Error("shape " + s.str() + " has " + std::to_string(n) + " elements, more than the limit of " +
                std::to_string(max_elements));
}

// ---------------------------------------------------------------------------------------
// NumPy .npy: magic, version, header length, a Python dict literal, then the data
// ---------------------------------------------------------------------------------------

struct NpyHeader {
  std::string descr;           // '<f4', '<f8'
  bool fortran_order = false;  // data is column-major (first index fastest)
  Shape shape;
};

// The subset of Python literals a .npy header holds: strings, True/False, int tuples.
class NpyHeaderParser {
 public:
  explicit NpyHeaderParser(std::string_view text) : s_(text) {}

  NpyHeader parse() {
    NpyHeader h;
    bool seen[3] = {false, false, false};  // descr, fortran_order, shape
    expect('{');
    while (!eat('}')) {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        if (peek() == '[') fail("a structured dtype (a list of fields) is not supported");
        h.descr = string_literal(), seen[0] = true;
      } else if (key == "fortran_order") {
        h.fortran_order = bool_literal(), seen[1] = true;
      } else if (key == "shape") {
        h.shape = shape_tuple(), seen[2] = true;
      } else {
        fail("unexpected key '" + printable(key) + "'");
      }
      if (!eat(',')) {
        expect('}');
        break;
      }
    }
    if (!seen[0] || !seen[1] || !seen[2]) fail("'descr', 'fortran_order' and 'shape' are required");
    skip_space();
    if (i_ != s_.size()) fail("text after the dict");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(".npy header: " + what + " (at character " + std::to_string(i_) + ")");
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  char peek() {
    skip_space();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++i_;
    return true;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    const std::size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string v(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return v;
  }
  bool bool_literal() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
      if (s_.substr(i_, std::strlen(word)) == word) {
        i_ += std::strlen(word);
        return value;
      }
    fail("expected True or False");
  }
  Shape shape_tuple() {
    Shape s;
    expect('(');
    while (!eat(')')) {
      skip_space();
      std::uint64_t v = 0;
      const std::size_t start = i_;
      for (; i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; ++i_) {
        if (v > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) fail("dimension too large");
        v = v * 10 + static_cast<std::uint64_t>(s_[i_] - '0');
      }
      if (i_ == start) fail("expected a dimension");
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 wrote 3L
      if (s.ndim == max_ndim) fail("more than " + std::to_string(max_ndim) + " dimensions");
      s.dims[s.ndim++] = v;
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return s;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

// Bytes per element of a dtype this reader takes; throws naming any other.
inline std::size_t npy_item_bytes(const std::string& descr) {
  if (descr == "<f4") return 4;
  if (descr == "<f8") return 8;
  const bool big = !descr.empty() && descr[0] == '>';
  throw Error("dtype '" + printable(descr) + "' is not supported" + (big ? " (big-endian)" : "") +
              "; this reader takes '<f4' (float32) and '<f8' (float64)");
}

// Element `src` of a little-endian '<f4' or '<f8' buffer, as float.
inline float npy_element(const std::byte* data, std::size_t item, std::size_t src) {
  if (item == 4) {
    float f;
    std::memcpy(&f, data + 4 * src, 4);
    return f;
  }
  double d;
  std::memcpy(&d, data + 8 * src, 8);
  return static_cast<float>(d);
}

// out (C order) = the elements of `data` (C or Fortran order) of shape s, as float.
inline void npy_to_row_major(const std::byte* data, std::size_t item, bool fortran, const Shape& s,
                             std::span<float> out) {
  if (!fortran || s.ndim < 2) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = npy_element(data, item, i);
    return;
  }
  // Walk the C-order index (last dimension fastest) and keep its Fortran offset.
  std::array<std::size_t, max_ndim> idx{}, stride{};  // (ndim) index; Fortran strides
  for (std::size_t d = 0, st = 1; d < s.ndim; st *= s.dims[d], ++d) stride[d] = st;
  std::size_t src = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = npy_element(data, item, src);
    for (std::size_t d = s.ndim; d-- > 0;) {
      src += stride[d];
      if (++idx[d] < s.dims[d]) break;
      src -= stride[d] * s.dims[d];
      idx[d] = 0;
    }
  }
}

// The version, header and shape of a .npy file; `data_at` receives the data's offset.
inline NpyHeader read_npy_header(InputFile& f, std::uint64_t& data_at) {
  std::array<std::byte, 12> pre{};  // magic (6), version (2), header length (2 or 4)
  if (f.size() < 10) throw Error("truncated .npy: " + std::to_string(f.size()) + " bytes, the preamble is 10");
  f.read_at(0, std::span(pre).first(10));
  const int major = std::to_integer<int>(pre[6]), minor = std::to_integer<int>(pre[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw Error(".npy version " + std::to_string(major) + "." + std::to_string(minor) +
                " is not supported (1.0, 2.0 and 3.0 are)");
  std::uint64_t len = 0, at = 10;
  if (major == 1) {
    len = static_cast<std::uint64_t>(std::to_integer<unsigned>(pre[8]) | (std::to_integer<unsigned>(pre[9]) << 8));
  } else {
    if (f.size() < 12) throw Error("truncated .npy: " + std::to_string(f.size()) + " bytes, the preamble is 12");
    f.read_at(10, std::span(pre).subspan(10, 2));
    std::uint32_t l32;
    std::memcpy(&l32, pre.data() + 8, 4);
    len = l32, at = 12;
  }
  if (len > f.size() - at)
    throw Error("truncated .npy: the header announces " + std::to_string(len) + " bytes, the file holds " +
                std::to_string(f.size() - at) + " after the preamble");
  std::string text(len, '\0');
  f.read_at(at, std::as_writable_bytes(std::span(text)));
  data_at = at + len;
  return NpyHeaderParser(text).parse();
}

inline NamedArray read_npy(InputFile& f, const std::string& name, std::size_t max_elements) {
  std::uint64_t data_at = 0;
  const NpyHeader h = read_npy_header(f, data_at);
  const std::size_t item = npy_item_bytes(h.descr);
  const std::optional<std::uint64_t> n = checked_numel(h.shape);
  if (!n) throw Error("shape " + h.shape.str() + " overflows");
  check_elements(h.shape, *n, max_elements);
  const std::uint64_t have = f.size() - data_at;  // n * item must equal it; divide, as n * item may overflow
  if (have % item != 0 || *n != have / item) {
    const bool fits = *n <= std::numeric_limits<std::uint64_t>::max() / item;
    throw Error(std::string(*n > have / item ? "truncated .npy: " : ".npy with trailing bytes: ") + "shape " +
                h.shape.str() + " of '" + h.descr + "' needs " + (fits ? std::to_string(*n * item) : "over 2^64") +
                " data bytes, the file holds " + std::to_string(have) + " after the header");
  }
  NamedArray a{name, h.shape, std::vector<float>(*n)};
  if (item == 4 && !h.fortran_order) {
    f.read_at(data_at, std::span<float>(a.values));
  } else {
    std::vector<std::byte> data(have);  // (n * item) the file's elements, in its order
    f.read_at(data_at, data);
    npy_to_row_major(data.data(), item, h.fortran_order, h.shape, a.values);
  }
  return a;
}

// ---------------------------------------------------------------------------------------
// dilocox wire payloads back to back (docs/WIRE.md), and raw float32
// ---------------------------------------------------------------------------------------

inline std::vector<NamedArray> read_payloads(InputFile& f, std::size_t max_elements) {
  constexpr std::uint64_t min_payload = wire_header_bytes + wire_checksum_bytes;
  std::vector<NamedArray> out;
  std::vector<std::byte> buf;  // (one payload) header, name, body, checksum
  for (std::uint64_t at = 0; at < f.size();) {
    const std::string where = "payload " + std::to_string(out.size()) + " at byte " + std::to_string(at);
    const std::uint64_t left = f.size() - at;
    if (left < min_payload)
      throw Error(where + ": truncated: " + std::to_string(left) + " bytes left, a payload has at least " +
                  std::to_string(min_payload));
    buf.resize(wire_header_bytes);
    f.read_at(at, buf);
    if (std::memcmp(buf.data(), "DLCX", 4) != 0) throw Error(where + ": bad magic (not a dilocox payload)");
    const auto name_len = dilocox::detail::get<std::uint16_t>(buf.data(), 80);
    const auto body_len = dilocox::detail::get<std::uint64_t>(buf.data(), 88);
    if (name_len > left - min_payload || body_len > left - min_payload - name_len)
      throw Error(where + ": truncated: the header announces a " + std::to_string(name_len) + "-byte name and " +
                  std::to_string(body_len) + " body bytes, " + std::to_string(left) + " bytes left");
    buf.resize(min_payload + name_len + body_len);
    f.read_at(at, buf);
    PayloadView v;
    try {
      v = read_payload(buf);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    const std::string name = v.name.empty() ? "payload " + std::to_string(out.size()) : std::string(v.name);
    try {
      check_elements(v.header.shape, v.header.shape.numel(), max_elements);  // read_payload checked overflow
    } catch (const Error& e) {
      throw Error(where + " ('" + printable(name) + "'): " + e.what());
    }
    out.push_back({name, v.header.shape, std::vector<float>(v.header.shape.numel(), 0.0f)});
    decode_add(v, out.back().values);
    at += v.size;
  }
  return out;
}

inline NamedArray read_raw(InputFile& f, const std::string& name, const std::optional<Shape>& shape,
                           std::size_t max_elements) {
  if (!shape)
    throw Error("no .npy or dilocox magic, and read as raw float32 it needs a shape (--shape, e.g. 768x3072); "
                "it holds " + std::to_string(f.size()) + " bytes");
  const std::optional<std::uint64_t> n = checked_numel(*shape);
  const bool fits = n && *n <= std::numeric_limits<std::uint64_t>::max() / 4;
  if (!fits || *n * 4 != f.size())
    throw Error("raw float32 of shape " + shape->str() + " needs " + (fits ? std::to_string(*n * 4) : "over 2^64") +
                " bytes, the file holds " + std::to_string(f.size()));
  check_elements(*shape, *n, max_elements);
  NamedArray a{name, *shape, std::vector<float>(*n)};
  f.read_at(0, std::span<float>(a.values));
  return a;
}

inline std::vector<NamedArray> read_any(const std::string& path, const std::optional<Shape>& raw_shape,
                                        std::size_t max_elements) {
  InputFile f(path);
  std::array<std::byte, 6> magic{};
  const std::size_t seen = static_cast<std::size_t>(std::min<std::uint64_t>(f.size(), magic.size()));
  f.read_at(0, std::span(magic).first(seen));
  const auto starts_with = [&](std::string_view m) {
    return seen >= m.size() && std::memcmp(magic.data(), m.data(), m.size()) == 0;
  };
  const std::string name = std::filesystem::path(path).filename().string();
  std::vector<NamedArray> out;
  if (starts_with("\x93NUMPY")) {
    out.push_back(read_npy(f, name, max_elements));
  } else if (starts_with("DLCX")) {
    out = read_payloads(f, max_elements);
  } else {
    out.push_back(read_raw(f, name, raw_shape, max_elements));
  }
  for (const NamedArray& a : out)
    if (!a.values.empty()) return out;
  throw Error("nothing to read: every tensor is empty (the first has shape " + out.front().shape.str() + ")");
}

}  // namespace detail

// ---------------------------------------------------------------------------------------
// The one entry point
// ---------------------------------------------------------------------------------------

// The tensors of the file at `path`: one for .npy and raw files, one per payload for
// dilocox payload files. `raw_shape` is the shape of a raw float32 file (ignored for the
// others, which carry theirs). Throws Error("PATH: problem") on anything it cannot read:
// a directory, an empty or truncated file, a dtype other than '<f4'/'<f8', a raw file
// without a shape or of another size, a tensor over `max_elements`, a corrupted payload.
inline std::vector<NamedArray> read_tensors(const std::string& path, const std::optional<Shape>& raw_shape = {},
                                            std::size_t max_elements = max_tensor_elements) {
  try {
    return detail::read_any(path, raw_shape, max_elements);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace dilocox::examples
