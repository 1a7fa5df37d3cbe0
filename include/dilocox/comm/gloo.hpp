// dilocox/comm/gloo.hpp: GlooCommunicator, the Communicator concept over Gloo's TCP
// transport, for links between jobs that share no MPI world (sites). The ranks meet
// through a store: a file store (a directory every rank sees: one machine, or a shared
// file system) or Redis (Gloo's RedisStore), then connect a full mesh of TCP pairs.
// Every operation waits at most `timeout`, so a stalled or dead peer is a
// dilocox::Error naming the operation and Gloo's reason (with the peer's address),
// never a hang; the communicator is unusable after one, and closes its connections so
// that its peers fail at once too. The collectives are rings of our own over one Gloo
// buffer, and a thread per peer watches its connection (watch_peers()): a peer that dies
// is an Error within moments, whatever the operation was waiting for. Constructing one
// ignores SIGPIPE where it has its default action (a dead peer's socket must be an
// Error, not an exit). All operations, blocking and async, run in program order on one
// progress thread, so that every rank issues them to Gloo in the same order. Link
// against Gloo (CMake target `gloo`).
// Not here: MPI (comm/mpi.hpp), modelled links (comm/throttled.hpp).
#pragma once

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#if GLOO_USE_REDIS
#ifndef HIREDIS_NESTED_INCLUDE
#define HIREDIS_NESTED_INCLUDE 1  // Debian installs hiredis.h under hiredis/
#endif
#include <gloo/rendezvous/redis_store.h>
#endif

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/config.hpp"

namespace dilocox {

struct GlooOptions {
  // Where the ranks meet: "file:///a/directory" or "redis://host:port".
  std::string store{};
  // The group's namespace in the store: groups sharing a store need different prefixes,
  // and a group that meets again (a restart) needs a new one.
  std::string prefix = "dilocox";
  // The address this rank listens on: a network interface ("eth0"), else a host name or
  // address; both empty: the address of this machine's host name.
  std::string interface{}, hostname{};
  std::chrono::milliseconds timeout{60'000};  // rendezvous and every operation
};

namespace detail {
// A write to a peer that died raises SIGPIPE, whose default action ends the process before
// Gloo can report the broken pair. Where SIGPIPE still has its default action, it is
// ignored (the write then fails with EPIPE, an Error here); a handler of the program's own
// is left as it is.
inline void ignore_default_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO))
    std::signal(SIGPIPE, SIG_IGN);
}

inline std::unique_ptr<gloo::rendezvous::Store> open_gloo_store(const std::string& url) {
  constexpr std::string_view file = "file://", redis = "redis://";
  if (url.starts_with(file) && url.size() > file.size())
    return std::make_unique<gloo::rendezvous::FileStore>(url.substr(file.size()));
  if (url.starts_with(redis)) {
#if GLOO_USE_REDIS
    const std::string rest = url.substr(redis.size());
    const auto colon = rest.rfind(':');
    int port = 6379;
    if (colon != std::string::npos) {
      const std::string p = rest.substr(colon + 1);
      detail::require(!p.empty() && p.find_first_not_of("0123456789") == std::string::npos && p.size() <= 5,
              "GlooCommunicator", "bad port in store '" + url + "'");
      port = std::stoi(p);
    }
    const std::string host = rest.substr(0, colon);
    detail::require(!host.empty() && port > 0 && port < 65536, "GlooCommunicator", "bad store '" + url + "'");
    return std::make_unique<gloo::rendezvous::RedisStore>(host, port);
#else
    throw Error("GlooCommunicator: this Gloo was built without Redis; store '" + url + "'");
#endif
  }
  throw Error("GlooCommunicator: store must be file:///directory or redis://host:port, got '" + url + "'");
}
}  // namespace detail

