// reference_trainer/world.hpp: the run's world, every rank of every cluster, for the few
// small agreements the ranks make as one: the start reports, the flags after each step,
// the checks and sums of the summary. One job (a single mpirun holds every cluster): the
// world is MPI_COMM_WORLD. One job per site (--site): the world is the sites' jobs, each
// over its own MPI, joined by a Gloo group of their first ranks (the leaders): a value is
// reduced in the job, exchanged between the leaders and broadcast back in the job.
// World rank = site x (ranks per job) + job rank, the layout's order (layout.hpp).
// Elastic sites (--elastic): the leaders meet in an ElasticGroup, whose members change
// between rounds; the values are then the current members', in site order.
// Not here: the communicators the training runs over (rank_comms.hpp, peer_comms.hpp).
#pragma once

#include <mpi.h>

#ifdef DILOCOX_TRAINER_GLOO
#include <dilocox/comm/elastic.hpp>
#include <dilocox/comm/gloo.hpp>
#endif
#include <dilocox/config.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace dilocox::trainer {

enum class ReduceOp { max, min, sum };

class World {
 public:
  // One job holds every rank.
  explicit World(MPI_Comm job) : job_(job) {
    MPI_Comm_rank(job_, &job_rank_);
    MPI_Comm_size(job_, &job_size_);
  }
#ifdef DILOCOX_TRAINER_GLOO
  // This job is site `site` of `sites`; its leader joins the other sites' leaders through
  // `gloo` (the store and prefix of the run). Every site's job must have as many ranks.
  World(MPI_Comm job, int site, int sites, const GlooOptions& gloo) : World(job) {
    site_ = site, sites_ = sites;
    std::string error;
    if (job_rank_ == 0) {
      try {
        leaders_ = std::make_unique<GlooCommunicator>(site, sites, gloo);
        const auto sizes = leaders_gather(std::span<const int>(&job_size_, 1));
        for (int s = 0; s < sites && error.empty(); ++s)
          if (sizes[static_cast<std::size_t>(s)] != job_size_)
            error = "site " + std::to_string(s) + " runs " + std::to_string(sizes[static_cast<std::size_t>(s)]) +
                    " rank(s), site " + std::to_string(site) + " runs " + std::to_string(job_size_) +
                    ": every site's job must have the same ranks (dp x stages)";
      } catch (const Error& e) {
        error = e.what();
      }
    }
    broadcast(error);
    if (error.find("earlier meeting") != std::string::npos) error += "; a relaunched run (--resume too) needs a new --run-id";
    if (!error.empty()) throw Error("the sites' rendezvous (" + gloo.store + ", run " + gloo.prefix + "): " + error);
  }

  // An elastic site (one rank a site): its leader joins the run's ElasticGroup (`group`).
  World(MPI_Comm job, int sites, const ElasticOptions& group) : World(job) {
    site_ = group.site, sites_ = sites;
    dilocox::detail::require(job_size_ == 1, "--elastic", "an elastic site is one rank (mpirun -np 1, --stages 1, --dp 1)");
    elastic_ = std::make_unique<ElasticGroup>(group);
  }
  ElasticGroup* elastic() { return elastic_.get(); }
#endif

  int rank() const { return site_ * job_size_ + job_rank_; }
  // The ranks taking part now: size(), or an elastic run's current members.
  int live_size() const { return leaders() * job_size_; }
  int size() const { return sites_ * job_size_; }
  MPI_Comm job() const { return job_; }  // this job's ranks (the whole world with one job)
  int job_rank() const { return job_rank_; }
  bool one_job() const { return sites_ == 1; }
  int site() const { return site_; }
  // The rank that prints what every operator should read: each job's first rank (world
  // rank 0 when one job holds the world).
  bool speaks() const { return job_rank_ == 0; }

