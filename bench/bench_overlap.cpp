// bench_overlap (run under mpiexec): how much of each DiLoCoX reduction the one-step-
// delay overlap hides behind a round's compute. Each round "computes" for a set time
// (sleeping, as a host thread does while its GPU computes), at least as long as one
// reduction on the emulated link; OuterLoop reduces in the background. Reports the
// reduction time, the time the trainer waited, and the hidden fraction (goal >= 95%).
//   mpiexec -n 2 bench_overlap [--params 2e7] [--gbps 1] [--latency-ms 20] [--rounds 8] [--compute-ms 0 (auto)]
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/throttled.hpp>
#include <dilocox/diloco.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gpt_shapes.hpp"

namespace dx = dilocox;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  double params = 2e7, gbps = 1, latency_ms = 20, compute_ms = 0;
  int rounds = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const double v = std::atof(argv[i + 1]);
    if (a == "--params") params = v;
    else if (a == "--gbps") gbps = v;
    else if (a == "--latency-ms") latency_ms = v;
    else if (a == "--rounds") rounds = static_cast<int>(v);
    else if (a == "--compute-ms") compute_ms = v;
    else {
      std::fprintf(stderr, "bench_overlap: unknown argument %s\n", a.c_str());
      MPI_Finalize();
      return 2;
    }
  }
  int code = 0;
  try {
    dx::MpiCommunicator world(MPI_COMM_WORLD);
    dx::ThrottledLink link(world, {.bits_per_second = gbps * 1e9, .latency_seconds = latency_ms * 1e-3});
    GptTensors g(768, static_cast<std::size_t>(params), 5 + static_cast<std::uint64_t>(world.rank()));
    std::vector<dx::NamedTensor> named;
    for (std::size_t i = 0; i < g.specs.size(); ++i) named.push_back({g.specs[i].name, g.specs[i].shape, g.data[i]});
    dx::OuterLoopConfig cfg;  // DiLoCoX defaults: overlap, low rank, int4, adaptive
    cfg.local_steps = 1;      // one "step" per round: the compute below is the round's compute
    cfg.lowrank.adaptive_config.h_min = 1;
    cfg.lowrank.adaptive_config.h_max = 1;
    dx::OuterLoop loop(link, named, cfg);
    double comm = 0, waited = 0, hidden = 0;
    if (world.rank() == 0)
      std::printf("# bench_overlap: %d ranks, %.1fM parameters, link %.2f Gbit/s + %.0f ms per hop\n"
                  "| round | compute s | reduction s | waited s | hidden |\n|---:|---:|---:|---:|---:|\n",
                  world.size(), g.numel / 1e6, gbps, latency_ms);
    double measured = 0;  // the first reduction's duration sets the compute time when not given
    for (int t = 0; t < rounds; ++t) {
      loop.begin_round();
      for (auto& d : g.data) d[t % d.size()] += 1e-4f;  // the "training step": a small change
      const double c = compute_ms > 0 ? compute_ms * 1e-3 : std::max(0.05, 1.2 * measured);
      std::this_thread::sleep_for(std::chrono::duration<double>(c));
      const auto s = loop.end_round();
      if (!s.applied) continue;
      measured = std::max(measured, s.comm_seconds);
      if (t >= 2) comm += s.comm_seconds, waited += s.wait_seconds, hidden += s.hidden_seconds;  // steady state
      if (world.rank() == 0)
        std::printf("| %d | %.3f | %.3f | %.4f | %.1f%% |\n", t, c, s.comm_seconds, s.wait_seconds,
                    100 * s.hidden_seconds / s.comm_seconds);
    }
    loop.finish();
    if (world.rank() == 0)
      std::printf("steady state (rounds >= 2): reduction %.3f s, waited %.4f s, hidden %.1f%%\n", comm, waited,
                  100 * hidden / comm);
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
