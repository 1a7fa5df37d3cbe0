// Tests of examples/tensor_file.hpp: .npy files written here byte by byte per the NumPy
// format spec (v1.0-3.0, '<f4'/'<f8', C and Fortran order, 0-3 dims), dilocox payloads
// of every kind back to back, raw float32 with a shape, and every refusal with its
// one-line message naming the file. NumPy's own files are read in compress_tensors_cli.sh.
#include "tensor_file.hpp"

#include <dilocox/codec.hpp>
#include <dilocox/half.hpp>
#include <dilocox/sparse_code.hpp>
#include <dilocox/wire.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace dx = dilocox;
namespace fs = std::filesystem;
using dx::examples::NamedArray;
using dx::examples::read_tensors;
using Bytes = std::vector<std::byte>;

namespace {

// ---------------------------------------------------------------------------------------
// Helpers: a scratch folder per test, bytes of values, .npy files by the spec
// ---------------------------------------------------------------------------------------

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("dilocox_tensor_file_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const Bytes& bytes) const {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(f.good()) << path;
    return path;
  }

  // The message read_tensors throws for `path`; fails the test when it does not throw.
  static std::string refusal(const std::string& path, const std::optional<dx::Shape>& shape = {},
                             std::size_t max_elements = dx::examples::max_tensor_elements) {
    try {
      read_tensors(path, shape, max_elements);
    } catch (const dx::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << "the message does not start with the file: " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << "not one line: " << m;
      return m;
    }
    ADD_FAILURE() << path << " was read, a refusal was expected";
    return "";
  }

  fs::path dir_;
};

class TensorFileNpy : public TempDir {};
class TensorFilePayload : public TempDir {};
class TensorFileRaw : public TempDir {};
class TensorFileAny : public TempDir {};

template <class T>
Bytes bytes_of(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> iota_values(std::size_t n, float scale = 0.5f, float offset = -3.0f) {
  std::vector<float> v(n);  // (n) i * scale + offset
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale + offset;
  return v;
}

// The dict np.save writes: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
std::string npy_dict(const std::string& descr, bool fortran, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape +
         ", }";
}

// A .npy file as the spec lays it out: "\x93NUMPY", major, minor, the header length
// (u16 LE for 1.0, u32 LE for 2.0 and 3.0), the dict padded with spaces and ended by
// '\n' so that the data start at a multiple of 64, then the data.
Bytes npy_file(int major, const std::string& dict, const Bytes& data, int minor = 0) {
  const std::size_t pre = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((pre + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes out;
  for (unsigned char c : std::string("\x93NUMPY")) out.push_back(std::byte{c});
  out.push_back(std::byte(major));
  out.push_back(std::byte(minor));
  for (std::size_t i = 0; i < pre - 8; ++i) out.push_back(std::byte((header.size() >> (8 * i)) & 0xff));
  for (unsigned char c : header) out.push_back(std::byte{c});
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// ---------------------------------------------------------------------------------------
// .npy
// ---------------------------------------------------------------------------------------

TEST_F(TensorFileNpy, Float32COrderRoundTripsIn1D2D3D) {
  const std::vector<std::pair<std::string, dx::Shape>> shapes = {
      {"(5,)", {5}}, {"(3, 4)", {3, 4}}, {"(2, 3, 4)", {2, 3, 4}}};
  for (const auto& [text, shape] : shapes) {
    SCOPED_TRACE(text);
    const std::vector<float> v = iota_values(shape.numel());
    const auto got = read_tensors(write("a.npy", npy_file(1, npy_dict("<f4", false, text), bytes_of(v))));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].name, "a.npy");
    EXPECT_EQ(got[0].shape, shape);
    EXPECT_EQ(got[0].values, v);
  }
}

TEST_F(TensorFileNpy, Float64IsConvertedToTheNearestFloat) {
  std::vector<double> d(6);  // (2, 3) values no float holds exactly
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = 0.1 * static_cast<double>(i) - 1.0 / 3.0;
  const auto got = read_tensors(write("d.npy", npy_file(1, npy_dict("<f8", false, "(2, 3)"), bytes_of(d))));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape, (dx::Shape{2, 3}));
  for (std::size_t i = 0; i < d.size(); ++i) EXPECT_EQ(got[0].values[i], static_cast<float>(d[i])) << i;
}

TEST_F(TensorFileNpy, FortranOrder2DIsTheRowMajorMatrixItDenotes) {
  const std::size_t rows = 3, cols = 4;
  std::vector<float> column_major(rows * cols), row_major(rows * cols);  // (3, 4) m[i][j] = 10 i + j
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      column_major[j * rows + i] = static_cast<float>(10 * i + j);
      row_major[i * cols + j] = static_cast<float>(10 * i + j);
    }
  std::vector<double> column_major_f8(column_major.begin(), column_major.end());
  const auto f4 = read_tensors(write("f4.npy", npy_file(1, npy_dict("<f4", true, "(3, 4)"), bytes_of(column_major))));
  const auto f8 =
      read_tensors(write("f8.npy", npy_file(1, npy_dict("<f8", true, "(3, 4)"), bytes_of(column_major_f8))));
  for (const auto* got : {&f4, &f8}) {
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].shape, (dx::Shape{3, 4}));
    EXPECT_EQ((*got)[0].values, row_major);
  }
}