  // v <- op over every rank's v, on every rank. T: int, double or std::uint64_t.
  template <class T>
  void allreduce(std::span<T> v, ReduceOp op) {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), mpi_type<T>(), mpi_op(op), job_);
    if (one_job()) return;
    if (job_rank_ == 0) {  // the same order of sites on every leader: the same result
      const auto all = leaders_gather(std::span<const T>(v));
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = all[i];
        for (std::size_t s = 1; s < static_cast<std::size_t>(leaders()); ++s) v[i] = combine(op, v[i], all[s * v.size() + i]);
      }
    }
    MPI_Bcast(v.data(), static_cast<int>(v.size()), mpi_type<T>(), 0, job_);
  }
  template <class T>
  T reduce(T v, ReduceOp op) {
    allreduce(std::span<T>(&v, 1), op);
    return v;
  }
  void barrier() { reduce(0, ReduceOp::max); }

  // Every rank's text, in world rank order, on every rank.
  std::vector<std::string> allgather(const std::string& mine) {
    std::string blob = job_gather(mine);  // the job's texts, length-prefixed (on job rank 0)
    if (!one_job() && job_rank_ == 0) blob = leaders_concat(blob);
    broadcast(blob);
    std::vector<std::string> out;
    for (std::size_t at = 0; at < blob.size();) {
      std::uint64_t n = 0;
      std::memcpy(&n, blob.data() + at, sizeof n);
      out.push_back(blob.substr(at + sizeof n, n));
      at += sizeof n + n;
    }
    return out;
  }

 private:
  template <class T>
  static MPI_Datatype mpi_type() {
    if constexpr (std::is_same_v<T, int>) return MPI_INT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else {
      static_assert(std::is_same_v<T, std::uint64_t>, "World::allreduce: int, double or std::uint64_t");
      return MPI_UINT64_T;
    }
  }
  // The leaders' group: the sites' fixed one, or the elastic group's current members.
  int leaders() const {
#ifdef DILOCOX_TRAINER_GLOO
    if (elastic_) return elastic_->size();
#endif
    return sites_;
  }
  static MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM; }
  template <class T>
  static T combine(ReduceOp op, T a, T b) {
    return op == ReduceOp::max ? std::max(a, b) : op == ReduceOp::min ? std::min(a, b) : a + b;
  }

  // Job rank 0's string reaches every rank of the job.
  void broadcast(std::string& s) {
    std::uint64_t n = s.size();
    MPI_Bcast(&n, 1, MPI_UINT64_T, 0, job_);
    s.resize(n);
    if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, job_);
  }

  // The job's texts on its rank 0, each as 8 bytes of length and the bytes.
  std::string job_gather(const std::string& mine) {
    std::string framed(sizeof(std::uint64_t), '\0');
    const std::uint64_t n = mine.size();
    std::memcpy(framed.data(), &n, sizeof n);
    framed += mine;
    const int len = static_cast<int>(framed.size());
    std::vector<int> lens(static_cast<std::size_t>(job_size_)), offsets(lens.size());
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, job_);
    int total = 0;
    for (std::size_t r = 0; r < lens.size(); ++r) offsets[r] = total, total += lens[r];
    std::string all(job_rank_ == 0 ? static_cast<std::size_t>(total) : 0, '\0');
    MPI_Gatherv(framed.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, job_);
    return all;
  }

#ifdef DILOCOX_TRAINER_GLOO
  void leaders_allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    if (elastic_)
      elastic_->allgather(send, recv);
    else
      leaders_->allgather(send, recv);
  }
  // Every leader's values, site after site (leaders only).
  template <class T>
  std::vector<T> leaders_gather(std::span<const T> mine) {
    std::vector<T> all(mine.size() * static_cast<std::size_t>(leaders()));
    leaders_allgather(std::as_bytes(mine), std::as_writable_bytes(std::span<T>(all)));
    return all;
  }
  // The leaders' blobs (of any sizes) concatenated in site order (leaders only).
  std::string leaders_concat(const std::string& mine) {
    const std::uint64_t n = mine.size();
    const auto sizes = leaders_gather(std::span<const std::uint64_t>(&n, 1));
    const std::uint64_t most = *std::max_element(sizes.begin(), sizes.end());
    std::string padded = mine;
    padded.resize(most);
    std::string all(most * static_cast<std::size_t>(leaders()), '\0');
    leaders_allgather(std::as_bytes(std::span<const char>(padded)), std::as_writable_bytes(std::span<char>(all)));
    std::string out;
    for (std::size_t s = 0; s < sizes.size(); ++s) out += all.substr(s * most, sizes[s]);
    return out;
  }
  std::unique_ptr<GlooCommunicator> leaders_;
  std::unique_ptr<ElasticGroup> elastic_;
#else
  template <class T>
  std::vector<T> leaders_gather(std::span<const T>) {
    return {};
  }
  std::string leaders_concat(const std::string& mine) { return mine; }
  std::unique_ptr<int> leaders_, elastic_;
#endif

  MPI_Comm job_;
  int job_rank_ = 0, job_size_ = 1, site_ = 0, sites_ = 1;
};

}  // namespace dilocox::trainer
