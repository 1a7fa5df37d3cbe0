// adopt_dilocox: an existing data-parallel trainer (a two-layer MLP regression with Adam,
// one replica per thread here; one per process or site with MpiCommunicator) adopting
// dilocox: identical initialization, the parameters handed to OuterLoop as they are held
// (Eigen matrices), a step-budget loop calling loop.step() after each inner step (H is
// the loop's business), checkpoints (parameters, Adam, loop.save_state()) and a resume
// that continues bit for bit. Runs 300 steps straight, then again stopped at step 170
// and resumed from the checkpoint, and checks both end with the same weights; the
// compressor (with its configuration) is chosen at run time, and the bytes on the wire
// counted, the final syncs of finish() included.
//   adopt_dilocox [CHECKPOINT_DIR [dilocox|sparseloco|diloco]]
#include <dilocox/dilocox.hpp>

#include <Eigen/Dense>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace dx = dilocox;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// ---- the trainer as it was: model, data, Adam ----------------------------------------
struct Mlp {  // y = W2 tanh(W1 x + b1) + b2
  Mat w1, w2;
  Eigen::VectorXf b1, b2;
  explicit Mlp(std::uint64_t seed) {  // the same seed on every replica: identical start
    auto init = [&](int r, int c, std::uint64_t s) {
      Mat m(r, c);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = dx::counter_normal(s, i) / std::sqrt(float(c));
      return m;
    };
    w1 = init(64, 16, seed), w2 = init(4, 64, seed + 1);
    b1 = Eigen::VectorXf::Zero(64), b2 = Eigen::VectorXf::Zero(4);
  }
  std::vector<float*> parts() { return {w1.data(), b1.data(), w2.data(), b2.data()}; }
  std::vector<Eigen::Index> sizes() const { return {w1.size(), b1.size(), w2.size(), b2.size()}; }
};

// One Adam step on the replica's batch `step`; returns the batch loss.
struct Trainer {
  Mlp model{42};
  std::vector<std::vector<float>> m, v;  // Adam moments per parameter tensor
  long t = 0;
  int replica;
  explicit Trainer(int r) : replica(r) {
    for (auto n : model.sizes()) m.emplace_back(n, 0.0f), v.emplace_back(n, 0.0f);
  }
  double step(long s) {
    Mat x(32, 16), y(32, 4);  // this replica's data: y = sin(x A) for a fixed A
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = dx::counter_normal(dx::stream_seed(7, s, replica), i);
    Mat a(16, 4);
    for (Eigen::Index i = 0; i < a.size(); ++i) a.data()[i] = dx::counter_normal(99, i) * 0.5f;
    y = (x * a).array().sin().matrix();
    const Mat h = ((x * model.w1.transpose()).rowwise() + model.b1.transpose()).array().tanh().matrix();
    const Mat d = ((h * model.w2.transpose()).rowwise() + model.b2.transpose() - y) / 32.0f;
    const Mat dh = ((d * model.w2).array() * (1 - h.array().square())).matrix();
    const Mat gw1 = dh.transpose() * x, gw2 = d.transpose() * h;
    const Eigen::VectorXf gb1 = dh.colwise().sum().transpose(), gb2 = d.colwise().sum().transpose();
    const std::vector<const float*> g = {gw1.data(), gb1.data(), gw2.data(), gb2.data()};
    ++t;
    const float c1 = 1 - std::pow(0.9f, float(t)), c2 = 1 - std::pow(0.999f, float(t));
    auto p = model.parts();
    for (std::size_t k = 0; k < p.size(); ++k)
      for (std::size_t i = 0; i < m[k].size(); ++i) {
        m[k][i] = 0.9f * m[k][i] + 0.1f * g[k][i];
        v[k][i] = 0.999f * v[k][i] + 0.001f * g[k][i] * g[k][i];
        p[k][i] -= 3e-3f * (m[k][i] / c1) / (std::sqrt(v[k][i] / c2) + 1e-8f);
      }
    return 16.0 * d.squaredNorm();
  }
};

// ---- checkpoints: the trainer's own state, plus the outer loop's bytes -----------------
void save(const std::string& path, Trainer& tr, long step, dx::OuterLoop<dx::ThreadCommunicator>& loop) {
  dx::StateWriter w;
  w.value(step), w.value(tr.t);
  auto p = tr.model.parts();
  const auto n = tr.model.sizes();
  for (std::size_t k = 0; k < p.size(); ++k) {
    w.values(std::span<const float>(p[k], static_cast<std::size_t>(n[k])));
    w.values(std::span<const float>(tr.m[k])), w.values(std::span<const float>(tr.v[k]));
  }
  const auto outer = loop.save_state();  // waits for the sync in flight, applies nothing
  w.values(std::span<const std::byte>(outer));
  std::ofstream(path + ".tmp", std::ios::binary).write(reinterpret_cast<const char*>(w.bytes().data()),
                                                       static_cast<std::streamsize>(w.bytes().size()));
  std::filesystem::rename(path + ".tmp", path);  // a crash leaves the old file or the new one
}

