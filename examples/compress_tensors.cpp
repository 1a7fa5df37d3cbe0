// compress_tensors: compresses gradient-like matrices every way dilocox can (int8/int4
// quantization alone, low-rank alone, low-rank with quantized factors) and prints a
// compression-ratio-vs-error table in Markdown, marking the best error at each byte
// budget. The matrices are synthetic, with fast and slow spectral decay, or read from
// files: NumPy .npy, dilocox payloads (dilocox-train --dump-pseudo-gradients), raw f32.
//   compress_tensors [--quick] [--shape MxN]... | [--shape DIMS] --from FILE...  (--help)
#include <dilocox/dilocox.hpp>

#include "tensor_file.hpp"

#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

struct Result {
  std::string method;  // "int4 b128", "lowrank r8", "lowrank r8 + int4 b128"
  std::size_t bytes;
  double rel_error;    // ||X - X_hat||_F / ||X||_F
  bool best = false;   // no other method is both smaller and more accurate
};

// X = U diag(s) V^T with s_i = i^-decay and random orthonormal U, V: the spectrum of
// a pseudo-gradient, fast (decay ~1.5) or slow (decay ~0.5).
RowM make_matrix(int m, int n, double decay, unsigned seed) {
  const int k = std::min(m, n);
  auto orthonormal = [&](int rows, std::uint64_t s) {
    Eigen::MatrixXf g(rows, k);
    for (Eigen::Index i = 0; i < g.size(); ++i) g.data()[i] = dx::counter_normal(s, static_cast<std::uint64_t>(i));
    Eigen::HouseholderQR<Eigen::MatrixXf> qr(g);
    return Eigen::MatrixXf(qr.householderQ() * Eigen::MatrixXf::Identity(rows, k));
  };
  Eigen::VectorXf sigma(k);
  for (int i = 0; i < k; ++i) sigma[i] = static_cast<float>(std::pow(i + 1.0, -decay));
  return orthonormal(m, seed) * sigma.asDiagonal() * orthonormal(n, seed + 1).transpose();
}

double rel_error(const RowM& x, const RowM& y) { return (x - y).norm() / x.norm(); }

// Quantizes `v` in place (what the receivers decode) and returns the encoded bytes.
std::size_t quantize_in_place(std::span<float> v, const dx::QuantConfig& q) {
  std::vector<std::byte> enc(dx::encoded_size(v.size(), q));
  dx::quantize(v, enc, q);
  dx::dequantize(enc, v, q);
  return enc.size();
}

Result quantized_only(const RowM& x, const dx::QuantConfig& q) {
  RowM y = x;
  const std::size_t bytes = quantize_in_place({y.data(), static_cast<std::size_t>(y.size())}, q);
  return {"int" + std::to_string(q.bits) + " b" + std::to_string(q.block), bytes, rel_error(x, y)};
}

// Low-rank as the compressor runs it: warm-started power iteration, with P quantized
// after orthonormalization and Q computed from the decoded P, then quantized.
Result low_rank(const RowM& x, int rank, const dx::QuantConfig* q, int warm_calls) {
  const auto m = static_cast<std::size_t>(x.rows()), n = static_cast<std::size_t>(x.cols());
  dx::PowerIterationProjector proj(m, n, {.rank = rank});
  RowM y(x.rows(), x.cols());
  std::size_t bytes = 0;
  for (int call = 0; call < warm_calls; ++call) {
    const dx::MatrixView<const float> xv{x.data(), m, n};
    auto p = proj.left(xv);
    proj.orthonormalize_left();
    bytes = q ? quantize_in_place(p.span(), *q) : p.size() * 4;
    auto qv = proj.right(xv);
    bytes += q ? quantize_in_place(qv.span(), *q) : qv.size() * 4;
    proj.reconstruct({y.data(), m, n});
  }
  std::string name = "lowrank r" + std::to_string(rank);
  if (q) name += " + int" + std::to_string(q->bits) + " b" + std::to_string(q->block);
  return {name, bytes, rel_error(x, y)};
}

void mark_best(std::vector<Result>& rs) {
  std::sort(rs.begin(), rs.end(), [](const Result& a, const Result& b) {
    return a.bytes != b.bytes ? a.bytes < b.bytes : a.rel_error < b.rel_error;
  });
  double best = INFINITY;  // lowest error among smaller-or-equal budgets, scanning upward
  for (auto& r : rs) {
    r.best = r.rel_error < best;
    best = std::min(best, r.rel_error);
  }
}

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

constexpr const char* usage_text = R"(usage: compress_tensors [--quick] [--shape MxN]...
       compress_tensors [--quick] [--shape DIMS] --from FILE [[--shape DIMS] --from FILE]...
