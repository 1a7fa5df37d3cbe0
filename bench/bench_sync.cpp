// bench_sync (run under mpiexec, one rank per replica): one DiLoCoX sync (low rank +
// int4 factors + error feedback) against one fp32 allreduce of the same GPT-layer-shaped
// tensors (~100M parameters by default), plain and through ThrottledLink. Reported like
// nccl-tests: time, bytes each rank put on the wire, algbw = dense fp32 bytes / time,
// compression ratio, and the floor: the link's time for those bytes.
//   mpiexec -n 2 bench_sync [--params 1e8] [--width 1024] [--rank 16] [--gbps 1] [--latency-ms 0] [--repeats 3]
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/throttled.hpp>
#include <dilocox/compress/lowrank.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpt_shapes.hpp"

namespace dx = dilocox;

namespace {

struct Options {
  double params = 1e8;
  std::size_t width = 1024;
  int rank = 16, repeats = 3;
  double gbps = 1.0, latency_ms = 0.0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    auto need = [&] {
      if (!v) {
        std::fprintf(stderr, "bench_sync: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      ++i;
      return v;
    };
    if (a == "--params") o.params = std::atof(need());
    else if (a == "--width") o.width = std::strtoul(need(), nullptr, 10);
    else if (a == "--rank") o.rank = std::atoi(need());
    else if (a == "--repeats") o.repeats = std::atoi(need());
    else if (a == "--gbps") o.gbps = std::atof(need());
    else if (a == "--latency-ms") o.latency_ms = std::atof(need());
    else {
      std::fprintf(stderr, "bench_sync: unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.params <= 0 || o.width == 0 || o.rank <= 0 || o.repeats <= 0 || o.gbps <= 0 || o.latency_ms < 0) {
    std::fprintf(stderr, "bench_sync: every option must be positive\n");
    std::exit(2);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  double seconds;
  std::uint64_t wire;
};

template <dx::Communicator C, class F>
Row timed(C& comm, dx::MpiCommunicator& world, int repeats, F&& once) {
  std::vector<double> t;
  std::uint64_t wire = 0;
  for (int r = 0; r < repeats; ++r) {
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    wire = once(comm);
    world.barrier();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return {median(t), wire};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 0;
  try {
    const Options o = parse(argc, argv);
    dx::MpiCommunicator world(MPI_COMM_WORLD);
    const int k = world.size(), me = world.rank();
    GptTensors g(o.width, static_cast<std::size_t>(o.params), 11 + static_cast<std::uint64_t>(me));
    const double dense = static_cast<double>(g.numel) * 4;
    if (me == 0)
      std::printf("# bench_sync: %d ranks, %zu tensors, %.1fM parameters (%.0f MB fp32), rank %d, repeats %d (median)\n",
                  k, g.specs.size(), g.numel / 1e6, dense / 1e6, o.rank, o.repeats);

    std::vector<float> flat(g.numel);
    auto allreduce = [&](auto& comm) -> std::uint64_t {
      std::size_t off = 0;
      for (const auto& t : g.data) std::copy(t.begin(), t.end(), flat.begin() + static_cast<std::ptrdiff_t>(off)), off += t.size();
      comm.allreduce_sum(flat);
      return dx::ring_allreduce_cost(g.numel * 4, k).bytes;
    };
    std::vector<std::vector<float>> x = g.data, delta = g.data;
    auto spans = [](std::vector<std::vector<float>>& v) {
      std::vector<std::span<float>> s;
      for (auto& t : v) s.emplace_back(t);
      return s;
    };
    const std::vector<std::uint8_t> all(static_cast<std::size_t>(k), 1);
    std::vector<std::size_t> every(g.specs.size());
    for (std::size_t i = 0; i < every.size(); ++i) every[i] = i;
    auto run_dilocox = [&](auto& comm) {
      dx::LowRankCompressorConfig cfg;
      cfg.rank = o.rank;
      cfg.adaptive = false;
      auto comp = std::make_shared<dx::LowRankCompressor>(cfg);
      comp->setup(g.specs);
      auto any = std::make_shared<dx::AnyCommunicator>(comm);
      return [&, comp, any, sync = std::uint64_t{0}](auto&) mutable -> std::uint64_t {
        for (std::size_t i = 0; i < x.size(); ++i) std::copy(g.data[i].begin(), g.data[i].end(), x[i].begin());
        const auto xs = spans(x), ds = spans(delta);
        return comp->sync(*any, {every, all, sync++}, xs, ds).cost.bytes;
      };
    };

    dx::ThrottledLink link(world, {.bits_per_second = o.gbps * 1e9, .latency_seconds = o.latency_ms * 1e-3});
    if (me == 0) {
      std::printf("| sync | link | time s | wire MB/rank | algbw GB/s | compression | link floor s |\n");
      std::printf("|---|---|---:|---:|---:|---:|---:|\n");
    }
    auto report = [&](const char* what, const std::string& where, Row r, bool throttled) {
      if (me != 0) return;
      const double ratio = dx::ring_allreduce_cost(g.numel * 4, k).bytes / static_cast<double>(r.wire);
      std::printf("| %s | %s | %.3f | %.2f | %.3f | %.1fx | ", what, where.c_str(), r.seconds, r.wire / 1e6,
                  dense / r.seconds / 1e9, ratio);
      if (throttled) std::printf("%.3f |\n", dx::link_seconds({r.wire, 0}, link.link()));
      else std::printf("- |\n");
      std::fflush(stdout);
    };
    const std::string link_name = std::to_string(o.gbps).substr(0, 4) + " Gbit/s";
    report("fp32 allreduce", "plain", timed(world, world, o.repeats, allreduce), false);
    {
      auto once = run_dilocox(world);
      once(world);  // warm start the projectors, as in steady state
      report("dilocox", "plain", timed(world, world, o.repeats, once), false);
    }
    report("fp32 allreduce", link_name, timed(link, world, o.repeats, allreduce), true);
    {
      auto once = run_dilocox(link);
      once(link);
      report("dilocox", link_name, timed(link, world, o.repeats, once), true);
    }
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "bench_sync: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
