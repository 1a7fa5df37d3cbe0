// GlooCommunicator between processes on loopback: each test forks its ranks, which meet
// through a file store in a fresh directory, run a scenario and exit 0 (passed), 1
// (failed, message on stderr) or 2 (the Error the scenario expects, checked by the
// parent). The parent kills any rank still running after its deadline: a hang fails.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dilocox/comm/elastic.hpp"
#include "dilocox/comm/gloo.hpp"
#include "dilocox/comm/throttled.hpp"

namespace {

namespace dx = dilocox;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Exit {
  int code = -1;        // exit status, or -1 when killed at the deadline
  double seconds = 0;   // from fork to exit
};

// A scenario run by one rank; it exits the process with its code.
using Scenario = std::function<int(int rank, int size, dx::GlooOptions)>;

class GlooRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dilocox_gloo_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  dx::GlooOptions options(milliseconds timeout = milliseconds(20'000)) const {
    return {.store = "file://" + dir_, .prefix = "test", .hostname = "127.0.0.1", .timeout = timeout};
  }

  // Forks `size` ranks running f; waits for all, killing those still running after `deadline`.
  std::vector<Exit> run(int size, const Scenario& f, milliseconds timeout = milliseconds(20'000),
                        milliseconds deadline = milliseconds(60'000)) {
    const auto start = Clock::now();
    std::vector<pid_t> pids;
    for (int r = 0; r < size; ++r) {
      const pid_t pid = fork();
      if (pid == 0) {
        int code = 1;
        try {
          code = f(r, size, options(timeout));
        } catch (const dx::Error& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          code = 2;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "rank %d: not a dilocox::Error: %s\n", r, e.what());
        }
        std::fflush(stderr);
        _exit(code);
      }
      pids.push_back(pid);
    }
    std::vector<Exit> out(size);
    int left = size;
    while (left > 0) {
      for (int r = 0; r < size; ++r) {
        if (pids[r] == 0) continue;
        int status = 0;
        if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
          out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          out[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
          pids[r] = 0;
          --left;
        }
      }
      if (left > 0 && Clock::now() - start > deadline) {
        for (int r = 0; r < size; ++r)
          if (pids[r] != 0) kill(pids[r], SIGKILL), waitpid(pids[r], nullptr, 0), pids[r] = 0, out[r].code = -1, --left;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return out;
  }

  std::string dir_;
};

#define CHECK_OR_FAIL(cond)                                                     \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

TEST_F(GlooRanks, AllreduceSumsOverRanks) {
  const auto exits = run(3, [](int rank, int size, const dx::GlooOptions& o) {
    dx::GlooCommunicator c(rank, size, o);
    CHECK_OR_FAIL(c.rank() == rank && c.size() == size);
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 97);
      c.allreduce_sum(x);
      for (std::size_t i = 0; i < n; ++i) CHECK_OR_FAIL(x[i] == 6.0f * static_cast<float>(i % 97));
    }
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

// Sums of fractions, whose bits depend on the order of additions: every rank must end
// with the same bits (the outer loop relies on it), at sizes that do not divide evenly.
TEST_F(GlooRanks, AllreduceGivesTheSameBitsOnEveryRank) {
  const auto exits = run(4, [](int rank, int size, const dx::GlooOptions& o) {
    dx::GlooCommunicator c(rank, size, o);
    for (std::size_t n : {std::size_t{3}, std::size_t{1001}, std::size_t{65537}}) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = 1.0f / static_cast<float>(3 + i + 7 * static_cast<std::size_t>(rank));
      c.allreduce_sum(x);
      std::vector<float> all(n * static_cast<std::size_t>(size));
      c.allgather(std::as_bytes(std::span(x)), std::as_writable_bytes(std::span(all)));
      for (int r = 0; r < size; ++r)
        CHECK_OR_FAIL(std::memcmp(all.data() + r * n, x.data(), n * sizeof(float)) == 0);
      for (std::size_t i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += 1.0 / static_cast<double>(3 + i + 7 * static_cast<std::size_t>(r));
        CHECK_OR_FAIL(std::abs(x[i] - want) <= 1e-6 * want);
      }
    }
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

TEST_F(GlooRanks, AllgatherSendrecvBarrierAndAsyncKeepProgramOrder) {
  const auto exits = run(3, [](int rank, int size, const dx::GlooOptions& o) {
    dx::GlooCommunicator c(rank, size, o);
    std::vector<std::byte> send(5, std::byte(rank + 10)), recv(5 * size);
    c.allgather(send, recv);
    for (int r = 0; r < size; ++r)
      for (int i = 0; i < 5; ++i) CHECK_OR_FAIL(recv[r * 5 + i] == std::byte(r + 10));
    std::vector<std::byte> out(7, std::byte(rank)), in(7);
    c.sendrecv(out, (rank + 1) % size, in, (rank + size - 1) % size);
    for (auto b : in) CHECK_OR_FAIL(b == std::byte((rank + size - 1) % size));
    std::vector<float> a(100, 1.0f), b(50, 2.0f);
    auto ra = c.iallreduce_sum(a);
    c.barrier();  // queued behind the async allreduce on every rank
    auto rb = c.iallgather(std::as_bytes(std::span(b).first(1)), std::as_writable_bytes(std::span(b).subspan(1, size)));
    ra.wait();
    rb.wait();
    for (float v : a) CHECK_OR_FAIL(v == 3.0f);
    for (int r = 0; r < size; ++r) CHECK_OR_FAIL(b[1 + r] == 2.0f);
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

TEST_F(GlooRanks, DifferentSizesAreAnErrorOnEveryRankThatLeavesItUsable) {
  const auto exits = run(2, [](int rank, int size, const dx::GlooOptions& o) {
    dx::GlooCommunicator c(rank, size, o);
    std::vector<float> x(10 + rank, 1.0f);
    try {
      c.allreduce_sum(x);
      return 1;
    } catch (const dx::Error& e) {
      CHECK_OR_FAIL(std::string(e.what()).find("disagree on the message size (10 to 11)") != std::string::npos);
    }
    std::vector<float> y(4, 1.0f);  // nothing was sent: the next collective works
    c.allreduce_sum(y);
    for (float v : y) CHECK_OR_FAIL(v == 2.0f);
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

TEST_F(GlooRanks, AStalledPeerIsAnErrorAfterTheTimeout) {
  const auto exits = run(
      2,
      [](int rank, int size, const dx::GlooOptions& o) {
        dx::GlooCommunicator c(rank, size, o);
        if (rank == 1) {
          std::this_thread::sleep_for(milliseconds(4000));  // never calls
          return 0;
        }
        std::vector<float> x(1000, 1.0f);
        c.allreduce_sum(x);
        return 0;
      },
      milliseconds(1500));
  EXPECT_EQ(exits[0].code, 2);
  EXPECT_LT(exits[0].seconds, 3.9) << "rank 0 waited for its peer instead of its timeout";
  EXPECT_EQ(exits[1].code, 0);
}

TEST_F(GlooRanks, ADeadPeerIsAnErrorWellBeforeTheTimeout) {
  const auto exits = run(
      3,
      [](int rank, int size, const dx::GlooOptions& o) {
        dx::GlooCommunicator c(rank, size, o);
        c.barrier();
        if (rank == 2) _exit(0);  // dies without a word
        std::vector<float> x(1 << 16, 1.0f);
        c.allreduce_sum(x);
        return 0;
      },
      milliseconds(30'000));
  EXPECT_EQ(exits[0].code, 2);
  EXPECT_EQ(exits[1].code, 2);
  EXPECT_LT(std::max(exits[0].seconds, exits[1].seconds), 15.0) << "the survivors waited out the timeout";
}

// A peer that dies while this rank's bytes to it are still queued: Gloo fails the
// receives posted on a broken connection but not a queued send, and a wait on that send
// alone used to last the whole timeout. Rank 1 sends its byte and stops (SIGSTOP) while
// rank 0's 256 MB are on their way; rank 0 kills it and must fail at once, not at 20 s.
TEST_F(GlooRanks, APeerThatDiesWhileBytesToItAreQueuedIsAnErrorAtOnce) {
  const std::string pid_file = dir_ + "/victim.pid";
  const auto exits = run(2, [&](int rank, int size, const dx::GlooOptions& o) -> int {
    dx::GlooCommunicator c(rank, size, o);
    c.barrier();
    std::vector<std::byte> big(std::size_t{256} << 20, std::byte{1}), one(1, std::byte{2});
    if (rank == 1) {
      std::FILE* f = std::fopen(pid_file.c_str(), "w");
      CHECK_OR_FAIL(f != nullptr);
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
      c.sendrecv(one, 0, big, 0);  // once whole (the workspace grows to its size)
      std::thread([] {
        std::this_thread::sleep_for(milliseconds(30));
        kill(getpid(), SIGSTOP);
      }).detach();
      c.sendrecv(one, 0, big, 0);  // stopped in the middle of it, then killed
      return 1;
    }
    std::thread([&] {
      std::this_thread::sleep_for(milliseconds(1500));
      int victim = 0;
      if (std::FILE* f = std::fopen(pid_file.c_str(), "r")) {
        if (std::fscanf(f, "%d", &victim) != 1) victim = 0;
        std::fclose(f);
      }
      if (victim > 0) kill(victim, SIGKILL);
    }).detach();
    c.sendrecv(big, 1, one, 1);
    c.sendrecv(big, 1, one, 1);
    return 1;
  });
  EXPECT_EQ(exits[0].code, 2);
  EXPECT_LT(exits[0].seconds, 8.0) << "rank 0 waited for its 20 s timeout";
  EXPECT_EQ(exits[1].code, 128 + SIGKILL);
}

TEST_F(GlooRanks, AfterATimeoutEveryOperationFailsAtOnce) {
  const auto exits = run(
      2,
      [](int rank, int size, const dx::GlooOptions& o) {
        dx::GlooCommunicator c(rank, size, o);
        if (rank == 1) {
          std::this_thread::sleep_for(milliseconds(2500));
          return 0;
        }
        std::vector<float> x(8, 1.0f);
        try {
          c.allreduce_sum(x);
          return 1;
        } catch (const dx::Error&) {
        }
        const auto t0 = Clock::now();
        try {
          c.barrier();
          return 1;
        } catch (const dx::Error& e) {
          CHECK_OR_FAIL(std::string(e.what()).find("unusable after an earlier failure") != std::string::npos);
        }
        CHECK_OR_FAIL(Clock::now() - t0 < milliseconds(200));
        return 0;
      },
      milliseconds(1000));
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

TEST_F(GlooRanks, AThrottledLinkWrapsGloo) {
  const auto exits = run(2, [](int rank, int size, const dx::GlooOptions& o) {
    dx::GlooCommunicator c(rank, size, o);
    dx::ThrottledLink<dx::GlooCommunicator> wan(c, {.bits_per_second = 80e6, .latency_seconds = 0.0});
    std::vector<float> x(250'000, 1.0f);  // 1 MB: a ring allreduce puts 1 MB on the wire at K = 2
    const auto t0 = Clock::now();
    wan.allreduce_sum(x);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    for (float v : x) CHECK_OR_FAIL(v == 2.0f);
    CHECK_OR_FAIL(wan.stats().wire_bytes == 1'000'000);
    CHECK_OR_FAIL(seconds >= 0.1);  // 8e6 bits at 80 Mbit/s
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

// A redis-server of its own on a free port (it picks none: the test tries a few).
class RedisServer {
 public:
  RedisServer() {
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = 20000 + static_cast<int>(getpid() % 20000) + attempt * 7;
      const pid_t pid = fork();
      if (pid == 0) {
        const std::string port = std::to_string(port_);
        execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
        _exit(127);
      }
      for (int i = 0; i < 100; ++i) {  // until it accepts or exits
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        if (accepts()) {
          pid_ = pid;
          break;
        }
        std::this_thread::sleep_for(milliseconds(20));
      }
      if (pid_ <= 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    }
  }
  ~RedisServer() {
    if (pid_ > 0) kill(pid_, SIGTERM), waitpid(pid_, nullptr, 0);
  }
  bool running() const { return pid_ > 0; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  bool accepts() const {
    const std::string cmd = "exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(port_) + " 2>/dev/null";
    return std::system(("bash -c '" + cmd + "'").c_str()) == 0;
  }
  pid_t pid_ = -1;
  int port_ = 0;
};

TEST_F(GlooRanks, RanksMeetThroughRedis) {
  if (std::system("command -v redis-server >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "redis-server not installed (scripts/install_deps.sh --sites)";
  RedisServer redis;
  ASSERT_TRUE(redis.running()) << "redis-server did not start";
  const std::string url = redis.url();
  const auto exits = run(3, [&url](int rank, int size, dx::GlooOptions o) {
    o.store = url;
    dx::GlooCommunicator c(rank, size, o);
    std::vector<float> x(1000, static_cast<float>(rank));
    c.allreduce_sum(x);
    for (float v : x) CHECK_OR_FAIL(v == 3.0f);
    return 0;
  });
  for (const auto& e : exits) EXPECT_EQ(e.code, 0);
}

TEST(GlooOptionsCheck, BadArgumentsAreErrors) {
  EXPECT_THROW(dx::GlooCommunicator(0, 1, {.store = "tcp://nowhere"}), dx::Error);
  EXPECT_THROW(dx::GlooCommunicator(0, 1, {.store = "file://"}), dx::Error);
  EXPECT_THROW(dx::GlooCommunicator(0, 1, {.store = "redis://host:99999"}), dx::Error);
  EXPECT_THROW(dx::GlooCommunicator(2, 2, {.store = "file:///tmp"}), dx::Error);
  EXPECT_THROW(dx::GlooCommunicator(0, 1, {.store = "file:///tmp", .timeout = milliseconds(0)}), dx::Error);
}

TEST_F(GlooRanks, ARankThatNeverArrivesFailsTheRendezvous) {
  const auto exits = run(
      1, [](int rank, int, const dx::GlooOptions& o) { dx::GlooCommunicator c(rank, 2, o); return 0; },
      milliseconds(1500));
  EXPECT_EQ(exits[0].code, 2);
  EXPECT_LT(exits[0].seconds, 20.0);
}

}  // namespace

// The elastic membership's decisions (dilocox/comm/elastic.hpp) are store keys written
// once: of ranks racing to write one key, exactly one wins and all read its value.
TEST_F(GlooRanks, MembershipKeysAreWrittenOnceTheFirstWriterWins) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string key = "race" + std::to_string(attempt);
    const auto exits = run(4, [&](int rank, int, const dx::GlooOptions& o) {
      dx::detail::MembershipStore store(o.store, o.prefix);
      const bool won = store.add(key, std::to_string(rank));
      CHECK_OR_FAIL(store.find(key).has_value());
      return won ? 10 : 11;
    });
    int winners = 0;
    for (const auto& e : exits) {
      EXPECT_TRUE(e.code == 10 || e.code == 11) << e.code;
      winners += e.code == 10;
    }
    EXPECT_EQ(winners, 1);
    dx::detail::MembershipStore store(options().store, options().prefix);
    const auto value = store.find(key);
    ASSERT_TRUE(value.has_value());
    EXPECT_EQ(exits[static_cast<std::size_t>(std::stoi(*value))].code, 10) << "the value read is the winner's";
    EXPECT_FALSE(store.find("never-written").has_value());
  }
}

TEST(ElasticGroup, ARefusalNamesEachDifferingKeyWithBothValues) {
  EXPECT_EQ(dx::detail::fingerprint_difference("model=tiny;H=50", "model=tiny;H=20;extra=1"),
            "H '20' (the run's: '50'), extra '1' (the run's: '(none)')");
  EXPECT_EQ(dx::detail::fingerprint_difference("a=1", "a=1"), "");
  const auto r = dx::detail::EpochRecord::parse(dx::detail::EpochRecord{7, {0, 2, 5}, {5}}.text());
  EXPECT_EQ(r.admitted, 7u);
  EXPECT_EQ(r.sites, (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(r.joined, (std::vector<int>{5}));
}
