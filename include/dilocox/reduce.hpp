// dilocox/reduce.hpp: CompressedReducer, the mean of one flat float vector across
// the K replicas of a Communicator, with every message encoded by a Codec. Every
// rank ends with bit-identical results:
//   allgather: each rank encodes once; all payloads are gathered and decoded and
//              summed in rank order (K-1 payloads received per rank; fine for small K);
//   ring:      reduce-scatter in K chunks that decodes, adds and re-encodes on every
//              hop, then the owner of each chunk encodes its mean once and an
//              all-gather hands those bytes to everyone (2(K-1)/K payloads per rank).
// Ranks flagged as not contributing send zeros and are left out of the mean. The
// reducer holds the codec and its message workspaces; the communicator is given per call.
// Not here: what is reduced (compress/) or when (overlap.hpp, diloco.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dilocox/codec.hpp"
#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/config.hpp"
#include "dilocox/random.hpp"
#include "dilocox/wire.hpp"

namespace dilocox {

enum class ReduceAlgorithm : std::uint8_t { allgather, ring };

inline const char* to_string(ReduceAlgorithm a) { return a == ReduceAlgorithm::ring ? "ring" : "allgather"; }

// How many ranks a contributes mask includes.
inline int count_contributors(std::span<const std::uint8_t> contributes) {
  int n = 0;
  for (auto c : contributes) n += c ? 1 : 0;
  return n;
}

struct ReduceResult {
  WireCost cost;         // what this rank put on the wire, and the hops it waited for
  int contributors = 0;  // ranks averaged
};

class CompressedReducer {
 public:
  CompressedReducer(Codec codec, ReduceAlgorithm algorithm) : codec_(codec), algorithm_(algorithm) {
    if (codec.encoding == Encoding::quantized) validate(codec.quant);
  }
  const Codec& codec() const { return codec_; }
  ReduceAlgorithm algorithm() const { return algorithm_; }

  // What mean() of n floats puts on the wire per rank among k ranks (for planning).
  static WireCost cost(const Codec& codec, ReduceAlgorithm algorithm, std::size_t n, int k) {
    if (algorithm == ReduceAlgorithm::allgather || k <= 1) return ring_allgather_cost(codec_payload_size(codec, n), k);
    const std::size_t p = codec_payload_size(codec, ring_chunk(codec, n, k));
    WireCost c = ring_allgather_cost(ring_status_bytes + p, k);
    for (int s = 0; s < k - 1; ++s) c += sendrecv_cost(p, k);
    return c;
  }

  // out = mean over contributing ranks of what their x decodes to. `contributes` has
  // one entry per rank and must be identical on every rank; x is ignored on a rank
  // that does not contribute. `seed` varies stochastic rounding per call.
  template <Communicator C>
  ReduceResult mean(C& comm, std::span<const float> x, std::span<const std::uint8_t> contributes,
                    std::span<float> out, std::uint64_t seed) {
    const int k = comm.size();
    detail::require(contributes.size() == static_cast<std::size_t>(k), "CompressedReducer::mean",
                    "contributes has " + std::to_string(contributes.size()) + " entries for " + std::to_string(k) +
                        " ranks");
    detail::require(x.size() == out.size(), "CompressedReducer::mean", "input and output sizes differ");
    ReduceResult r;
    r.contributors = count_contributors(contributes);
    r.cost = algorithm_ == ReduceAlgorithm::ring && k > 1 ? ring(comm, x, contributes, r.contributors, out, seed)
                                                          : gather(comm, x, contributes, out, seed);
    const float inv = r.contributors > 0 ? 1.0f / static_cast<float>(r.contributors) : 0.0f;
    if (algorithm_ == ReduceAlgorithm::allgather || k == 1)
      for (float& v : out) v *= inv;
    return r;
  }

 private:
  static constexpr std::size_t ring_status_bytes = 8;  // u64: 1 + the rank whose payload failed, or 0

  // The ring's chunk length: n / k rounded up to whole quantization blocks.
  static std::size_t ring_chunk(const Codec& codec, std::size_t n, int k) {
    const std::size_t align = codec.encoding == Encoding::quantized ? codec.quant.block : 1;
    const std::size_t per = (n + static_cast<std::size_t>(k) - 1) / static_cast<std::size_t>(k);
    return std::max<std::size_t>(align, (per + align - 1) / align * align);
  }

  static std::uint64_t hop_seed(std::uint64_t seed, int rank, int step) {
    return seed ^ (static_cast<std::uint64_t>(mix32(static_cast<std::uint32_t>(rank) * 7919U +
                                                    static_cast<std::uint32_t>(step))) << 32);
  }

  // Checks a received payload against what this codec sends, then adds it into out.
  void add_payload(std::span<const std::byte> bytes, int from, std::span<float> out) const {
    const PayloadView v = read_payload(bytes);
    PayloadHeader want = codec_header(codec_, out.size());
    want.quant.seed = v.header.quant.seed;
    if (v.header.kind != want.kind || !(v.header.shape == want.shape) || !(v.header.quant == want.quant))
      throw Error("CompressedReducer: rank " + std::to_string(from) + " sent a payload that does not match this " +
                  "rank's codec " + to_string(codec_) + " and length " + std::to_string(out.size()));
    decode_add(v, out);
  }

