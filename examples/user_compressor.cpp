// user_compressor: a compressor of one's own, plugged into OuterLoop without touching the
// library. SignCompressor sends each tensor as its signs (1 bit each) and one scale (the
// mean magnitude), with error feedback; 3 replicas (threads) pull toward their own
// targets and OuterLoop averages them. Prints the distance to the mean target per round.
// The compressor is registered by name (add_method) and built from its name.
// The compressor (between the markers) is the one docs/API.md shows; a test keeps them equal.
#include <dilocox/dilocox.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace dx = dilocox;

// [user-compressor]
// Signs (1 bit each) and one scale per tensor, with error feedback. Any type with these
// three members is a dilocox::Compressor; save_state/load_state, wire_bytes, state_bytes
// and outer_step are optional.
struct SignCompressor {
  std::vector<std::vector<float>> residual;  // (tensors) what this replica has not sent yet

  void setup(std::span<const dx::TensorSpec> specs) {
    for (const auto& s : specs) residual.emplace_back(s.shape.numel(), 0.0f);
  }
  std::string describe() const { return "signs + mean magnitude, error feedback"; }

  dx::SyncReport sync(dx::AnyCommunicator& comm, const dx::SyncInput& in, dx::TensorSpans x, dx::TensorSpans mean) {
    const int k = comm.size();
    const bool mine = in.contributes[static_cast<std::size_t>(comm.rank())] != 0;
    dx::SyncReport report{.contributors = dx::count_contributors(in.contributes)};
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      auto& e = residual[in.tensors[j]];
      if (!mine) std::fill(e.begin(), e.end(), 0.0f);
      float scale = 0;  // x += e; scale = mean |x|
      for (std::size_t i = 0; i < e.size(); ++i) x[j][i] += e[i], scale += std::fabs(x[j][i]) / e.size();
      std::vector<std::byte> send(4 + (e.size() + 7) / 8), recv(send.size() * k);  // [scale][sign bits]
      std::memcpy(send.data(), &scale, 4);
      for (std::size_t i = 0; i < e.size(); ++i)
        if (x[j][i] < 0) send[4 + i / 8] |= std::byte{static_cast<unsigned char>(1u << (i % 8))};
      comm.allgather(send, recv);
      std::fill(mean[j].begin(), mean[j].end(), 0.0f);
      for (int r = 0; r < k; ++r) {  // rank order: the same sum on every rank
        if (!in.contributes[static_cast<std::size_t>(r)]) continue;
        const std::byte* p = recv.data() + r * send.size();
        float s;
        std::memcpy(&s, p, 4);
        for (std::size_t i = 0; i < e.size(); ++i) {
          const float v = std::to_integer<int>(p[4 + i / 8] >> (i % 8)) & 1 ? -s : s;
          mean[j][i] += v / report.contributors;
          if (r == comm.rank()) e[i] = x[j][i] - v, x[j][i] = e[i];  // residual; x: what is owed
        }
      }
      report.cost += dx::ring_allgather_cost(send.size(), k);
    }
    return report;
  }
};
// [user-compressor]

int main() {
  // Registered by name, like the library's own methods (compress/registry.hpp), so a
  // program that picks its method from a flag or a config file finds it too.
  dx::add_method({.name = "sign",
                  .help = "1 bit a value and one scale a tensor, error feedback",
                  .defaults = "no knobs",
                  .knobs = {},
                  .make = [](const dx::KnobReader&) { return dx::AnyCompressor(SignCompressor{}); }});
  constexpr int K = 3, n = 64, rounds = 30;
  auto comms = dx::make_thread_communicators(K);
  std::vector<double> distance(rounds);
  std::vector<std::thread> replicas;
  for (int r = 0; r < K; ++r)
    replicas.emplace_back([&, r] {
      std::vector<float> w(n, 0.0f), target(n);  // every replica starts from the same w
      for (int i = 0; i < n; ++i) target[i] = std::sin(0.1f * i) + 0.5f * static_cast<float>(r - 1);
      dx::OuterLoop loop(comms[r], {{"w", {n}, w}}, dx::make_compressor("sign"), {.local_steps = 5});
      for (int t = 0; t < rounds; ++t) {
        for (int h = 0; h < loop.local_steps(); ++h)  // SGD on ||w - target||^2 / 2
          for (int i = 0; i < n; ++i) w[i] -= 0.2f * (w[i] - target[i]);
        loop.end_round();
        if (r == 0) {
          double d = 0;  // the mean target is sin(0.1 i)
          for (int i = 0; i < n; ++i) d += std::pow(loop.global(0)[i] - std::sin(0.1 * i), 2);
          distance[t] = std::sqrt(d / n);
        }
      }
      loop.finish();
    });
  for (auto& t : replicas) t.join();
  for (int t = 0; t < rounds; t += 5) std::printf("round %2d: rms distance to the mean target %.4f\n", t, distance[t]);
  std::printf("round %2d: rms distance to the mean target %.4f\n", rounds - 1, distance[rounds - 1]);
  return distance[rounds - 1] < 0.1 * distance[0] ? 0 : 1;  // it converged
}