Compresses matrices every way dilocox can (int8/int4 quantization, low rank, low rank
with quantized factors) and prints, per matrix, a Markdown table of bytes, compression
ratio and relative error.
  --from FILE   read the tensors of FILE (repeatable): a NumPy .npy (float32 or float64,
                C or Fortran order, up to 6 dims), dilocox wire payloads back to back
                (docs/WIRE.md; what dilocox-train --dump-pseudo-gradients writes), or raw
                little-endian float32 (needs --shape). A tensor (d0, d1, ...) is compressed
                as the matrix d0 x d1*...; those smaller than 2 x 2, all zero or not finite
                are skipped and listed on stderr. A file with no usable tensor is an error.
  --shape DIMS  with --from: the shape of the raw float32 files that follow it, e.g.
                768x3072 or 64x3x3x3. Without --from: a synthetic M x N matrix to compress
                (repeatable; at most 2^28 elements; default 768x768 and 768x3072, with
                --quick 256x512).
  --quick       fewer ranks and block sizes (the smoke test ctest runs)
  --help, -h    print this text and exit
Exit status: 0 tables printed; 1 a file unreadable or with no usable tensor; 2 bad arguments.
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Synthetic matrices larger than this (1 GiB of floats) are refused: the table needs
// several copies of each.
constexpr std::size_t max_synthetic_elements = std::size_t{1} << 28;

struct Source {
  std::string path;
  std::optional<dx::Shape> raw_shape;  // the last --shape before this --from
};

struct Options {
  bool quick = false;
  bool help = false;
  std::vector<std::pair<int, int>> synthetic;  // --shape MxN without --from
  std::vector<Source> sources;                 // --from FILE
};

// (768, 3072) -> "768x3072", as the user typed it.
std::string shape_text(const dx::Shape& s) {
  std::string t;
  for (std::size_t i = 0; i < s.ndim; ++i) {
    if (i) t += 'x';
    t += std::to_string(s[i]);
  }
  return t;
}

dx::Shape shape_argument(const char* text) {
  try {
    return dx::examples::parse_shape(text);
  } catch (const dx::Error& e) {
    throw UsageError(std::string("--shape: ") + e.what());
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::vector<dx::Shape> shapes;
  std::optional<dx::Shape> last;  // the latest --shape
  bool last_used = true;          // by a --from after it
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--shape" || a == "--from") {
      if (!has_value) throw UsageError(a + " needs a value");
      if (a == "--shape") {
        shapes.push_back(shape_argument(argv[++i]));
        last = shapes.back(), last_used = false;
      } else {
        o.sources.push_back({argv[++i], last});
        last_used = true;
      }
    } else {
      throw UsageError("bad argument '" + a + "' (see --help)");
    }
  }
  if (!o.sources.empty()) {
    if (!last_used)
      throw UsageError("--shape " + shape_text(*last) +
                       " comes after the last --from: put it before the raw file it describes");
    return o;
  }
  for (const dx::Shape& s : shapes) {
    if (s.ndim != 2)
      throw UsageError("--shape " + shape_text(s) + ": a synthetic matrix has two dimensions, like 768x3072");
    if (s.numel() > max_synthetic_elements)
      throw UsageError("--shape " + shape_text(s) + ": " + std::to_string(s.numel()) + " elements, more than the " +
                       std::to_string(max_synthetic_elements) + " (2^28) of the largest synthetic matrix");
    o.synthetic.emplace_back(static_cast<int>(s[0]), static_cast<int>(s[1]));
  }
  return o;
}

// ---------------------------------------------------------------------------------------
// Inputs: synthetic spectra, or the usable tensors of files
// ---------------------------------------------------------------------------------------

struct Input {
  std::string title;
  RowM x;  // (rows, cols) row-major, host
};

// Why a tensor cannot be compressed as a matrix here, or "" when it can.
std::string unusable(const dx::examples::NamedArray& a) {
  const auto [rows, cols] = dx::matrix_shape(a.shape);
  if (rows < 2 || cols < 2)
    return "reshapes to " + std::to_string(rows) + " x " + std::to_string(cols) + ", smaller than 2 x 2";
  if (!std::all_of(a.values.begin(), a.values.end(), [](float v) { return std::isfinite(v); }))
    return "holds NaN or Inf";
  if (std::all_of(a.values.begin(), a.values.end(), [](float v) { return v == 0.0f; }))
    return "all zeros (no relative error)";
  return "";
}