TEST_F(TensorFileNpy, FortranOrder3DAnd1DAreReturnedInCOrder) {
  std::vector<float> f_data(24), c_data(24);  // (2, 3, 4) a[i][j][k] = 100 i + 10 j + k
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 4; ++k) {
        const auto v = static_cast<float>(100 * i + 10 * j + k);
        f_data[i + 2 * (j + 3 * k)] = v;
        c_data[(i * 3 + j) * 4 + k] = v;
      }
  const auto got = read_tensors(write("f3.npy", npy_file(1, npy_dict("<f4", true, "(2, 3, 4)"), bytes_of(f_data))));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape, (dx::Shape{2, 3, 4}));
  EXPECT_EQ(got[0].values, c_data);
  const std::vector<float> v = iota_values(7);  // a vector is the same in both orders
  EXPECT_EQ(read_tensors(write("f1.npy", npy_file(1, npy_dict("<f4", true, "(7,)"), bytes_of(v))))[0].values, v);
}

TEST_F(TensorFileNpy, Versions1To3ReadAlike) {
  const std::vector<float> v = iota_values(12);
  for (int major : {1, 2, 3}) {
    SCOPED_TRACE(major);
    const Bytes file = npy_file(major, npy_dict("<f4", false, "(4, 3)"), bytes_of(v));
    EXPECT_EQ(std::to_integer<int>(file[6]), major);
    const auto got = read_tensors(write("v.npy", file));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].shape, (dx::Shape{4, 3}));
    EXPECT_EQ(got[0].values, v);
  }
}

TEST_F(TensorFileNpy, ASmallFileSpelledOutByteByByte) {
  // np.save of np.array([[1, 2], [-1.5, 0.25]], dtype='<f4'): 10-byte preamble, a
  // 118-byte header (59 characters of dict, 58 spaces, '\n'), 16 bytes of data: the
  // bytes NumPy 1.24 writes.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  ASSERT_EQ(dict.size(), 59u);
  Bytes file;
  for (unsigned char c : std::string("\x93NUMPY\x01\x00\x76\x00", 10)) file.push_back(std::byte{c});
  for (unsigned char c : dict + std::string(58, ' ') + "\n") file.push_back(std::byte{c});
  for (unsigned c : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0xc0, 0xbf, 0x00, 0x00, 0x80, 0x3e})
    file.push_back(std::byte(c));
  ASSERT_EQ(file.size(), 144u);
  const auto got = read_tensors(write("small.npy", file));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape, (dx::Shape{2, 2}));
  EXPECT_EQ(got[0].values, (std::vector<float>{1.0f, 2.0f, -1.5f, 0.25f}));
}

TEST_F(TensorFileNpy, HeaderSpellingsNumPyHasWritten) {
  const std::vector<float> v = iota_values(6);
  const std::vector<std::pair<std::string, dx::Shape>> cases = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", {6}},
      {"{'shape': (3L, 2L), 'fortran_order': False, 'descr': '<f4'}", {3, 2}},  // Python 2, keys reordered
      {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1, 2, 3)}", {1, 2, 3}},
  };
  for (const auto& [dict, shape] : cases) {
    SCOPED_TRACE(dict);
    const auto got = read_tensors(write("h.npy", npy_file(1, dict, bytes_of(v))));
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].shape, shape);
    EXPECT_EQ(got[0].values, v);
  }
  const std::vector<float> one = {4.5f};  // a 0-d array: shape (), one element
  const auto scalar = read_tensors(write("s.npy", npy_file(1, npy_dict("<f4", false, "()"), bytes_of(one))));
  EXPECT_EQ(scalar[0].shape.ndim, 0u);
  EXPECT_EQ(scalar[0].values, one);
}