class GlooCommunicator {
 public:
  GlooCommunicator(int rank, int size, const GlooOptions& o) : rank_(rank), size_(size), timeout_(o.timeout) {
    detail::require(size >= 1 && rank >= 0 && rank < size, "GlooCommunicator",
            "rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
    detail::require(timeout_.count() > 0, "GlooCommunicator", "the timeout must be positive");
    detail::ignore_default_sigpipe();
    store_ = detail::open_gloo_store(o.store);
    prefixed_ = std::make_unique<gloo::rendezvous::PrefixStore>(o.prefix, *store_);
    gloo::transport::tcp::attr attr;
    attr.iface = o.interface;
    attr.hostname = o.hostname;
    guarded("rendezvous", [&] {
      device_ = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout_);
      context->connectFullMesh(*prefixed_, device_);
      context_ = std::move(context);
      watch_peers();
    });
  }
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  void allreduce_sum(std::span<float> x) { run([this, x] { do_allreduce(x); }); }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    detail::require(recv.size() == send.size() * static_cast<std::size_t>(size_), "GlooCommunicator::allgather",
            "recv must hold size() blocks of send");
    run([this, send, recv] { do_allgather(send, recv); });
  }
  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    detail::require(dest >= 0 && dest < size_ && src >= 0 && src < size_, "GlooCommunicator::sendrecv", "peer out of range");
    run([=, this] { do_sendrecv(send, dest, recv, src); });
  }
  void barrier() {
    run([this] {
      if (size_ == 1) return;
      const std::byte mine{};
      std::byte all[1];
      guarded("barrier", [&] { ring_allgather(std::span(&mine, 1), std::span(all, 0)); });
    });
  }
  Request iallreduce_sum(std::span<float> x) {
    return executor_.submit([this, x] { do_allreduce(x); });
  }
  Request iallgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    detail::require(recv.size() == send.size() * static_cast<std::size_t>(size_), "GlooCommunicator::iallgather",
            "recv must hold size() blocks of send");
    return executor_.submit([this, send, recv] { do_allgather(send, recv); });
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::uint64_t sendrecv_slot = 0x0d1c, data_slot = 0x0d1d, watch_slot = 0x0d1e,
                                 gather_slot = 0x0d1f;

  // A blocking operation: queued behind the async ones, waited for here.
  void run(std::function<void()> op) { executor_.submit(std::move(op)).wait(); }

  // Runs f; Gloo's exceptions become an Error naming the operation; after one, every
  // operation fails at once (the mesh is in an unknown state).
  template <class F>
  void guarded(const char* op, F&& f) {
    if (!broken_.empty()) throw Error(where(op) + ": unusable after an earlier failure: " + broken_);
    try {
      f();
    } catch (const gloo::Exception& e) {
      broken_ = std::string(op) + ": " + e.what();
      hang_up();
      throw Error(where(op) + ": " + e.what());
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's failed checks, e.g. a key the store already holds
      broken_ = std::string(op) + ": " + e.what();
      hang_up();
      throw Error(where(op) + ": " + e.what() + stale_store_hint(e.what()));
    } catch (const Error& e) {
      broken_ = std::string(op) + ": " + e.what();
      hang_up();
      throw;
    }
  }
  // After a failure this rank closes its connections, so that the peers' waits fail now
  // rather than at their timeout.
  void hang_up() noexcept {
    if (!context_) return;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      try {
        if (auto& pair = context_->getPair(p)) pair->close();
      } catch (...) {  // a pair that cannot be closed is left to the peer's timeout
      }
    }
  }
  // A group that meets under a prefix the store already holds (a restarted run that kept
  // its name) finds the earlier meeting's keys.
  static std::string stale_store_hint(std::string_view what) {
    return what.find("already exists") != std::string_view::npos || what.find("already set") != std::string_view::npos
               ? " (the store already holds this group's keys from an earlier meeting: give a restarted run a new "
                 "prefix, or empty the store)"
               : "";
  }
  std::string where(const char* op) const {
    return "GlooCommunicator::" + std::string(op) + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ", timeout " + std::to_string(timeout_.count()) + " ms)";
  }

  // Every rank learns every rank's size; all throw the same Error on a mismatch (nothing
  // was sent: the communicator stays usable) instead of a truncated or hung collective.
  void agree_on_size(std::size_t n, const char* op) {
    if (size_ == 1) return;
    const auto mine = static_cast<std::uint64_t>(n);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    guarded(op, [&] { ring_allgather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(all))); });
    const auto [lo, hi] = std::minmax_element(all.begin(), all.end());
    detail::require(*lo == *hi, ("GlooCommunicator::" + std::string(op)).c_str(),
                    "ranks disagree on the message size (" + std::to_string(*lo) + " to " + std::to_string(*hi) + ")");
  }

  // A watcher per peer: a thread waiting on a zero-byte receive from that peer that is
  // never matched. Gloo fails the receives posted on a connection that breaks, but not a
  // send still queued on it, so a wait on such a send alone would last the whole timeout;
  // the watcher marks the peer lost and wakes the operation's waits (exchange()).
  // A Watch stops its thread when destroyed (also when the constructor fails midway).
  struct Watch {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
    std::thread thread;
    explicit Watch(std::unique_ptr<gloo::transport::UnboundBuffer> b) : buffer(std::move(b)) {}
    Watch(Watch&&) noexcept = default;
    Watch& operator=(Watch&&) = delete;
    ~Watch() {
      if (!thread.joinable()) return;
      buffer->abortWaitRecv();
      thread.join();
    }
  };
  void watch_peers() {
    lost_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(size_));
    lost_why_.assign(static_cast<std::size_t>(size_), "");
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      Watch w(context_->createUnboundBuffer(nullptr, 0));
      w.buffer->recv(p, watch_slot, 0, 0);
      w.thread = std::thread([this, p, b = w.buffer.get()] { watch(p, *b); });
      watches_.push_back(std::move(w));
    }
  }
  void watch(int peer, gloo::transport::UnboundBuffer& b) {
    std::string why;
    try {
      b.waitRecv(nullptr, std::chrono::hours(24 * 3650));  // returns when aborted: stopping
      return;
    } catch (const std::exception& e) {
      why = e.what();
    }
    std::lock_guard lock(buffer_mutex_);
    lost_why_[static_cast<std::size_t>(peer)] = why;
    lost_[static_cast<std::size_t>(peer)] = true;
    if (buffer_) buffer_->abortWaitRecv(), buffer_->abortWaitSend();
  }

  // Every operation's bytes pass through one Gloo buffer over workspace_ (the watchers
  // wake its waits). Returns the bytes.
  std::byte* workspace(std::size_t bytes) {
    if (buffer_ && bytes <= workspace_.size()) return workspace_.data();
    std::lock_guard lock(buffer_mutex_);
    buffer_.reset();
    workspace_.assign(std::max({bytes, 2 * workspace_.size(), std::size_t{1} << 16}), std::byte{});
    buffer_ = context_->createUnboundBuffer(workspace_.data(), workspace_.size());
    return workspace_.data();
  }

  // A collective's receives and sends on the workspace: (offset, bytes); empty parts are
  // skipped (both sides compute the same sizes). Receives are posted a step ahead, so
  // that the sender's data need not wait for the receiver's ready message.
  using Part = std::pair<std::size_t, std::size_t>;
  void post_recv(int from, Part in, std::uint64_t slot) {
    if (in.second > 0) buffer_->recv(from, slot, in.first, in.second);
  }
  void post_send(int to, Part out, std::uint64_t slot) {
    if (out.second > 0) buffer_->send(to, slot, out.first, out.second);
  }
  // One step: receive `in` from `from`, send `out` to `to`, both by `deadline`.
  void exchange(const char* op, int to, Part out, int from, Part in, std::uint64_t slot, Clock::time_point deadline) {
    post_recv(from, in, slot);
    post_send(to, out, slot);
    if (in.second > 0) wait_for(op, true, from, deadline);
    if (out.second > 0) wait_for(op, false, to, deadline);
  }
  // Waits for the workspace's receive from (or send to) `peer`. Woken by a watcher: if
  // the lost peer is another, the wait goes on; if it is this one, what it completed
  // before its connection broke counts, and otherwise the operation fails now.
  void wait_for(const char* op, bool recv, int peer, Clock::time_point deadline) {
    const auto wait = [&](std::chrono::milliseconds t) { return recv ? buffer_->waitRecv(t) : buffer_->waitSend(t); };
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (wait(std::max(std::chrono::milliseconds(1), left))) return;
      if (!lost_[static_cast<std::size_t>(peer)]) continue;
      try {
        if (wait(std::chrono::milliseconds(1))) return;
      } catch (const gloo::Exception&) {  // not completed: Gloo's 1 ms timeout
      }
      std::lock_guard lock(buffer_mutex_);
      throw Error(where(op) + ": rank " + std::to_string(peer) + "'s connection broke during the " +
                  (recv ? "receive from it: " : "send to it: ") + lost_why_[static_cast<std::size_t>(peer)]);
    }
  }

  // recv = every rank's `send` in rank order (or, with an empty recv, a barrier through
  // the workspace); a ring of size - 1 steps, each passing one block to the right.
  void ring_allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    const std::size_t m = send.size(), k = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    std::byte* w = workspace(m * k);
    std::memcpy(w + me * m, send.data(), m);
    ring_gather_blocks([&](std::size_t i) { return Part{((i + k - 1) % k) * m, m}; }, "allgather");  // holds its own
    if (!recv.empty()) std::memcpy(recv.data(), w, m * k);
  }

  // The ring's passing of blocks: this rank holds block(me + 1) (offset, bytes in the
  // workspace); after size - 1 steps every rank holds every block.
  // The first `posted` receives (on gather_slot) are already posted.
  template <class Block>
  void ring_gather_blocks(Block block, const char* op, std::size_t posted = 0) {
    const std::size_t k = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    const auto deadline = Clock::now() + timeout_;
    for (std::size_t s = posted; s + 1 < k; ++s) post_recv(left, block(me + 2 * k - s), gather_slot);
    for (std::size_t s = 0; s + 1 < k; ++s) {
      const Part out = block(me + 1 + k - s), in = block(me + 2 * k - s);
      post_send(right, out, gather_slot);
      if (in.second > 0) wait_for(op, true, left, deadline);
      if (out.second > 0) wait_for(op, false, right, deadline);
    }
  }

  void do_allreduce(std::span<float> x) {
    agree_on_size(x.size(), "allreduce_sum");
    if (x.empty() || size_ == 1) return;
    guarded("allreduce_sum", [&] { ring_allreduce(x); });
  }

  // Ring allreduce: reduce-scatter then allgather over size segments; each segment is
  // summed once, in ring order, and passed on as it is: the same bits on every rank.
  // The workspace: the n floats, then two segments' room for what arrives (alternating).
  void ring_allreduce(std::span<float> x) {
    const std::size_t n = x.size(), k = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    const auto segment = [&](std::size_t i) { return Part{n * (i % k) / k, n * (i % k + 1) / k - n * (i % k) / k}; };
    const auto bytes = [](Part p) { return Part{p.first * sizeof(float), p.second * sizeof(float)}; };
    const std::size_t most = (n + k - 1) / k;
    float* d = reinterpret_cast<float*>(workspace((n + 2 * most) * sizeof(float)));
    const auto room = [&](std::size_t s, std::size_t floats) { return Part{(n + (s % 2) * most) * sizeof(float), floats * sizeof(float)}; };
    std::memcpy(d, x.data(), x.size_bytes());
    const auto deadline = Clock::now() + timeout_;
    const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
    post_recv(left, room(0, segment(me + 2 * k - 1).second), data_slot);
    for (std::size_t s = 0; s + 1 < k; ++s) {  // after it, this rank holds the sum of segment me + 1
      const Part out = segment(me + k - s), in = segment(me + 2 * k - s - 1);
      if (s + 2 < k) post_recv(left, room(s + 1, segment(me + 2 * k - s - 2).second), data_slot);
      post_send(right, bytes(out), data_slot);
      if (in.second > 0) wait_for("allreduce_sum", true, left, deadline);
      const float* got = d + n + (s % 2) * most;
      for (std::size_t i = 0; i < in.second; ++i) d[in.first + i] += got[i];
      if (out.second > 0) wait_for("allreduce_sum", false, right, deadline);
      post_recv(left, bytes(segment(me + k - s)), gather_slot);  // sent: free for the gather's step s
    }
    ring_gather_blocks([&](std::size_t i) { return bytes(segment(i)); }, "allreduce_sum", k - 1);
    std::memcpy(x.data(), d, x.size_bytes());
  }

  void do_allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    agree_on_size(send.size(), "allgather");
    if (send.empty()) return;
    if (size_ == 1) {
      std::memcpy(recv.data(), send.data(), send.size());
      return;
    }
    guarded("allgather", [&] { ring_allgather(send, recv); });
  }

  void do_sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    if (dest == rank_ && src == rank_) {
      detail::require(send.size() == recv.size(), "GlooCommunicator::sendrecv", "sizes differ");
      if (!send.empty()) std::memcpy(recv.data(), send.data(), send.size());
      return;
    }
    guarded("sendrecv", [&] {
      std::byte* w = workspace(send.size() + recv.size());
      if (!send.empty()) std::memcpy(w, send.data(), send.size());
      exchange("sendrecv", dest, {0, send.size()}, src, {send.size(), recv.size()}, sendrecv_slot,
               Clock::now() + timeout_);
      if (!recv.empty()) std::memcpy(recv.data(), w + send.size(), recv.size());
    });
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefixed_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::byte> workspace_;                        // every operation's bytes
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;  // over workspace_
  std::mutex buffer_mutex_;                                 // buffer_ and lost_why_ against the watchers
  std::unique_ptr<std::atomic<bool>[]> lost_;               // (ranks) whose connection broke
  std::vector<std::string> lost_why_;                       // (ranks) Gloo's message when it did
  std::vector<Watch> watches_;  // (peers) after what their threads use: stopped first
  std::string broken_;      // the first failure, once there was one
  SerialExecutor executor_;  // last: joined first, while the members its tasks use are alive
};

static_assert(Communicator<GlooCommunicator>);

}  // namespace dilocox