// Loads the trainer's state; returns the step and the outer loop's state to load.
long load(const std::string& path, Trainer& tr, std::vector<std::byte>& outer) {
  std::ifstream f(path, std::ios::binary);
  const std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  dx::StateReader r(std::as_bytes(std::span<const char>(raw)));
  const long step = r.value<long>();
  tr.t = r.value<long>();
  auto p = tr.model.parts();
  const auto n = tr.model.sizes();
  for (std::size_t k = 0; k < p.size(); ++k) {
    r.values(std::span<float>(p[k], static_cast<std::size_t>(n[k])));
    r.values(std::span<float>(tr.m[k])), r.values(std::span<float>(tr.v[k]));
  }
  outer = r.vector<std::byte>();
  return step;
}

// ---- the training loop with dilocox --------------------------------------------------
// Any compressor, with its configuration, behind one type chosen at run time.
dx::AnyCompressor make_compressor(const std::string& name) {
  if (name == "sparseloco") return dx::SparseLoCoCompressor({.k = 32});  // top-32 per 64 x 64 tile
  if (name == "diloco") return dx::DenseCompressor({.codec = {dx::Encoding::quantized, {.bits = 4, .block = 128}}});
  if (name == "dilocox") return dx::LowRankCompressor({.rank = 4});
  throw dx::Error("unknown compressor '" + name + "' (dilocox, sparseloco, diloco)");
}
std::string compressor_name = "dilocox";
std::uint64_t wire_bytes = 0;  // replica 0's, over the last run
// Trains replica `r` from step 0 (or from the checkpoint) to `budget`, or until `stop_at`.
Mat train(dx::ThreadCommunicator& comm, long budget, long stop_at, const std::string& dir) {
  Trainer tr(comm.rank());
  const std::string ckpt = dir + "/replica" + std::to_string(comm.rank()) + ".ckpt";
  std::vector<std::byte> outer_state;
  const bool resume = std::filesystem::exists(ckpt);
  long step = resume ? load(ckpt, tr, outer_state) : 0;
  dx::OuterLoopConfig cfg;         // overlap (one-step delay), momentum at the replica
  cfg.local_steps = 10;            // H0: where H starts (the adaptive rule moves it; every replica agrees)
  cfg.defer_start_check = resume;  // resumed replicas' weights legitimately differ
  dx::OuterLoop loop(comm,
                     {dx::named("fc1.weight", tr.model.w1), dx::named("fc1.bias", tr.model.b1),
                      dx::named("fc2.weight", tr.model.w2), dx::named("fc2.bias", tr.model.b2)},
                     make_compressor(compressor_name), cfg);
  if (resume) loop.load_state(outer_state);
  std::uint64_t wire = 0;
  while (step < budget) {  // the stop condition is the trainer's: the same on every replica
    tr.step(step++);
    for (const auto& s : loop.step()) wire += s.wire_bytes;  // syncs when its turn comes; the weights changed
    if (step % 50 == 0) save(ckpt, tr, step, loop);
    if (step == stop_at) return {};  // a "crash": the next run resumes from the last checkpoint
  }
  for (const auto& s : loop.finish()) wire += s.wire_bytes;  // the last syncs are bytes on the wire too
  if (comm.rank() == 0) wire_bytes = wire;  // the model is now the global one, identical on every replica
  return tr.model.w1;
}

Mat run(int k, long budget, long stop_at, const std::string& dir) {
  auto comms = dx::make_thread_communicators(k);  // one process each: dx::MpiCommunicator(MPI_COMM_WORLD)
  std::vector<Mat> out(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) threads.emplace_back([&, r] { out[r] = train(comms[r], budget, stop_at, dir); });
  for (auto& t : threads) t.join();
  for (int r = 1; r < k; ++r)
    if (out[r] != out[0]) std::printf("replica %d differs from replica 0\n", r);
  return out[0];
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "adopt_dilocox_checkpoints";
  if (argc > 2) compressor_name = argv[2];
  try {
    make_compressor(compressor_name);
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "adopt_dilocox: %s\n", e.what());
    return 2;
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/straight");
  std::filesystem::create_directories(dir + "/stopped");
  const Mat straight = run(3, 300, -1, dir + "/straight");
  std::printf("%s: replica 0 put %llu bytes on the wire in 300 steps\n", compressor_name.c_str(),
              static_cast<unsigned long long>(wire_bytes));
  run(3, 300, 170, dir + "/stopped");  // stops at 170: checkpoints at 50 .. 150
  const Mat resumed = run(3, 300, -1, dir + "/stopped");
  const bool same = straight.size() > 0 && straight == resumed;
  std::printf("3 replicas, 300 steps: weights after a stop at step 170 and a resume from step 150 %s the "
              "uninterrupted run's\n", same ? "equal, bit for bit," : "DIFFER from");
  return same ? 0 : 1;
}