TEST_F(TensorFileNpy, RefusalsNameTheFileAndTheProblem) {
  const Bytes f12 = bytes_of(iota_values(12));  // 48 bytes: (3, 4) of '<f4'
  Bytes header_cut = npy_file(1, npy_dict("<f4", false, "(3, 4)"), {});
  header_cut.resize(50);
  const std::vector<std::tuple<std::string, Bytes, std::string>> cases = {
      {"big-endian", npy_file(1, npy_dict(">f4", false, "(3, 4)"), f12),
       "dtype '>f4' is not supported (big-endian); this reader takes '<f4' (float32) and '<f8' (float64)"},
      {"int32", npy_file(1, npy_dict("<i4", false, "(3, 4)"), f12), "dtype '<i4' is not supported"},
      {"control bytes", npy_file(1, npy_dict("<f\n", false, "(3, 4)"), f12), "dtype '<f\\x0a' is not supported"},
      {"float16", npy_file(1, npy_dict("<f2", false, "(4, 6)"), f12), "dtype '<f2' is not supported"},
      {"structured", npy_file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (12,), }", f12),
       "a structured dtype (a list of fields) is not supported"},
      {"7 dims", npy_file(1, npy_dict("<f4", false, "(1, 1, 1, 1, 1, 3, 4)"), f12), "more than 6 dimensions"},
      {"version 4", npy_file(4, npy_dict("<f4", false, "(3, 4)"), f12), ".npy version 4.0 is not supported"},
      {"version 1.1", npy_file(1, npy_dict("<f4", false, "(3, 4)"), f12, 1), ".npy version 1.1 is not supported"},
      {"short data", npy_file(1, npy_dict("<f4", false, "(3, 4)"), Bytes(f12.begin(), f12.end() - 8)),
       "truncated .npy: shape (3, 4) of '<f4' needs 48 data bytes, the file holds 40 after the header"},
      {"trailing data", npy_file(1, npy_dict("<f4", false, "(2, 4)"), f12),
       ".npy with trailing bytes: shape (2, 4) of '<f4' needs 32 data bytes, the file holds 48"},
      {"cut header", header_cut, "truncated .npy: the header announces 118 bytes, the file holds 40"},
      {"cut preamble", Bytes(header_cut.begin(), header_cut.begin() + 8),
       "truncated .npy: 8 bytes, the preamble is 10"},
      {"missing key", npy_file(1, "{'descr': '<f4', 'shape': (3, 4), }", f12),
       "'descr', 'fortran_order' and 'shape' are required"},
      {"bad literal", npy_file(1, "{'descr': '<f4', 'fortran_order': No, 'shape': (3, 4), }", f12),
       ".npy header: expected True or False"},
      {"unknown key", npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': 1}", f12),
       "unexpected key 'x'"},
      {"over the limit", npy_file(1, npy_dict("<f4", false, "(65536, 65536)"), f12),
       "shape (65536, 65536) has 4294967296 elements, more than the limit of 2147483648"},
      {"empty array", npy_file(1, npy_dict("<f4", false, "(0, 5)"), {}),
       "nothing to read: every tensor is empty (the first has shape (0, 5))"},
  };
  for (const auto& [what, file, message] : cases) {
    SCOPED_TRACE(what);
    const std::string path = write("bad.npy", file);
    EXPECT_NE(refusal(path).find(message), std::string::npos) << refusal(path);
  }
  // Without an element limit, a shape whose bytes overflow 64 bits is still refused.
  const std::string path = write("huge.npy", npy_file(1, npy_dict("<f8", false, "(4611686018427387904, 2)"), f12));
  EXPECT_NE(refusal(path, {}, SIZE_MAX).find("truncated .npy: shape (4611686018427387904, 2) of '<f8' needs over 2^64"),
            std::string::npos)
      << refusal(path, {}, SIZE_MAX);
}

// ---------------------------------------------------------------------------------------
// dilocox payloads
// ---------------------------------------------------------------------------------------

