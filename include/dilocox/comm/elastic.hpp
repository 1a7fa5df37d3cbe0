// dilocox/comm/elastic.hpp: ElasticGroup, the sites of a run whose membership changes
// between rounds. Each membership is an epoch: a list of sites and one GlooCommunicator
// over them (its rank order is the list's), which ElasticGroup forwards to, so an
// OuterLoop<ElasticGroup> runs over whatever sites are members now. Changes:
//   - at_boundary(): at a round boundary every member says whether it leaves and which
//     join requests it saw in the store; sites that asked to join and carry the same
//     fingerprint (model, flags) are admitted, others refused with the difference named;
//   - recover(): after an operation failed (a member died or stalled past the timeout),
//     each survivor posts how far it got; those that answer within `settle` are the next
//     epoch, and all roll back to the furthest point every one of them reached;
//   - a restarted or new site's constructor asks to join and waits to be admitted; its
//     first collective, like every member's after a change, is share_state(): one member
//     that holds the run's state sends it, checksummed, to each that does not.
// Liveness comes from the connections (a dead peer is noticed by GlooCommunicator's
// watchers at once) and the operation timeout (a stalled one), not from heartbeats.
// Decisions are store keys written once, the first writer winning (an atomic link() in a
// file store, SETNX in Redis): every site reads the same epoch lists. Needs Gloo.
// Not here: what the sites train (the caller's OuterLoop and its snapshots).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dilocox/checksum.hpp"
#include "dilocox/comm/gloo.hpp"

