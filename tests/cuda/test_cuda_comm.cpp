// tests/cuda/test_cuda_comm.cpp (labels gpu, mpi; under mpiexec): HostStaged over
// MpiCommunicator with device buffers staged through pinned memory, and NcclCommunicator
// bootstrapped through MPI (needs one GPU per rank: skips when there are fewer).
// Every test skips cleanly without a CUDA device.
#include <dilocox/comm/host_staged.hpp>
#include <dilocox/comm/mpi.hpp>
#include <dilocox/comm/nccl.hpp>

#include <gtest/gtest.h>

#include <vector>

#include "gpu_test.hpp"

namespace dx = dilocox;
using dx::test::to_device;
using dx::test::to_host;

namespace {
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
std::vector<float> rank_values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * 0.5f + static_cast<float>(i % 97);
  return v;
}
}  // namespace

class CudaComm : public dx::test::GpuTest {};

TEST_F(CudaComm, HostStagedMpiReducesDeviceBuffers) {
  dx::MpiCommunicator mpi(MPI_COMM_WORLD);
  dx::HostStaged<dx::MpiCommunicator> staged(mpi, /*pass_through=*/false);
  const int r = world_rank(), k = world_size();
  const std::size_t n = 100003;
  const auto mine = rank_values(r, n);
  auto d = to_device<float>(std::span<const float>(mine));
  staged.allreduce_sum({d.data(), n});
  const auto sum = to_host(d.data(), n);
  for (std::size_t i = 0; i < n; i += 997) {
    float want = 0;
    for (int q = 0; q < k; ++q) want += rank_values(q, n)[i];
    ASSERT_FLOAT_EQ(sum[i], want) << "element " << i;
  }
  // allgather of bytes, and the async form.
  std::vector<std::byte> bytes(257, static_cast<std::byte>(r + 1));
  auto d_send = to_device<std::byte>(std::span<const std::byte>(bytes));
  dx::cuda::DeviceBuffer<std::byte> d_recv(bytes.size() * static_cast<std::size_t>(k));
  auto req = staged.iallgather({d_send.data(), bytes.size()}, {d_recv.data(), d_recv.size()});
  req.wait();
  const auto all = to_host(d_recv.data(), d_recv.size());
  for (int q = 0; q < k; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q) * bytes.size()], static_cast<std::byte>(q + 1));
}

TEST_F(CudaComm, NcclAllreduceAllgatherSendrecv) {
  int devices = 0;
  cudaGetDeviceCount(&devices);
  const int r = world_rank(), k = world_size();
  if (devices < k) GTEST_SKIP() << "NCCL needs one GPU per rank: " << devices << " device(s) for " << k << " ranks";
  dx::NcclCommunicator nccl(MPI_COMM_WORLD, r % devices);
  const std::size_t n = 4099;
  auto d = to_device<float>(std::span<const float>(rank_values(r, n)));
  nccl.allreduce_sum({d.data(), n});
  const auto sum = to_host(d.data(), n);
  float want = 0;
  for (int q = 0; q < k; ++q) want += rank_values(q, n)[5];
  EXPECT_FLOAT_EQ(sum[5], want);
  std::vector<std::byte> bytes(33, static_cast<std::byte>(r + 1));
  auto d_send = to_device<std::byte>(std::span<const std::byte>(bytes));
  dx::cuda::DeviceBuffer<std::byte> d_recv(bytes.size() * static_cast<std::size_t>(k)), d_one(bytes.size());
  nccl.allgather({d_send.data(), bytes.size()}, {d_recv.data(), d_recv.size()});
  const auto all = to_host(d_recv.data(), d_recv.size());
  for (int q = 0; q < k; ++q) EXPECT_EQ(all[static_cast<std::size_t>(q) * bytes.size()], static_cast<std::byte>(q + 1));
  nccl.sendrecv({d_send.data(), bytes.size()}, (r + 1) % k, {d_one.data(), bytes.size()}, (r + k - 1) % k);
  EXPECT_EQ(to_host(d_one.data(), 1)[0], static_cast<std::byte>((r + k - 1) % k + 1));
  nccl.barrier();
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  if (world_rank() != 0) {  // one report
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