// Appends a sealed payload carrying x (x.size() == h.shape.numel()) under h.
void append_payload(Bytes& out, dx::PayloadHeader h, const std::string& name, const std::vector<float>& x) {
  Bytes body;
  switch (h.kind) {
    case dx::PayloadKind::dense_f32: body = bytes_of(x); break;
    case dx::PayloadKind::dense_f16:
    case dx::PayloadKind::dense_bf16: {
      std::vector<std::uint16_t> u(x.size());  // (n) binary16 or bfloat16
      for (std::size_t i = 0; i < x.size(); ++i)
        u[i] = h.kind == dx::PayloadKind::dense_f16 ? dx::float_to_half(x[i]) : dx::float_to_bf16(x[i]);
      body = bytes_of(u);
      break;
    }
    case dx::PayloadKind::quantized:
      body.resize(dx::encoded_size(x.size(), h.quant));
      dx::quantize(x, body, h.quant);
      break;
    case dx::PayloadKind::sparse_quantized: {  // every other element
      std::vector<std::uint32_t> idx;  // (nnz) flat positions
      std::vector<float> val;          // (nnz) their values
      for (std::uint32_t i = 0; i < x.size(); i += 2) idx.push_back(i), val.push_back(x[i]);
      h.nnz = static_cast<std::uint32_t>(idx.size());
      body = bytes_of(idx);
      body.resize(body.size() + dx::encoded_size(val.size(), h.quant));
      dx::quantize(val, std::span(body).subspan(idx.size() * 4), h.quant);
      break;
    }
    case dx::PayloadKind::sparse_tiled: {  // the first positions of each tile
      const dx::TiledCode c = dx::tiled_code(h.quant, h.nnz);
      const dx::TileGrid g = dx::tile_grid(h.shape, c);
      std::vector<std::uint32_t> picked;
      for (std::size_t t = 0; t < g.tiles(); ++t)
        for (std::uint32_t p = 0; p < g.kept; ++p) picked.push_back(p);
      body.resize(dx::tiled_encoded_size(h.shape, c));
      dx::encode_tiled(x, h.shape, picked, c, body);
      break;
    }
  }
  const std::size_t at = out.size();
  out.resize(at + dx::payload_size(h, name));
  dx::write_payload(h, name, body, std::span(out).subspan(at));
}

// What the library decodes from the payloads in `file`, in order.
std::vector<std::vector<float>> library_decode(const Bytes& file) {
  std::vector<std::vector<float>> out;
  for (std::size_t at = 0; at < file.size();) {
    const dx::PayloadView v = dx::read_payload(std::span<const std::byte>(file).subspan(at));
    out.emplace_back(v.header.shape.numel(), 0.0f);
    dx::decode_add(v, out.back());
    at += v.size;
  }
  return out;
}

TEST_F(TensorFilePayload, EveryKindBackToBackWithNamesAndShapes) {
  using K = dx::PayloadKind;
  const dx::QuantConfig int8_bf16{.bits = 8, .block = 5, .scale = dx::ScaleFormat::bf16};
  const dx::QuantConfig int4{.bits = 4, .block = 6};
  const std::vector<std::tuple<std::string, dx::PayloadHeader>> payloads = {
      {"w", {K::dense_f32, {3, 4}, {}}},          {"h", {K::dense_f16, {5}, {}}},
      {"b", {K::dense_bf16, {2, 3}, {}}},         {"q8", {K::quantized, {2, 2, 3}, int8_bf16}},
      {"q4", {K::quantized, {3, 5}, int4}},       {"sq", {K::sparse_quantized, {4, 6}, int4}},
      {"st", dx::tiled_header({4, 10}, {.tile = 4, .k = 4})}, {"", {K::dense_f32, {2, 2}, {}}},
  };
  Bytes file;
  std::vector<std::vector<float>> originals;
  for (const auto& [name, h] : payloads) {
    originals.push_back(iota_values(h.shape.numel(), 0.37f, -2.0f));
    append_payload(file, h, name, originals.back());
  }
  const auto got = read_tensors(write("p.bin", file));
  const auto want = library_decode(file);
  ASSERT_EQ(got.size(), payloads.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto& [name, h] = payloads[i];
    SCOPED_TRACE(got[i].name);
    EXPECT_EQ(got[i].name, name.empty() ? "payload 7" : name);
    EXPECT_EQ(got[i].shape, h.shape);
    EXPECT_EQ(got[i].values, want[i]);
  }
  EXPECT_EQ(got[0].values, originals[0]);  // fp32 is exact
  for (std::size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[1].values[i], originals[1][i], 2e-3) << i;  // fp16
  for (std::size_t i = 0; i < 15; ++i) EXPECT_NEAR(got[4].values[i], originals[4][i], 0.3) << i;  // int4: half a step
  for (std::size_t i = 0; i < 24; ++i) {  // sparse: the even positions carried (int4), the odd ones 0
    if (i % 2) EXPECT_EQ(got[5].values[i], 0.0f) << i;
    else EXPECT_NEAR(got[5].values[i], originals[5][i], 0.5 * 6.14 / 7) << i;  // half a step of max |x|
  }
}

