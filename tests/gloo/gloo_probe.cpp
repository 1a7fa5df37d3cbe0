// gloo_probe: one rank of a GlooCommunicator group timing allreduces of a given size, for
// the WAN testbed (scripts/wan_testbed.sh): run once per site namespace. Prints one line
//   rank=I size=K bytes=N repeats=R median_s=T wire_bytes=W model_s=M
// where W is what this rank puts on the wire per allreduce (ring, as ThrottledLink counts
// it) and M = W x 8 / --rate-bps, the link model's time. Defaults come from the
// testbed's environment (DILOCOX_SITE, DILOCOX_SITES, DILOCOX_RENDEZVOUS,
// DILOCOX_SITE_ADDR). An error is one line on stderr and exit 1.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dilocox/comm/cost.hpp"
#include "dilocox/comm/gloo.hpp"

namespace {

struct Args {
  int rank = -1, size = -1, repeats = 3;
  long long bytes = 4'000'000;
  double rate_bps = 0;
  long long timeout_ms = 30'000;
  std::string store, prefix = "gloo_probe", hostname;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int to_int(const std::string& s, const char* what) {
  try {
    std::size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used == s.size()) return static_cast<int>(v);
  } catch (const std::exception&) {
  }
  throw dilocox::Error(std::string("gloo_probe: ") + what + " must be an integer, got '" + s + "'");
}

Args parse(int argc, char** argv) {
  Args a;
  if (!env("DILOCOX_SITE").empty()) a.rank = to_int(env("DILOCOX_SITE"), "DILOCOX_SITE");
  if (!env("DILOCOX_SITES").empty()) a.size = to_int(env("DILOCOX_SITES"), "DILOCOX_SITES");
  a.store = env("DILOCOX_RENDEZVOUS");
  a.hostname = env("DILOCOX_SITE_ADDR");
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw dilocox::Error("gloo_probe: " + flag + " needs a value");
    const std::string v = argv[++i];
    if (flag == "--rank") a.rank = to_int(v, "--rank");
    else if (flag == "--size") a.size = to_int(v, "--size");
    else if (flag == "--bytes") a.bytes = to_int(v, "--bytes");
    else if (flag == "--repeats") a.repeats = to_int(v, "--repeats");
    else if (flag == "--timeout-ms") a.timeout_ms = to_int(v, "--timeout-ms");
    else if (flag == "--rate-bps") a.rate_bps = std::atof(v.c_str());
    else if (flag == "--store") a.store = v;
    else if (flag == "--prefix") a.prefix = v;
    else if (flag == "--hostname") a.hostname = v;
    else throw dilocox::Error("gloo_probe: unknown flag " + flag);
  }
  if (a.bytes < 4 || a.bytes % 4 != 0) throw dilocox::Error("gloo_probe: --bytes must be a positive multiple of 4");
  if (a.repeats < 1) throw dilocox::Error("gloo_probe: --repeats must be >= 1");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
  dilocox::GlooCommunicator c(a.rank, a.size, {.store = a.store, .prefix = a.prefix, .hostname = a.hostname,
                                               .timeout = std::chrono::milliseconds(a.timeout_ms)});
  std::vector<float> x(static_cast<std::size_t>(a.bytes / 4), 1.0f);
  c.barrier();
  std::vector<double> seconds;
  for (int i = 0; i < a.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c.allreduce_sum(x);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const auto wire = dilocox::ring_allreduce_cost(static_cast<std::size_t>(a.bytes), a.size).bytes;
  const double model = a.rate_bps > 0 ? static_cast<double>(wire) * 8.0 / a.rate_bps : 0.0;
  std::printf("rank=%d size=%d bytes=%lld repeats=%d median_s=%.4f wire_bytes=%llu model_s=%.4f\n", a.rank, a.size,
              a.bytes, a.repeats, seconds[seconds.size() / 2], static_cast<unsigned long long>(wire), model);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
