// reference_trainer/site_uplink.hpp: the emulated link of a site, shared by its ranks.
// --wan-bandwidth is the capacity between two sites; every rank of a site that crosses it
// (each stage's copy, and each data-parallel shard) queues its bytes on one SharedUplink
// (dilocox/comm/throttled.hpp), whose clock is one word of MPI shared memory on the
// site's host. A site whose ranks span hosts shares it per host (what one machine can
// emulate); the start report says so. Not here: the throttling itself (ThrottledLink).
#pragma once

#include <dilocox/comm/throttled.hpp>

#include <cstdint>
#include <mpi.h>
#include <optional>

namespace dilocox::trainer {

class SiteUplink {
 public:
  // Collective over `site` (the site's ranks).
  explicit SiteUplink(MPI_Comm site) {
    MPI_Comm_split_type(site, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host_);
    int host_rank = 0, host_size = 0, site_size = 0;
    MPI_Comm_rank(host_, &host_rank);
    MPI_Comm_size(host_, &host_size);
    MPI_Comm_size(site, &site_size);
    sharers_ = host_size, spans_hosts_ = host_size < site_size;
    void* base = nullptr;
    MPI_Win_allocate_shared(host_rank == 0 ? sizeof(std::int64_t) : 0, sizeof(std::int64_t), MPI_INFO_NULL, host_,
                            &base, &win_);
    MPI_Aint bytes = 0;
    int unit = 0;
    MPI_Win_shared_query(win_, 0, &bytes, &unit, &base);
    word_ = static_cast<std::int64_t*>(base);
    if (host_rank == 0) *word_ = 0;  // the link is free: any past time
    MPI_Barrier(host_);
    uplink_.emplace(word_);
  }
  SiteUplink(const SiteUplink&) = delete;
  SiteUplink& operator=(const SiteUplink&) = delete;
  ~SiteUplink() {
    MPI_Win_free(&win_);
    MPI_Comm_free(&host_);
  }

  SharedUplink* uplink() { return &*uplink_; }
  int sharers() const { return sharers_; }         // ranks queueing on this uplink
  bool spans_hosts() const { return spans_hosts_; }  // the site has ranks on other hosts

 private:
  MPI_Comm host_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  std::int64_t* word_ = nullptr;
  std::optional<SharedUplink> uplink_;
  int sharers_ = 1;
  bool spans_hosts_ = false;
};

}  // namespace dilocox::trainer