TEST_F(TensorFilePayload, RefusalsNameThePayloadAndItsOffset) {
  Bytes two;  // two dense payloads: "a" (2, 3) at byte 0, 129 bytes; "b" (4) at byte 129
  append_payload(two, {dx::PayloadKind::dense_f32, {2, 3}, {}}, "a", iota_values(6));
  append_payload(two, {dx::PayloadKind::dense_f32, {4}, {}}, "b", iota_values(4));
  ASSERT_EQ(two.size(), 129u + 121u);
  Bytes cut(two.begin(), two.end() - 10), garbage = two, corrupt = two, header_only = two;
  garbage.insert(garbage.end(), 200, std::byte{0x41});
  corrupt[129 + 96 + 1 + 5] ^= std::byte{0x01};
  header_only.insert(header_only.end(), two.begin(), two.begin() + 50);
  const std::vector<std::tuple<std::string, Bytes, std::string>> cases = {
      {"cut", cut,
       "payload 1 at byte 129: truncated: the header announces a 1-byte name and 16 body bytes, 111 bytes left"},
      {"garbage after", garbage, "payload 2 at byte 250: bad magic (not a dilocox payload)"},
      {"bit flip", corrupt, "payload 1 at byte 129: read_payload: checksum mismatch (corrupted payload)"},
      {"a piece of a header", header_only,
       "payload 2 at byte 250: truncated: 50 bytes left, a payload has at least 104"},
  };
  for (const auto& [what, file, message] : cases) {
    SCOPED_TRACE(what);
    const std::string path = write("bad.bin", file);
    EXPECT_NE(refusal(path).find(message), std::string::npos) << refusal(path);
  }
}

TEST_F(TensorFilePayload, HugeShapesAreRefusedBeforeAllocation) {
  // A sparse payload of one entry claims 2^40 elements: read_payload accepts it (the
  // body bounds nnz, not count); decoding it densely would need 4 TiB.
  const std::size_t side = std::size_t{1} << 20;
  dx::PayloadHeader h{dx::PayloadKind::sparse_quantized, {side, side}, {.bits = 8, .block = 4}, 1};
  Bytes body = bytes_of(std::vector<std::uint32_t>{5});
  body.resize(4 + dx::encoded_size(1, h.quant));
  dx::quantize(std::vector<float>{1.0f}, std::span(body).subspan(4), h.quant);
  Bytes file(dx::payload_size(h, "huge"));
  dx::write_payload(h, "huge", body, file);
  EXPECT_NE(refusal(write("huge.bin", file)).find(
                "payload 0 at byte 0 ('huge'): shape (1048576, 1048576) has 1099511627776 elements, more than the "
                "limit of 2147483648"),
            std::string::npos);
  // The limit is the caller's: 12 elements pass a limit of 12 and not one of 11.
  Bytes small;
  append_payload(small, {dx::PayloadKind::dense_f32, {3, 4}, {}}, "w", iota_values(12));
  const std::string path = write("small.bin", small);
  EXPECT_EQ(read_tensors(path, {}, 12).size(), 1u);
  EXPECT_NE(refusal(path, {}, 11).find("has 12 elements, more than the limit of 11"), std::string::npos);
}

TEST_F(TensorFilePayload, OnlyEmptyTensorsIsNothingToRead) {
  Bytes file;
  append_payload(file, {dx::PayloadKind::dense_f32, {0, 4}, {}}, "e", {});
  EXPECT_NE(refusal(write("e.bin", file)).find("nothing to read: every tensor is empty (the first has shape (0, 4))"),
            std::string::npos);
  append_payload(file, {dx::PayloadKind::dense_f32, {2, 2}, {}}, "w", iota_values(4));
  const auto got = read_tensors(write("ew.bin", file));  // one empty among others is returned as it is
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].values.empty());
  EXPECT_EQ(got[1].values, iota_values(4));
}

