// One site of an elastic run (dilocox/comm/elastic.hpp), for tests/gloo/elastic_test.sh:
// the site trains its share of a least-squares problem (tests/least_squares.hpp; site s
// owns replica s's data) with an OuterLoop over an ElasticGroup, DiLoCoX's compressor,
// no overlap, Nesterov outer step at momentum 0.9. A round is a transaction: its sync, the
// membership decision at its boundary, the state for newcomers and the check that every
// site holds the same global parameters. When any of it fails the survivors recover and
// roll back to the snapshot taken before the last sync every one of them completed; a site
// without that snapshot (it was joining when the failure came) takes a holder's copy.
// SIGTERM: the site leaves at the next round boundary. --exit-at-join: the site dies
// (exit 9) at the first boundary that admits a site, before the state is shared. One JSON
// line per event on stdout.
//   elastic_site --store file:///dir --run NAME --site S --founders K --rounds R
//                [--steps H] [--pace-ms P] [--timeout-ms T] [--settle-ms W] [--dim D] [--exit-at-join 1]
#include "../least_squares.hpp"

#include <dilocox/checksum.hpp>
#include <dilocox/comm/elastic.hpp>
#include <dilocox/compress/registry.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/state.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>

namespace dx = dilocox;

namespace {

constexpr int kMaxSites = 8;
std::atomic<bool> g_leave{false};

struct Flags {
  std::string store, run;
  int site = 0, founders = 1, rounds = 10, steps = 5, pace_ms = 20, timeout_ms = 10'000, settle_ms = 2'000, dim = 24,
      exit_at_join = 0;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--store") f.store = v;
    else if (k == "--run") f.run = v;
    else {
      int* dst = k == "--site" ? &f.site : k == "--founders" ? &f.founders : k == "--rounds" ? &f.rounds
               : k == "--steps" ? &f.steps : k == "--pace-ms" ? &f.pace_ms : k == "--timeout-ms" ? &f.timeout_ms
               : k == "--settle-ms" ? &f.settle_ms : k == "--dim" ? &f.dim
               : k == "--exit-at-join" ? &f.exit_at_join : nullptr;
      if (!dst) throw dx::Error("unknown flag " + k);
      *dst = std::stoi(v);
    }
  }
  if (f.store.empty() || f.run.empty() || f.site < 0 || f.site >= kMaxSites) throw dx::Error("need --store, --run, --site 0..7");
  return f;
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

class Site {
 public:
  Site(const Flags& f, dx::ElasticGroup& group)
      : f_(f), group_(group), problem_(kMaxSites, f.dim, f.dim / 2, 64, 0.2f, 7), replica_(problem_, f.site, 0.01f) {
    if (group_.newcomer()) {
      try {
        receive_state();
      } catch (const dx::Error& e) {
        recover(e.what());
      }
    } else {
      build_loop({});
      check_identical();
    }
  }

  void train() {
    while (progress_ < f_.rounds) {
      if (!replay_) {
        while (!loop_->next_step_syncs()) inner_step(), loop_->step();
        inner_step();
        snapshot();
      }
      replay_ = false;
      try {
        if (transaction()) return;
        ++progress_;
        print_round();
      } catch (const dx::Error& e) {
        recover(e.what());
      }
    }
    std::printf("{\"event\":\"done\",\"site\":%d,\"round\":%lld,\"epoch\":%llu,\"sites\":%s,\"checksum\":\"%016llx\",\"distance\":%.6f}\n",
                f_.site, static_cast<long long>(progress_), static_cast<unsigned long long>(group_.epoch()),
                list(group_.sites()).c_str(), static_cast<unsigned long long>(theta_hash()), distance());
  }

 private:
  struct Snapshot {
    std::vector<std::byte> loop;
    LeastSquaresReplica replica;
  };

  void inner_step() {
    replica_.adam_step();
    std::this_thread::sleep_for(std::chrono::milliseconds(f_.pace_ms));
  }

  std::vector<dx::NamedTensor> tensors() {
    const auto rows = static_cast<std::size_t>(problem_.dout), cols = static_cast<std::size_t>(problem_.din);
    return {{"w", {rows, cols}, {replica_.w.data(), rows * cols}}, {"b", {rows}, {replica_.b.data(), rows}}};
  }
  // A loop over the group's current sites, from `state` (empty: from the start).
  void build_loop(std::span<const std::byte> state) {
    loop_.reset();
    dx::OuterLoopConfig c;
    c.local_steps = c.min_local_steps = c.max_local_steps = f_.steps;
    c.overlap = false;
    c.outer = dx::NesterovConfig{.lr = 0.7f, .momentum = 0.9f};
    c.defer_start_check = !state.empty();
    loop_.emplace(group_, tensors(), dx::make_compressor("dilocox"), c);
    if (!state.empty()) loop_->load_state(state);
  }

  // The round's sync, the boundary's membership decision, the state for newcomers, the
  // check. True: this site left.
  bool transaction() {
    loop_->step();
    const auto change = group_.at_boundary(g_leave.load());
    if (std::count(change.left.begin(), change.left.end(), f_.site) > 0) {
      std::printf("{\"event\":\"left\",\"site\":%d,\"round\":%lld}\n", f_.site, static_cast<long long>(progress_ + 1));
      return true;
    }
    if (f_.exit_at_join && !change.joined.empty()) std::_Exit(9);
    if (change.changed()) {
      std::printf("{\"event\":\"membership\",\"site\":%d,\"round\":%lld,\"epoch\":%llu,\"sites\":%s,\"joined\":%s,\"left\":%s}\n",
                  f_.site, static_cast<long long>(progress_ + 1), static_cast<unsigned long long>(group_.epoch()),
                  list(group_.sites()).c_str(), list(change.joined).c_str(), list(change.left).c_str());
      const auto state = loop_->save_state();
      share(progress_ + 1, state);
      build_loop(state);
    }
    check_identical();
    return false;
  }

