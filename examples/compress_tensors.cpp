// compress_tensors: compresses gradient-like matrices every way dilocox can (int8/int4
// quantization alone, low-rank alone, low-rank with quantized factors) and prints a
// compression-ratio-vs-error table in Markdown, marking the best error at each byte
// budget. The matrices are synthetic, with fast and slow spectral decay, or the real
// pseudo-gradients a dilocox-train run dumped (--dump-pseudo-gradients DIR).
//   compress_tensors [--quick] [--shape MxN]... [--from DIR/round0003-stage0.bin]
#include <dilocox/dilocox.hpp>

#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
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

// The 2-D tensors of a pseudo-gradient dump (a sequence of dense fp32 wire payloads).
std::vector<std::pair<std::string, RowM>> read_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw dx::Error("cannot open " + path);
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto bytes = std::as_bytes(std::span<const char>(raw));
  std::vector<std::pair<std::string, RowM>> out;
  for (std::size_t at = 0; at < bytes.size();) {
    const dx::PayloadView v = dx::read_payload(bytes.subspan(at));
    at += v.size;
    if (v.header.kind != dx::PayloadKind::dense_f32 || v.header.shape.ndim != 2) continue;
    RowM x(static_cast<Eigen::Index>(v.header.shape[0]), static_cast<Eigen::Index>(v.header.shape[1]));
    std::memcpy(x.data(), v.body.data(), static_cast<std::size_t>(x.size()) * 4);
    if (x.rows() >= 16 && x.cols() >= 16 && x.norm() > 0) out.emplace_back(std::string(v.name), std::move(x));
  }
  return out;
}

int main(int argc, char** argv) {
  bool quick = false;
  std::vector<std::pair<int, int>> shapes;
  std::vector<std::string> dumps;
  for (int i = 1; i < argc; ++i) {
    int m = 0, n = 0;
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--shape") && i + 1 < argc && std::sscanf(argv[++i], "%dx%d", &m, &n) == 2 &&
               m > 0 && n > 0) {
      shapes.emplace_back(m, n);
    } else if (!std::strcmp(argv[i], "--from") && i + 1 < argc) {
      dumps.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "compress_tensors: bad argument '%s' (use --quick, --shape MxN, --from FILE)\n", argv[i]);
      return 2;
    }
  }
  if (shapes.empty()) shapes = quick ? std::vector<std::pair<int, int>>{{256, 512}}
                                     : std::vector<std::pair<int, int>>{{768, 768}, {768, 3072}};
  const std::vector<int> ranks = quick ? std::vector<int>{2, 8, 32} : std::vector<int>{1, 2, 4, 8, 16, 32, 64};
  const std::vector<std::size_t> blocks = quick ? std::vector<std::size_t>{128} : std::vector<std::size_t>{32, 128, 512};
  const int warm_calls = 4;

  // Every (title, matrix) to compress: real tensors from dumps, or synthetic spectra.
  std::vector<std::pair<std::string, RowM>> inputs;
  try {
    for (const auto& d : dumps)
      for (auto& [name, x] : read_dump(d))
        inputs.emplace_back(name + " (" + std::to_string(x.rows()) + " x " + std::to_string(x.cols()) + ", " + d + ")",
                            std::move(x));
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "compress_tensors: %s\n", e.what());
    return 1;
  }
  if (dumps.empty())
    for (const auto& [m, n] : shapes)
      for (const double decay : {1.5, 0.5}) {
        char title[96];
        std::snprintf(title, sizeof title, "%d x %d, singular values i^-%.1f (%s decay)", m, n, decay,
                      decay > 1 ? "fast" : "slow");
        inputs.emplace_back(title, make_matrix(m, n, decay, 17));
      }

  for (const auto& [title, x] : inputs) {
    {
      const int m = static_cast<int>(x.rows()), n = static_cast<int>(x.cols());
      const std::size_t dense = static_cast<std::size_t>(x.size()) * 4;
      std::vector<Result> rs;
      for (int bits : {8, 4})
        for (std::size_t b : blocks) rs.push_back(quantized_only(x, {.bits = bits, .block = b}));
      for (int r : ranks) {
        if (r > std::min(m, n)) continue;
        rs.push_back(low_rank(x, r, nullptr, warm_calls));
        for (int bits : {8, 4})
          for (std::size_t b : blocks) {
            const dx::QuantConfig q{.bits = bits, .block = b};
            rs.push_back(low_rank(x, r, &q, warm_calls));
          }
      }
      mark_best(rs);
      std::printf("\n### %s\n\n", title.c_str());
      std::printf("| method | bytes | ratio | rel. error | best at its budget |\n|---|---:|---:|---:|:---:|\n");
      for (const auto& r : rs)
        std::printf("| %s | %zu | %.1fx | %.4f | %s |\n", r.method.c_str(), r.bytes,
                    static_cast<double>(dense) / static_cast<double>(r.bytes), r.rel_error, r.best ? "*" : "");
    }
  }
  std::printf("\nratio = fp32 bytes / compressed bytes; low-rank after %d warm-started power iterations.\n", warm_calls);
  return 0;
}