// ---------------------------------------------------------------------------------------
// Raw float32, and what every format shares
// ---------------------------------------------------------------------------------------

TEST_F(TensorFileRaw, ReadWithTheGivenShape) {
  const std::vector<float> v = iota_values(24);
  const std::string path = write("x.f32", bytes_of(v));
  for (const dx::Shape& s : {dx::Shape{4, 6}, dx::Shape{2, 3, 4}, dx::Shape{24}}) {
    SCOPED_TRACE(s.str());
    const auto got = read_tensors(path, s);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].name, "x.f32");
    EXPECT_EQ(got[0].shape, s);
    EXPECT_EQ(got[0].values, v);
  }
  // A .npy carries its shape: a shape given for raw files does not apply to it.
  const std::string npy = write("x.npy", npy_file(1, npy_dict("<f4", false, "(6, 4)"), bytes_of(v)));
  EXPECT_EQ(read_tensors(npy, dx::Shape{4, 6})[0].shape, (dx::Shape{6, 4}));
}

TEST_F(TensorFileRaw, RefusedWithoutAShapeOrWithAnotherSize) {
  const std::string path = write("x.f32", bytes_of(iota_values(12)));
  EXPECT_NE(refusal(path).find("no .npy or dilocox magic, and read as raw float32 it needs a shape (--shape, e.g. "
                               "768x3072); it holds 48 bytes"),
            std::string::npos);
  EXPECT_NE(refusal(path, dx::Shape{3, 5}).find("raw float32 of shape (3, 5) needs 60 bytes, the file holds 48"),
            std::string::npos);
  EXPECT_NE(refusal(path, dx::Shape{100000, 100000})
                .find("raw float32 of shape (100000, 100000) needs 40000000000 bytes, the file holds 48"),
            std::string::npos);
  const std::size_t big = std::size_t{1} << 31;  // 2^62 elements: 2^64 bytes overflow
  EXPECT_NE(refusal(path, dx::Shape{big, big}).find("needs over 2^64 bytes"), std::string::npos);
  EXPECT_NE(refusal(path, dx::Shape{3, 4}, 10).find("shape (3, 4) has 12 elements, more than the limit of 10"),
            std::string::npos);
}

TEST_F(TensorFileAny, DirectoriesEmptyAndMissingFilesAreRefused) {
  fs::create_directories(dir_ / "sub");
  EXPECT_NE(refusal((dir_ / "sub").string()).find(": is a directory, not a file"), std::string::npos);
  EXPECT_NE(refusal(write("empty.npy", {})).find(": empty file (0 bytes)"), std::string::npos);
  EXPECT_NE(refusal((dir_ / "missing.npy").string()).find(": no such file"), std::string::npos);
  const Bytes three = {std::byte{'a'}, std::byte{'b'}, std::byte{'c'}};  // shorter than any magic: raw
  EXPECT_NE(refusal(write("abc", three)).find("needs a shape"), std::string::npos);
  EXPECT_NE(refusal(write("abc", three), dx::Shape{1}).find("needs 4 bytes, the file holds 3"), std::string::npos);
}

TEST(TensorFileParseShape, DimensionsJoinedByX) {
  EXPECT_EQ(dx::examples::parse_shape("768x3072"), (dx::Shape{768, 3072}));
  EXPECT_EQ(dx::examples::parse_shape("64x3x3x3"), (dx::Shape{64, 3, 3, 3}));
  EXPECT_EQ(dx::examples::parse_shape("5"), (dx::Shape{5}));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "expected positive integers"},        {"12x", "expected positive integers"},
      {"x4", "expected positive integers"},      {"4xx4", "expected positive integers"},
      {"-1x2", "expected positive integers"},    {"3X4", "expected positive integers"},
      {"0x4", "a dimension is zero"},            {"1x2x3x4x5x6x7", "more than 6 dimensions"},
      {"99999999999999999999x2", "dimension too large"},
      {"4294967296x4294967296", "the element count overflows 64 bits"},
  };
  for (const auto& [text, message] : bad) {
    SCOPED_TRACE(text);
    try {
      dx::examples::parse_shape(text);
      ADD_FAILURE() << "accepted";
    } catch (const dx::Error& e) {
      EXPECT_NE(std::string(e.what()).find("shape '" + text + "': " + message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
