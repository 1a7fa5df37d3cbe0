// dilocox/compress/compressor.hpp: the interface every pseudo-gradient compressor
// satisfies (ours in compress/*.hpp, and a user's own), and AnyCompressor, which
// holds any of them by value for OuterLoop. A compressor owns its configuration,
// its algorithm, its per-tensor state (error feedback, warm starts, ...), saving and
// loading that state, and what it puts on the wire (wire_bytes, for planning).
// Not here: when syncs happen (diloco.hpp) or how bytes travel (comm/, reduce.hpp).
#pragma once

#include <concepts>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dilocox/checksum.hpp"
#include "dilocox/comm/any.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/outer.hpp"
#include "dilocox/state.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

namespace detail {
// A number as people write it ("0.95", "4", "1e-05"), for describe().
inline std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace detail

// A tensor as compressors see it. The name is the tensor's identity: compressors draw
// its random streams (projector start, energy probes, random subsets) from the name,
// never from its position, so a loop over a shard or a fragment of the tensors draws
// what one loop over all of them draws. Give distinct tensors distinct names.
struct TensorSpec {
  std::string name;
  Shape shape;
};

// The key of a tensor's random streams: a hash of its name.
inline std::uint64_t stream_key(const TensorSpec& s) {
  return checksum64(std::as_bytes(std::span(s.name.data(), s.name.size())));
}

// One sync, as every rank sees it (identical everywhere).
struct SyncInput {
  std::span<const std::size_t> tensors;       // indices into setup()'s specs, ascending: what this sync carries
  std::span<const std::uint8_t> contributes;  // (replicas) 1: this replica is in the mean
  std::uint64_t sync = 0;                     // index of this sync since the loop began (seeds)
};

// x[j] / mean[j]: tensor in.tensors[j], shape.numel() floats, host.
using TensorSpans = std::span<const std::span<float>>;

// What a sync did, and what the compressor asks of the next rounds.
struct SyncReport {
  WireCost cost{};               // bytes this rank put on the wire for this sync, and hops waited for
  int contributors = 0;          // replicas averaged
  double low_rank = 0;           // mean rank of the tensors sent low rank (0: none)
  double local_steps_scale = 0;  // H hint: next H = H0 x scale (adaptive compression); 0 = no opinion
  double local_steps_weight = 0; // how many tensors voted for that scale (to weigh fragments)
};

// The contract of sync(comm, in, x, mean), called in the same order on every replica:
// - x[j] is this replica's pseudo-gradient (anchor - phi) of tensor in.tensors[j]; the
//   compressor may modify it (e.g. add its error-feedback residual in place);
// - it writes into mean[j] the mean over contributing replicas of what they sent,
//   bit-identical on every rank;
// - on return, x[j] holds what this replica still owes the global model for that
//   tensor: the progress it has not transmitted and will carry into later syncs (its
//   error-feedback residual), or zeros. Rebase::keep keeps it in the local model, so a
//   replica never redoes work it has not sent yet (docs/API.md, "What the local model
//   keeps"); with the outer momentum at the replica, x[j] arrives as its momentum step;
// - when this replica does not contribute (in.contributes[comm.rank()] == 0: it had a
//   NaN/Inf), x is zeros and the compressor drops its own residual for these tensors
//   (the replica restarts from the global model);
// - it throws dilocox::Error on bad input, on every rank alike (never a hang).
// setup(specs) is called once, before the first sync, with every tensor the loop owns.
// describe() names the method and every setting that changes the bytes on the wire
// (replicas compare it before the first sync).
template <class T>
concept Compressor = std::move_constructible<T> &&
                     requires(T& c, const T& cc, std::span<const TensorSpec> specs, AnyCommunicator& comm,
                              const SyncInput& in, TensorSpans x, TensorSpans mean) {
                       c.setup(specs);
                       { c.sync(comm, in, x, mean) } -> std::same_as<SyncReport>;
                       { cc.describe() } -> std::convertible_to<std::string>;
                     };

// Optional members, used when present:
//   void save_state(StateWriter&) const; void load_state(StateReader&);   checkpoints
//   std::uint64_t wire_bytes(std::span<const TensorSpec>, int replicas) const;
//                              bytes one rank puts on the wire for one sync of those tensors
//   std::uint64_t state_bytes(std::span<const TensorSpec>) const;
//                              host bytes of its per-tensor state for those tensors (planning)
//   NesterovConfig outer_step() const;   the outer step the method is designed for
//   void forget_owed();        drops what this replica still owes (error feedback): a
//                              replica that took another's state starts owing nothing
template <class T>
concept CompressorWithState = requires(T& c, const T& cc, StateWriter& w, StateReader& r) {
  cc.save_state(w);
  c.load_state(r);
};
template <class T>
concept CompressorWithDebt = requires(T& c) { c.forget_owed(); };
template <class T>
concept CompressorWithWireBytes = requires(const T& c, std::span<const TensorSpec> specs, int k) {
  { c.wire_bytes(specs, k) } -> std::convertible_to<std::uint64_t>;
};
template <class T>
concept CompressorWithStateBytes = requires(const T& c, std::span<const TensorSpec> specs) {
  { c.state_bytes(specs) } -> std::convertible_to<std::uint64_t>;
};
template <class T>
concept CompressorWithOuterStep = requires(const T& c) {
  { c.outer_step() } -> std::same_as<NesterovConfig>;
};

// Any Compressor, by value, with every optional member answered.
class AnyCompressor {
 public:
  template <Compressor T>
    requires(!std::same_as<std::remove_cvref_t<T>, AnyCompressor>)
  AnyCompressor(T c) : self_(std::make_unique<Model<T>>(std::move(c))) {}  // NOLINT: implicit on purpose