namespace dilocox {

struct ElasticOptions {
  GlooOptions gloo{};  // the store, the run's prefix, this site's address, every operation's timeout
  int site = 0;        // this site's id: unique in the run, kept across its restarts
  int founders = 1;    // sites 0 .. founders - 1 start the run together: the first epoch
  // What must match for a site to join, as "key=value;key=value" (model, flags, data);
  // a joiner whose fingerprint differs is refused with the keys that differ.
  std::string fingerprint{};
  // After a failure, how long the survivors wait for each other's answer: more than the
  // spread between the sites reaching one collective.
  std::chrono::milliseconds settle{3'000};
  std::chrono::milliseconds join_timeout{600'000};  // how long a joining site waits to be admitted
};

struct MembershipChange {
  std::vector<int> joined, left;  // sites admitted; sites that left or were lost
  bool changed() const { return !joined.empty() || !left.empty(); }
};

namespace detail {

// The membership's keys under the run's prefix: written once, the first writer wins
// (add); read without waiting (find). A Redis store that goes away (restarted) is
// reconnected, each operation retried until `patience` has passed; then an Error.
class MembershipStore {
 public:
  MembershipStore(const std::string& url, const std::string& prefix,
                  std::chrono::milliseconds patience = std::chrono::milliseconds(10'000))
      : url_(url), prefix_(prefix), patience_(patience) {
    constexpr std::string_view file = "file://";
    if (url.starts_with(file) && url.size() > file.size()) {
      dir_ = url.substr(file.size());
      return;
    }
    try {
      redis_ = open_gloo_store(url);  // a malformed address: an Error now
    } catch (const gloo::Exception&) {  // not answering now: connected at the first operation
    } catch (const gloo::EnforceNotMet&) {
    }
  }

  bool add(const std::string& key, const std::string& value) {
    if (dir_.empty())
      return with_redis(patience_, [&](gloo::rendezvous::Store& r) {
        try {
          r.set(prefix_ + "/" + key, std::vector<char>(value.begin(), value.end()));
          return true;
        } catch (const gloo::EnforceNotMet& e) {
          if (std::string_view(e.what()).find("already") != std::string_view::npos) return false;
          throw;
        }
      });
    const std::string path = file_of(key), tmp = path + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << value;
      if (!out.flush()) throw Error("ElasticGroup: cannot write " + tmp);
    }
    const int rc = ::link(tmp.c_str(), path.c_str());
    const int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) return true;
    if (err == EEXIST) return false;
    throw Error("ElasticGroup: cannot write " + path + ": " + std::strerror(err));
  }

  // `quick`: one try (a store away now reads as no key) instead of waiting out the patience.
  std::optional<std::string> find(const std::string& key, bool quick = false) {
    if (dir_.empty()) {
      const auto read = [&](gloo::rendezvous::Store& r) -> std::optional<std::string> {
        const std::string k = prefix_ + "/" + key;
#if GLOO_USE_REDIS
        if (!static_cast<gloo::rendezvous::RedisStore&>(r).check({k})) return std::nullopt;
#endif
        const auto v = r.get(k);
        return std::string(v.begin(), v.end());
      };
      if (!quick) return with_redis(patience_, read);
      try {
        return with_redis(std::chrono::milliseconds(0), read);
      } catch (const Error&) {
        return std::nullopt;
      }
    }
    std::ifstream in(file_of(key), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string file_of(const std::string& key) const {
    std::string name = "elastic-" + prefix_ + "-" + key;
    std::replace(name.begin(), name.end(), '/', '%');
    return dir_ + "/" + name;
  }
  template <class F>
  std::invoke_result_t<F&, gloo::rendezvous::Store&> with_redis(std::chrono::milliseconds patience, F&& f) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      try {
        if (!redis_) redis_ = open_gloo_store(url_);
        return f(*redis_);
      } catch (const std::exception& e) {
        redis_.reset();
        if (std::chrono::steady_clock::now() >= deadline)
          throw Error("ElasticGroup: the store " + url_ + " did not answer within " +
                      std::to_string(patience.count()) + " ms: " + e.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }

  std::string url_, prefix_, dir_;
  std::chrono::milliseconds patience_;
  std::unique_ptr<gloo::rendezvous::Store> redis_;
};

// An epoch's record: "admitted=N;sites=a,b;joined=c".
struct EpochRecord {
  std::uint64_t admitted = 0;  // join requests decided so far (admitted or refused)
  std::vector<int> sites, joined;

  std::string text() const {
    const auto list = [](const std::vector<int>& v) {
      std::string s;
      for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
      return s;
    };
    return "admitted=" + std::to_string(admitted) + ";sites=" + list(sites) + ";joined=" + list(joined);
  }
  static EpochRecord parse(const std::string& t) {
    EpochRecord r;
    std::istringstream in(t);
    for (std::string field; std::getline(in, field, ';');) {
      const auto eq = field.find('=');
      const std::string k = field.substr(0, eq), v = eq == std::string::npos ? "" : field.substr(eq + 1);
      if (k == "admitted") r.admitted = std::stoull(v);
      std::vector<int>* list = k == "sites" ? &r.sites : k == "joined" ? &r.joined : nullptr;
      std::istringstream items(v);
      for (std::string x; list && std::getline(items, x, ',');) list->push_back(std::stoi(x));
    }
    return r;
  }
};

// The keys whose values differ between two fingerprints ("k=v;k=v"), named with both values.
inline std::string fingerprint_difference(const std::string& here, const std::string& there) {
  const auto fields = [](const std::string& f) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in(f);
    for (std::string kv; std::getline(in, kv, ';');) {
      const auto eq = kv.find('=');
      out.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
    }
    return out;
  };
  const auto a = fields(here), b = fields(there);
  const auto value = [](const auto& f, const std::string& k) -> std::string {
    for (const auto& [key, v] : f)
      if (key == k) return v;
    return "(none)";
  };
  std::string diff;
  std::vector<std::string> keys;
  for (const auto& f : {a, b})
    for (const auto& kv : f)
      if (std::find(keys.begin(), keys.end(), kv.first) == keys.end()) keys.push_back(kv.first);
  for (const auto& k : keys)
    if (value(a, k) != value(b, k))
      diff += (diff.empty() ? "" : ", ") + k + " '" + value(b, k) + "' (the run's: '" + value(a, k) + "')";
  return diff;
}

}  // namespace detail

class ElasticGroup {
 public:
  // Joins the run: a founder (first start of sites 0 .. founders - 1) meets the other
  // founders; a restarted or new site asks to join and waits until the members admit it
  // at a round boundary (or refuse it: an Error with their reason). Then newcomer() is
  // true until share_state() has brought it the run's state.
  explicit ElasticGroup(ElasticOptions o) : o_(std::move(o)), store_(o_.gloo.store, o_.gloo.prefix, o_.gloo.timeout) {
    detail::require(o_.site >= 0 && o_.founders >= 1, "ElasticGroup", "site must be >= 0 and founders >= 1");
    if (o_.site < o_.founders && store_.add("started/" + std::to_string(o_.site), "")) {
      detail::EpochRecord first;
      for (int s = 0; s < o_.founders; ++s) first.sites.push_back(s);
      store_.add("epoch/0", first.text());
      enter(0, detail::EpochRecord::parse(*store_.find("epoch/0")));
      return;
    }
    newcomer_ = true;
    join();
  }
  ElasticGroup(const ElasticGroup&) = delete;
  ElasticGroup& operator=(const ElasticGroup&) = delete;

  // The Communicator concept, over the current epoch's sites (rank = position in sites()).
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(sites_.size()); }
  void allreduce_sum(std::span<float> x) { comm().allreduce_sum(x); }
  void allgather(std::span<const std::byte> s, std::span<std::byte> r) { comm().allgather(s, r); }
  void sendrecv(std::span<const std::byte> s, int dest, std::span<std::byte> r, int src) { comm().sendrecv(s, dest, r, src); }
  void barrier() { comm().barrier(); }
  Request iallreduce_sum(std::span<float> x) { return comm().iallreduce_sum(x); }
  Request iallgather(std::span<const std::byte> s, std::span<std::byte> r) { return comm().iallgather(s, r); }

  int site() const { return o_.site; }
  std::uint64_t epoch() const { return epoch_; }
  const std::vector<int>& sites() const { return sites_; }
  bool newcomer() const { return newcomer_; }

  // At a round boundary, on every member: leavers go, requests to join are decided. A
  // leaving site finds itself in `left` and must stop using the group. Throws what the
  // group's operations throw (then recover()).
  MembershipChange at_boundary(bool leave = false) {
    std::int64_t mine[2] = {static_cast<std::int64_t>(requests_seen()), leave ? 1 : 0};
    std::vector<std::int64_t> all(2 * sites_.size());
    comm().allgather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    std::uint64_t seen = admitted_;
    MembershipChange c;
    detail::EpochRecord next;
    for (std::size_t i = 0; i < sites_.size(); ++i) {
      seen = std::max(seen, static_cast<std::uint64_t>(all[2 * i]));
      (all[2 * i + 1] != 0 ? c.left : next.sites).push_back(sites_[i]);
    }
    if (seen == admitted_ && c.left.empty()) return c;
    for (std::uint64_t n = admitted_; n < seen; ++n) decide_request(n, next.sites, c.joined);
    next.admitted = seen;
    next.joined = c.joined;
    next.sites.insert(next.sites.end(), c.joined.begin(), c.joined.end());
    std::sort(next.sites.begin(), next.sites.end());
    const auto agreed = propose(epoch_ + 1, next);
    if (leave) {
      comm_.reset();
      sites_.clear();
      return c;
    }
    enter(epoch_ + 1, agreed);
    return c;
  }

  // After an operation of the group failed, on every survivor: `progress` is how far this
  // site got (rounds it completed; -1: a newcomer without state). The sites that answer
  // within `settle` form the next epoch; returns the progress every member holding the
  // state can return to (the least of theirs), to roll back to. A site the others left
  // out (it answered too late) gets an Error.
  std::int64_t recover(std::int64_t progress) {
    const std::vector<int> before = sites_;
    comm_.reset();
    const std::string e = std::to_string(epoch_);
    store_.add("epoch/" + e + "/alive/" + std::to_string(o_.site), std::to_string(progress));
    detail::EpochRecord next;
    next.admitted = admitted_;
    std::vector<std::int64_t> got;
    const auto deadline = Clock::now() + o_.settle;
    for (;;) {
      next.sites.clear(), got.clear();
      for (int s : before)
        if (const auto v = store_.find("epoch/" + e + "/alive/" + std::to_string(s))) next.sites.push_back(s), got.push_back(std::stoll(*v));
      if (next.sites.size() == before.size() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const auto agreed = propose(epoch_ + 1, next);
    detail::require(std::find(agreed.sites.begin(), agreed.sites.end(), o_.site) != agreed.sites.end(),
                    "ElasticGroup::recover",
                    "site " + std::to_string(o_.site) + " answered after the others had formed epoch " +
                        std::to_string(epoch_ + 1) + " without it: restart it to rejoin");
    std::int64_t target = -1;
    for (int s : agreed.sites) {
      const auto v = store_.find("epoch/" + e + "/alive/" + std::to_string(s));
      const std::int64_t p = v ? std::stoll(*v) : -1;
      if (p >= 0) target = target < 0 ? p : std::min(target, p);
    }
    detail::require(target >= 0, "ElasticGroup::recover", "no surviving site holds the run's state");
    try {
      enter(epoch_ + 1, agreed);
    } catch (const Error&) {  // a member died while the epoch met: recover from that one
      return recover(progress);
    }
    return target;
  }

  // The run's state reaches every member without it (newcomers, and those that say
  // `need`: after recover(), a site without the snapshot it names): the first member
  // holding it calls `make` and sends the bytes (with their checksum) to each of them,
  // whose copy is returned (nullopt on the others). Every member calls it after every change.
  std::optional<std::vector<std::byte>> share_state(const std::function<std::vector<std::byte>()>& make,
                                                    bool need_state = false) {
    const std::int64_t need = newcomer_ || need_state ? 1 : 0;
    std::vector<std::int64_t> needs(sites_.size());
    comm().allgather(std::as_bytes(std::span(&need, 1)), std::as_writable_bytes(std::span(needs)));
    const auto donor = std::find(needs.begin(), needs.end(), 0);
    if (std::find(needs.begin(), needs.end(), 1) == needs.end()) return std::nullopt;
    detail::require(donor != needs.end(), "ElasticGroup::share_state", "no member holds the run's state");
    const int from = static_cast<int>(donor - needs.begin());
    std::vector<std::byte> bytes;
    std::uint64_t head[2] = {0, 0};  // size, checksum
    if (rank_ == from) {
      bytes = make();
      head[0] = bytes.size(), head[1] = checksum64(bytes);
    }
    for (int r = 0; r < size(); ++r) {
      if (needs[static_cast<std::size_t>(r)] == 0 || (rank_ != from && rank_ != r)) continue;
      auto h = std::as_writable_bytes(std::span(head));
      if (rank_ == from) {
        comm().sendrecv(std::as_bytes(std::span(head)), r, {}, from);
        comm().sendrecv(bytes, r, {}, from);
      } else {
        comm().sendrecv({}, from, h, from);
        bytes.resize(head[0]);
        comm().sendrecv({}, from, bytes, from);
        detail::require(checksum64(bytes) == head[1], "ElasticGroup::share_state",
                        "the state from site " + std::to_string(sites_[static_cast<std::size_t>(from)]) +
                            " failed its checksum: refused");
      }
    }
    if (need == 0) return std::nullopt;
    newcomer_ = false;
    return bytes;
  }

 private:
  using Clock = std::chrono::steady_clock;

  GlooCommunicator& comm() {
    if (!comm_) throw Error("ElasticGroup (site " + std::to_string(o_.site) + "): not a member of a group now");
    return *comm_;
  }

  // Join requests in the store from the first undecided one on, without a gap (a store
  // away now shows none: the round goes on without waiting for it).
  std::uint64_t requests_seen() {
    std::uint64_t n = admitted_;
    while (store_.find("join/" + std::to_string(n), /*quick=*/true)) ++n;
    return n;
  }
  // Request n ("site;fingerprint"): admitted into `joined`, or refused with the reason.
  void decide_request(std::uint64_t n, const std::vector<int>& staying, std::vector<int>& joined) {
    const std::string key = "join/" + std::to_string(n), request = store_.find(key).value_or("");
    const auto semi = request.find(';');
    const int site = std::stoi(request.substr(0, semi));
    const std::string fingerprint = semi == std::string::npos ? "" : request.substr(semi + 1);
    std::string why;
    if (fingerprint != o_.fingerprint)
      why = "its configuration differs from the run's: " + detail::fingerprint_difference(o_.fingerprint, fingerprint);
    else if (std::count(staying.begin(), staying.end(), site) + std::count(joined.begin(), joined.end(), site) > 0)
      why = "site " + std::to_string(site) + " is a member already";
    if (why.empty())
      joined.push_back(site);
    else
      store_.add(key + "/refused", why);
  }
  // The record of epoch e: ours if we write it first, else the one written first.
  detail::EpochRecord propose(std::uint64_t e, const detail::EpochRecord& mine) {
    const std::string key = "epoch/" + std::to_string(e);
    store_.add(key, mine.text());
    return detail::EpochRecord::parse(*store_.find(key));
  }

  // Enters epoch e: its sites meet. Throws when one does not (then recover()).
  void enter(std::uint64_t e, const detail::EpochRecord& r) {
    epoch_ = e, sites_ = r.sites, admitted_ = r.admitted;
    const auto me = std::find(sites_.begin(), sites_.end(), o_.site);
    rank_ = static_cast<int>(me - sites_.begin());
    GlooOptions g = o_.gloo;
    g.prefix += "/e" + std::to_string(e);
    comm_ = std::make_unique<GlooCommunicator>(rank_, size(), g);
  }

  // A restarted or new site: asks to join and waits for an epoch that admits it.
  void join() {
    std::uint64_t n = 0;
    while (!store_.add("join/" + std::to_string(n), std::to_string(o_.site) + ";" + o_.fingerprint)) ++n;
    const std::string key = "join/" + std::to_string(n);
    const auto deadline = Clock::now() + o_.join_timeout;
    for (std::uint64_t e = 0; Clock::now() < deadline;) {
      if (const auto why = store_.find(key + "/refused"))
        throw Error("ElasticGroup: site " + std::to_string(o_.site) + " refused by the run's sites: " + *why);
      if (const auto rec = store_.find("epoch/" + std::to_string(e))) {
        const auto r = detail::EpochRecord::parse(*rec);
        if (r.admitted > n && std::count(r.sites.begin(), r.sites.end(), o_.site) > 0) {
          if (store_.find("epoch/" + std::to_string(e + 1))) {
            ++e;
            continue;
          }
          try {
            enter(e, r);
          } catch (const Error&) {
            recover(-1);
          }
          return;
        }
        ++e;
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw Error("ElasticGroup: site " + std::to_string(o_.site) + " not admitted within " +
                std::to_string(o_.join_timeout.count()) + " ms (members admit sites at round boundaries)");
  }

  ElasticOptions o_;
  detail::MembershipStore store_;
  std::unique_ptr<GlooCommunicator> comm_;
  std::vector<int> sites_;
  std::uint64_t epoch_ = 0, admitted_ = 0;
  int rank_ = 0;
  bool newcomer_ = false;
};

static_assert(Communicator<ElasticGroup>);

}  // namespace dilocox