  template <Communicator C>
  WireCost gather(C& comm, std::span<const float> x, std::span<const std::uint8_t> contributes, std::span<float> out,
                  std::uint64_t seed) {
    const int k = comm.size(), me = comm.rank();
    const std::size_t p = codec_payload_size(codec_, x.size());
    send_.resize(p);
    recv_.resize(p * static_cast<std::size_t>(k));
    encode_or_zero(contributes[me] ? x : std::span<const float>{}, x.size(), send_, hop_seed(seed, me, 0));
    comm.allgather(send_, recv_);
    std::fill(out.begin(), out.end(), 0.0f);
    for (int r = 0; r < k; ++r)  // rank order: the same sum on every rank
      if (contributes[r]) add_payload(std::span<const std::byte>(recv_).subspan(r * p, p), r, out);
    return cost(codec_, ReduceAlgorithm::allgather, x.size(), k);
  }

  template <Communicator C>
  WireCost ring(C& comm, std::span<const float> x, std::span<const std::uint8_t> contributes, int count,
                std::span<float> out, std::uint64_t seed) {
    const int k = comm.size(), me = comm.rank();
    const bool mine = contributes[me] != 0;
    const std::size_t n = x.size();
    const std::size_t len = ring_chunk(codec_, n, k);
    const std::size_t p = codec_payload_size(codec_, len), status = ring_status_bytes;
    auto chunk = [&](int c, std::span<const float> v) {  // elements of chunk c that exist in v
      const std::size_t lo = std::min(n, static_cast<std::size_t>(c) * len);
      return v.subspan(lo, std::min(n, lo + len) - lo);
    };
    partial_.assign(len, 0.0f);
    send_.resize(std::max(p, status + p));
    recv_.resize(std::max(p, (status + p) * static_cast<std::size_t>(k)));
    hop_.resize(p);

    // Reduce-scatter: after K-1 hops this rank holds the sum of chunk (me + 1) % K.
    if (mine) add_chunk(chunk(me, x));
    encode(codec_, partial_, std::span(send_).first(p), hop_seed(seed, me, 0));
    std::uint64_t bad_from = 0;  // 1 + the rank whose payload failed, or 0
    std::string why;
    for (int s = 0; s < k - 1; ++s) {
      const int src = (me - 1 + k) % k, c = (me - s - 1 + 2 * k) % k;
      comm.sendrecv(std::span(send_).first(p), (me + 1) % k, hop_, src);
      std::fill(partial_.begin(), partial_.end(), 0.0f);
      try {
        add_payload(hop_, src, partial_);
      } catch (const Error& e) {  // finish the protocol, then fail on every rank together
        if (!bad_from) bad_from = 1 + static_cast<std::uint64_t>(src), why = e.what();
        std::fill(partial_.begin(), partial_.end(), 0.0f);
      }
      if (mine) add_chunk(chunk(c, x));
      if (s < k - 2) encode(codec_, partial_, std::span(send_).first(p), hop_seed(seed, me, s + 1));
    }
    // The owner's mean of its chunk, encoded once; everyone decodes the same bytes.
    const float inv = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
    for (float& v : partial_) v *= inv;
    std::memcpy(send_.data(), &bad_from, status);
    encode(codec_, partial_, std::span(send_).subspan(status, p), hop_seed(seed, me, k));
    comm.allgather(std::span(send_).first(status + p), std::span(recv_).first((status + p) * k));
    for (int r = 0; r < k; ++r) {
      std::uint64_t flag;
      std::memcpy(&flag, recv_.data() + r * (status + p), status);
      if (flag)
        throw Error("CompressedReducer: rank " + std::to_string(r) + " rejected the payload from rank " +
                    std::to_string(flag - 1) + (r == me ? ": " + why : std::string()));
    }
    std::fill(out.begin(), out.end(), 0.0f);
    for (int r = 0; r < k; ++r) {
      const int c = (r + 1) % k;
      std::fill(partial_.begin(), partial_.end(), 0.0f);
      add_payload(std::span<const std::byte>(recv_).subspan(r * (status + p) + status, p), r, partial_);
      const auto dst = chunk(c, std::span<const float>(out));
      std::copy_n(partial_.begin(), dst.size(), out.begin() + (dst.data() - out.data()));
    }
    return cost(codec_, ReduceAlgorithm::ring, n, k);
  }

  void add_chunk(std::span<const float> c) {
    for (std::size_t i = 0; i < c.size(); ++i) partial_[i] += c[i];
  }

  void encode_or_zero(std::span<const float> x, std::size_t n, std::span<std::byte> dst, std::uint64_t seed) {
    if (!x.empty() || n == 0) return encode(codec_, x, dst, seed);
    partial_.assign(n, 0.0f);
    encode(codec_, partial_, dst, seed);
  }

  Codec codec_;
  ReduceAlgorithm algorithm_;
  std::vector<std::byte> send_, recv_, hop_;  // message workspaces
  std::vector<float> partial_;                // (chunk) running sum, host
};

}  // namespace dilocox