  void setup(std::span<const TensorSpec> specs) { self_->setup(specs); }
  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    return self_->sync(comm, in, x, mean);
  }
  std::string describe() const { return self_->describe(); }
  void save_state(StateWriter& w) const { self_->save_state(w); }
  void load_state(StateReader& r) { self_->load_state(r); }
  bool has_state() const { return self_->has_state(); }
  // false: the compressor keeps state but cannot drop a replica's debt.
  bool forget_owed() { return self_->forget_owed(); }
  // nullopt when the compressor does not say.
  std::optional<std::uint64_t> wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    return self_->wire_bytes(specs, replicas);
  }
  // nullopt when the compressor does not say.
  std::optional<std::uint64_t> state_bytes(std::span<const TensorSpec> specs) const { return self_->state_bytes(specs); }
  // nullopt: the library's default outer step.
  std::optional<NesterovConfig> outer_step() const { return self_->outer_step(); }

  // The compressor held, when it is a T (tests, diagnostics); nullptr otherwise.
  template <class T>
  T* get() {
    auto* m = dynamic_cast<Model<T>*>(self_.get());
    return m ? &m->c : nullptr;
  }
  template <class T>
  const T* get() const {
    const auto* m = dynamic_cast<const Model<T>*>(self_.get());
    return m ? &m->c : nullptr;
  }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual void setup(std::span<const TensorSpec>) = 0;
    virtual SyncReport sync(AnyCommunicator&, const SyncInput&, TensorSpans, TensorSpans) = 0;
    virtual std::string describe() const = 0;
    virtual void save_state(StateWriter&) const = 0;
    virtual void load_state(StateReader&) = 0;
    virtual bool has_state() const = 0;
    virtual bool forget_owed() = 0;
    virtual std::optional<std::uint64_t> wire_bytes(std::span<const TensorSpec>, int) const = 0;
    virtual std::optional<std::uint64_t> state_bytes(std::span<const TensorSpec>) const = 0;
    virtual std::optional<NesterovConfig> outer_step() const = 0;
  };
  template <class T>
  struct Model final : Base {
    explicit Model(T v) : c(std::move(v)) {}
    void setup(std::span<const TensorSpec> s) override { c.setup(s); }
    SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) override {
      return c.sync(comm, in, x, mean);
    }
    std::string describe() const override { return c.describe(); }
    void save_state(StateWriter& w) const override {
      if constexpr (CompressorWithState<T>) c.save_state(w);
    }
    void load_state(StateReader& r) override {
      if constexpr (CompressorWithState<T>) c.load_state(r);
    }
    bool has_state() const override { return CompressorWithState<T>; }
    bool forget_owed() override {
      if constexpr (CompressorWithDebt<T>) c.forget_owed();
      return CompressorWithDebt<T> || !CompressorWithState<T>;
    }
    std::optional<std::uint64_t> wire_bytes(std::span<const TensorSpec> s, int k) const override {
      if constexpr (CompressorWithWireBytes<T>) return static_cast<std::uint64_t>(c.wire_bytes(s, k));
      return std::nullopt;
    }
    std::optional<std::uint64_t> state_bytes(std::span<const TensorSpec> s) const override {
      if constexpr (CompressorWithStateBytes<T>) return static_cast<std::uint64_t>(c.state_bytes(s));
      return std::nullopt;
    }
    std::optional<NesterovConfig> outer_step() const override {
      if constexpr (CompressorWithOuterStep<T>) return c.outer_step();
      return std::nullopt;
    }
    T c;
  };
  std::unique_ptr<Base> self_;
};

static_assert(Compressor<AnyCompressor>);

}  // namespace dilocox
