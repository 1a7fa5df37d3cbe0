// dilocox/comm/gloo.hpp: GlooCommunicator, the Communicator concept over Gloo's TCP
// transport, for links between jobs that share no MPI world (sites). The ranks meet
// through a store: a file store (a directory every rank sees: one machine, or a shared
// file system) or Redis (Gloo's RedisStore), then connect a full mesh of TCP pairs.
// Every operation waits at most `timeout`, so a stalled or dead peer is a
// dilocox::Error naming the operation and Gloo's reason (with the peer's address),
// never a hang; the communicator is unusable after one. Constructing one ignores SIGPIPE
// where it has its default action (a dead peer's socket must be an Error, not an exit). All operations, blocking and
// async, run in program order on one progress thread, so that every rank issues them
// to Gloo in the same order. Link against Gloo (CMake target `gloo`).
// Not here: MPI (comm/mpi.hpp), modelled links (comm/throttled.hpp).
#pragma once

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
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

#include <csignal>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

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
    });
  }

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
      guarded("barrier", [&] {
        gloo::BarrierOptions opts(context_);
        opts.setTimeout(timeout_);
        gloo::barrier(opts);
      });
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
  static constexpr std::uint32_t sendrecv_slot = 0x0d1c;

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
      throw Error(where(op) + ": " + e.what());
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's failed checks, e.g. a key the store already holds
      broken_ = std::string(op) + ": " + e.what();
      throw Error(where(op) + ": " + e.what() + stale_store_hint(e.what()));
    } catch (const Error& e) {
      broken_ = std::string(op) + ": " + e.what();
      throw;
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

  // Every rank learns the smallest and largest size; all throw the same Error on a
  // mismatch instead of a truncated or hung collective.
  void agree_on_size(std::size_t n, const char* op) {
    std::int64_t v[2] = {static_cast<std::int64_t>(n), -static_cast<std::int64_t>(n)};
    guarded(op, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(v, 2);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(
          &gloo::max<std::int64_t>));
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
    detail::require(v[0] == -v[1], ("GlooCommunicator::" + std::string(op)).c_str(),
            "ranks disagree on the message size (" + std::to_string(-v[1]) + " to " + std::to_string(v[0]) + ")");
  }

  void do_allreduce(std::span<float> x) {
    agree_on_size(x.size(), "allreduce_sum");
    if (x.empty() || size_ == 1) return;
    guarded("allreduce_sum", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(x.data(), x.size());
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  void do_allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    agree_on_size(send.size(), "allgather");
    if (send.empty()) return;
    if (size_ == 1) {
      std::memcpy(recv.data(), send.data(), send.size());
      return;
    }
    guarded("allgather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(send.data())), send.size());
      opts.setOutput(reinterpret_cast<std::uint8_t*>(recv.data()), recv.size());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  void do_sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    if (dest == rank_ && src == rank_) {
      detail::require(send.size() == recv.size(), "GlooCommunicator::sendrecv", "sizes differ");
      if (!send.empty()) std::memcpy(recv.data(), send.data(), send.size());
      return;
    }
    guarded("sendrecv", [&] {
      auto out = context_->createUnboundBuffer(const_cast<std::byte*>(send.data()), send.size());
      auto in = context_->createUnboundBuffer(recv.data(), recv.size());
      in->recv(src, sendrecv_slot);
      out->send(dest, sendrecv_slot);
      if (!in->waitRecv(timeout_)) throw Error(where("sendrecv") + ": receive from rank " + std::to_string(src) + " aborted");
      if (!out->waitSend(timeout_)) throw Error(where("sendrecv") + ": send to rank " + std::to_string(dest) + " aborted");
    });
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefixed_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::string broken_;      // the first failure, once there was one
  SerialExecutor executor_;  // last: joined first, while the members its tasks use are alive
};

static_assert(Communicator<GlooCommunicator>);

}  // namespace dilocox