  void snapshot() {
    snapshots_.insert_or_assign(progress_, Snapshot{loop_->save_state(), replica_});
    snapshots_.erase(progress_ - 2);
  }

  // After a failed operation: the survivors' membership, and this site back at the latest
  // snapshot every survivor holds (before that round's sync, which train() then replays).
  void recover(const std::string& why) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t held = snapshots_.empty() ? -1 : snapshots_.rbegin()->first;
    const std::int64_t target = group_.recover(held);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto it = snapshots_.find(target);
    const bool have = it != snapshots_.end();
    const auto got = group_.share_state([&] { return encode(target, it->second.loop); }, !have);
    if (have) {
      replica_ = it->second.replica;
      progress_ = target;
      build_loop(it->second.loop);
      snapshots_.erase(std::next(it), snapshots_.end());
    } else {
      snapshots_.clear();
      take(*got);
    }
    replay_ = true;
    std::printf("{\"event\":\"recovered\",\"site\":%d,\"epoch\":%llu,\"sites\":%s,\"rolled_back_to\":%lld,\"from\":\"%s\",\"waited_s\":%.3f,\"why\":\"%s\"}\n",
                f_.site, static_cast<unsigned long long>(group_.epoch()), list(group_.sites()).c_str(),
                static_cast<long long>(target), have ? "snapshot" : "holder", waited, why.substr(0, 120).c_str());
    std::fflush(stdout);
    check_identical();
  }

  // Every member after a change, before its loop is rebuilt (the newcomers build theirs
  // after it): newcomers get the loop's state and the progress.
  void share(std::int64_t progress, std::span<const std::byte> loop_state) {
    group_.share_state([&] { return encode(progress, loop_state); });
  }
  static std::vector<std::byte> encode(std::int64_t progress, std::span<const std::byte> loop_state) {
    dx::StateWriter w;
    w.value(progress);
    w.values(loop_state);
    return w.bytes();
  }
  // The state a member shared: its progress and loop; this replica restarts from theta.
  void take(std::span<const std::byte> state) {
    dx::StateReader r(state);
    progress_ = r.value<std::int64_t>();
    build_loop(r.vector<std::byte>());
    loop_->restart_from_global();  // phi (w, b) <- theta; the donor's debt dropped
  }
  void receive_state() {
    const auto got = group_.share_state([]() -> std::vector<std::byte> { throw dx::Error("a newcomer holds no state"); });
    take(*got);
    std::printf("{\"event\":\"joined\",\"site\":%d,\"round\":%lld,\"epoch\":%llu,\"sites\":%s}\n", f_.site,
                static_cast<long long>(progress_), static_cast<unsigned long long>(group_.epoch()), list(group_.sites()).c_str());
    check_identical();
  }

  std::uint64_t theta_hash() const {
    std::uint64_t h = 0;
    for (std::size_t i = 0; i < loop_->tensor_count(); ++i) h ^= dx::checksum64(std::as_bytes(loop_->global(i))) + i;
    return h;
  }
  void check_identical() {
    const std::uint64_t mine = theta_hash();
    std::vector<std::uint64_t> all(static_cast<std::size_t>(group_.size()));
    group_.allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all)));
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r] != mine)
        throw dx::Error("refused: site " + std::to_string(group_.sites()[r]) + " holds other global parameters");
  }
  double distance() const { return problem_.distance(loop_->global(0).data(), loop_->global(1).data()); }
  void print_round() {
    std::printf("{\"event\":\"round\",\"site\":%d,\"round\":%lld,\"epoch\":%llu,\"sites\":%s,\"distance\":%.6f,\"checksum\":\"%016llx\"}\n",
                f_.site, static_cast<long long>(progress_), static_cast<unsigned long long>(group_.epoch()),
                list(group_.sites()).c_str(), distance(), static_cast<unsigned long long>(theta_hash()));
    std::fflush(stdout);
  }

  Flags f_;
  dx::ElasticGroup& group_;
  LeastSquares problem_;
  LeastSquaresReplica replica_;
  std::optional<dx::OuterLoop<dx::ElasticGroup>> loop_;
  std::map<std::int64_t, Snapshot> snapshots_;
  std::int64_t progress_ = 0;  // rounds completed
  bool replay_ = false;        // recovered: the next round replays its sync from the snapshot
};

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGTERM, [](int) { g_leave = true; });
  int site = -1;
  try {
    const Flags f = parse(argc, argv);
    site = f.site;
    dx::ElasticOptions o;
    o.gloo = {.store = f.store, .prefix = f.run, .hostname = "127.0.0.1", .timeout = std::chrono::milliseconds(f.timeout_ms)};
    o.site = f.site;
    o.founders = f.founders;
    o.fingerprint = "dim=" + std::to_string(f.dim) + ";steps=" + std::to_string(f.steps);
    o.settle = std::chrono::milliseconds(f.settle_ms);
    o.join_timeout = std::chrono::milliseconds(60'000);
    dx::ElasticGroup group(o);
    Site s(f, group);
    s.train();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_site: site %d: %s\n", site, e.what());
    return 1;
  }
}