// The usable tensors of one file; the others are listed on stderr. Throws when none is.
void add_file(const Source& src, std::vector<Input>& inputs) {
  std::vector<dx::examples::NamedArray> tensors = dx::examples::read_tensors(src.path, src.raw_shape);
  std::vector<std::string> skipped;  // "'name' (shape): why"
  std::size_t used = 0;
  for (auto& a : tensors) {
    if (const std::string why = unusable(a); !why.empty()) {
      skipped.push_back("'" + dx::examples::printable(a.name) + "' " + a.shape.str() + ": " + why);
      continue;
    }
    const auto [rows, cols] = dx::matrix_shape(a.shape);
    const std::string dims = std::to_string(rows) + " x " + std::to_string(cols);
    const std::string as = a.shape.ndim == 2 ? dims : a.shape.str() + " as " + dims;
    RowM x = Eigen::Map<const RowM>(a.values.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    a.values = {};
    inputs.push_back({dx::examples::printable(a.name) + " (" + as + ", " + src.path + ")", std::move(x)});
    ++used;
  }
  if (used == 0) {
    std::string why = skipped.front();
    if (skipped.size() > 1) why += "; and " + std::to_string(skipped.size() - 1) + " more";
    throw dx::Error(src.path + ": no tensor usable as a matrix of at least 2 x 2 (" +
                    std::to_string(skipped.size()) + " read; " + why + ")");
  }
  for (const std::string& s : skipped)
    std::fprintf(stderr, "compress_tensors: %s: skipped %s\n", src.path.c_str(), s.c_str());
}

std::vector<Input> synthetic_inputs(const std::vector<std::pair<int, int>>& shapes) {
  std::vector<Input> inputs;
  for (const auto& [m, n] : shapes)
    for (const double decay : {1.5, 0.5}) {
      char title[96];
      std::snprintf(title, sizeof title, "%d x %d, singular values i^-%.1f (%s decay)", m, n, decay,
                    decay > 1 ? "fast" : "slow");
      inputs.push_back({title, make_matrix(m, n, decay, 17)});
    }
  return inputs;
}

// ---------------------------------------------------------------------------------------
// The table of one matrix
// ---------------------------------------------------------------------------------------

void print_table(const Input& in, const std::vector<int>& ranks, const std::vector<std::size_t>& blocks,
                 int warm_calls) {
  const RowM& x = in.x;
  const std::size_t dense = static_cast<std::size_t>(x.size()) * 4;
  const auto min_dim = std::min(x.rows(), x.cols());
  std::vector<Result> rs;
  for (int bits : {8, 4})
    for (std::size_t b : blocks) rs.push_back(quantized_only(x, {.bits = bits, .block = b}));
  for (int r : ranks) {
    if (r > min_dim) continue;
    rs.push_back(low_rank(x, r, nullptr, warm_calls));
    for (int bits : {8, 4})
      for (std::size_t b : blocks) {
        const dx::QuantConfig q{.bits = bits, .block = b};
        rs.push_back(low_rank(x, r, &q, warm_calls));
      }
  }
  mark_best(rs);
  std::printf("\n### %s\n\n", in.title.c_str());
  std::printf("| method | bytes | ratio | rel. error | best at its budget |\n|---|---:|---:|---:|:---:|\n");
  for (const auto& r : rs)
    std::printf("| %s | %zu | %.1fx | %.4f | %s |\n", r.method.c_str(), r.bytes,
                static_cast<double>(dense) / static_cast<double>(r.bytes), r.rel_error, r.best ? "*" : "");
}

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "compress_tensors: %s\n", e.what());
    return 2;
  }
  if (o.help) {
    std::fputs(usage_text, stdout);
    return 0;
  }
  try {
    std::vector<Input> inputs;
    for (const Source& s : o.sources) add_file(s, inputs);
    if (o.sources.empty()) {
      if (o.synthetic.empty())
        o.synthetic = o.quick ? std::vector<std::pair<int, int>>{{256, 512}}
                              : std::vector<std::pair<int, int>>{{768, 768}, {768, 3072}};
      inputs = synthetic_inputs(o.synthetic);
    }
    const std::vector<int> ranks = o.quick ? std::vector<int>{2, 8, 32} : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
    const std::vector<std::size_t> blocks =
        o.quick ? std::vector<std::size_t>{128} : std::vector<std::size_t>{32, 128, 512};
    const int warm_calls = 4;
    for (const Input& in : inputs) print_table(in, ranks, blocks, warm_calls);
    std::printf("\nratio = fp32 bytes / compressed bytes; low-rank after %d warm-started power iterations.\n",
                warm_calls);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "compress_tensors: %s\n", e.what());
    return 1;
  }
  return 0;
}
