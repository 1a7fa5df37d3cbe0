// bench_overlap (run under mpiexec): how much of each DiLoCoX reduction the one-step-
// delay overlap hides behind a round's compute, when the compute is sized on its own:
// a fixed number of GEMM FLOPs per round (--compute-gflop), run on the CPU (as a CPU
// trainer does, competing with the background reduction for the core) or replaced by a
// sleep of the same duration measured once (--compute sleep: a host thread waiting for
// its GPU). OuterLoop with the DiLoCoX defaults reduces in the background. Reports, per
// round, the compute time, the reduction time beside its link floor, the time the trainer
// waited and the hidden fraction, as measured: nothing is sized from the reduction.
//   mpiexec -n 2 bench_overlap [--params 2e7] [--gbps 1] [--latency-ms 20] [--rounds 8]
//                              [--compute-gflop 2] [--compute busy|sleep]
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/throttled.hpp>
#include <dilocox/compress/lowrank.hpp>
#include <dilocox/diloco.hpp>

#include <Eigen/Core>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gpt_shapes.hpp"

namespace dx = dilocox;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// `gflop` of single-precision GEMM (256 x 768 by 768 x 768 products): the round's compute.
double busy_compute(double gflop) {
  static Eigen::MatrixXf a = Eigen::MatrixXf::Random(256, 768), b = Eigen::MatrixXf::Random(768, 768), c(256, 768);
  const double per = 2.0 * 256 * 768 * 768 / 1e9;
  const auto n = static_cast<long>(gflop / per + 0.5);
  const double t0 = now();
  for (long i = 0; i < n; ++i) c.noalias() = a * b;
  a(0, 0) += 1e-7f * c(0, 0);  // keep the products alive
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  double params = 2e7, gbps = 1, latency_ms = 20, gflop = 2;
  int rounds = 8;
  std::string compute = "busy";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (a == "--params") params = v;
    else if (a == "--gbps") gbps = v;
    else if (a == "--latency-ms") latency_ms = v;
    else if (a == "--rounds") rounds = static_cast<int>(v);
    else if (a == "--compute-gflop") gflop = v;
    else if (a == "--compute" && (std::string(argv[i + 1]) == "busy" || std::string(argv[i + 1]) == "sleep")) compute = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_overlap: bad argument %s %s\n", a.c_str(), argv[i + 1]);
      MPI_Finalize();
      return 2;
    }
  }
  int code = 0;
  try {
    dx::MpiCommunicator world(MPI_COMM_WORLD);
    dx::ThrottledLink link(world, {.bits_per_second = gbps * 1e9, .latency_seconds = latency_ms * 1e-3});
    GptTensors g(768, static_cast<std::size_t>(params), 5);  // the same start on every replica
    std::vector<dx::NamedTensor> named;
    for (std::size_t i = 0; i < g.specs.size(); ++i) named.push_back({g.specs[i].name, g.specs[i].shape, g.data[i]});
    dx::OuterLoopConfig cfg;  // DiLoCoX defaults (overlap, low rank, int4, adaptive), one step per round:
    cfg.local_steps = 1;      // the compute below is the round's compute
    cfg.max_local_steps = 1;
    dx::OuterLoop loop(link, named, dx::LowRankCompressor{}, cfg);
    const double sleep_s = compute == "sleep" ? busy_compute(gflop) : 0;  // measured once, before any reduction
    if (world.rank() == 0)
      std::printf("# bench_overlap: %d ranks, %.1fM parameters, link %.2f Gbit/s + %.0f ms per hop, compute %.2f GFLOP "
                  "per round (%s)\n"
                  "| round | compute s | reduction s | link floor s | waited s | hidden |\n|---:|---:|---:|---:|---:|---:|\n",
                  world.size(), g.numel / 1e6, gbps, latency_ms, gflop,
                  compute == "busy" ? "GEMMs on this core" : "a sleep of the GEMMs' time: host idle, as with a GPU");
    double comm = 0, waited = 0, hidden = 0;
    for (int t = 0; t < rounds; ++t) {
      for (auto& d : g.data) d[t % d.size()] += 1e-4f * static_cast<float>(world.rank() + 1);  // a replica's step
      const double c = compute == "busy" ? busy_compute(gflop) : (std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s)), sleep_s);
      for (const auto& s : loop.step()) {
        const double floor = dx::link_seconds({s.wire_bytes, 0}, link.link()) + latency_ms * 1e-3 * (world.size() - 1);
        if (t >= 2) comm += s.comm_seconds, waited += s.wait_seconds, hidden += s.hidden_seconds;  // steady state
        if (world.rank() == 0)
          std::printf("| %d | %.3f | %.3f | %.3f | %.4f | %.1f%% |\n", t, c, s.comm_seconds, floor, s.wait_seconds,
                      100 * s.hidden_seconds / s.comm_seconds);
      }
    }
    loop.finish();
    if (world.rank() == 0)
      std::printf("steady state (rounds >= 2): reduction %.3f s, waited %.4f s, hidden %.1f%%\n", comm, waited,
                  comm > 0 ? 100 * hidden / comm : 0.0);
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
