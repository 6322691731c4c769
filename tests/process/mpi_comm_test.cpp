// MpiComm and the MPI job (process/mpi/), four processes:
//   * all_reduce_sum is bitwise equal to HostComm's rank-order sum (inputs whose sum depends on
//     the order), for counts below, at and above the number of ranks; bytes_sent counts buffers;
//   * reduce_scatter_sum / all_gather: bitwise HostComm's sum in each slice, then everywhere;
//     all_gather_bf16 copies every slice's bits;
//   * a sub-group in reverse process order: send/recv deliver in order, any size (0 included);
//   * collectives issued on two streams of one communicator match in host issue order even when
//     the first stream is held back (the ticket order of mpi_comm.h);
//   * check_together fails on every process with the failing process's message; any() is an OR,
//     max() the largest value.
#include <algorithm>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "tests/process/mpi_env.h"

namespace {

using stp::testing::job;

// A value whose magnitude varies over 24 binades, so a sum of four depends on the order.
float value(int rank, std::size_t i) {
  std::uint64_t z = static_cast<std::uint64_t>(rank) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  z ^= z >> 29;
  double u = static_cast<double>(z >> 11) * 0x1.0p-53 * 2 - 1;
  return static_cast<float>(std::ldexp(u, static_cast<int>((z >> 5) % 24) - 12));
}

std::vector<int> everyone() { return {0, 1, 2, 3}; }

// HostComm's result for the same inputs: four CPU devices in this process.
std::vector<float> host_comm_sum(std::size_t count) {
  auto devs = stp::make_cpu_devices(4);
  auto comms = stp::make_host_comms(4);
  std::vector<std::unique_ptr<stp::Stream>> streams;
  std::vector<std::vector<float>> data(4);
  for (int r = 0; r < 4; ++r) {
    streams.push_back(devs[static_cast<std::size_t>(r)]->create_stream("s"));
    for (std::size_t i = 0; i < count; ++i) data[static_cast<std::size_t>(r)].push_back(value(r, i));
    comms[static_cast<std::size_t>(r)]->all_reduce_sum(*streams.back(), data[static_cast<std::size_t>(r)].data(),
                                                       count);
  }
  for (auto& s : streams) s->synchronize();
  return data[0];
}

TEST(MpiComm, AllReduceIsBitwiseHostCommsRankOrderSum) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm(everyone(), *devs[0]);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), job().rank());
  EXPECT_EQ(comm->size(), 4);
  auto stream = devs[0]->create_stream("s");
  std::uint64_t bytes = 0;
  bool order_matters = false;
  for (std::size_t count :
       {std::size_t{1}, std::size_t{3}, std::size_t{4}, std::size_t{5}, std::size_t{1000}, std::size_t{4099}}) {
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = value(job().rank(), i);
    comm->all_reduce_sum(*stream, mine.data(), count);
    bytes += count * sizeof(float);
    stream->synchronize();
    std::vector<float> want = host_comm_sum(count);
    EXPECT_EQ(std::memcmp(mine.data(), want.data(), count * sizeof(float)), 0) << count << " elements";
    for (std::size_t i = 0; i < count; ++i) {
      float reverse = ((value(3, i) + value(2, i)) + value(1, i)) + value(0, i);
      order_matters = order_matters || reverse != want[i];
    }
  }
  EXPECT_TRUE(order_matters) << "the inputs do not distinguish summation orders; the test proves nothing";
  EXPECT_EQ(comm->bytes_sent(), bytes);
}

// all_reduce_max: the elementwise maximum over the processes, on every process.
TEST(MpiComm, AllReduceMaxIsTheElementwiseMaximum) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm(everyone(), *devs[0]);
  ASSERT_NE(comm, nullptr);
  auto stream = devs[0]->create_stream("s");
  const std::size_t count = 1001;
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = value(job().rank(), i);
  comm->all_reduce_max(*stream, mine.data(), count);
  stream->synchronize();
  for (std::size_t i = 0; i < count; ++i) {
    float want = value(0, i);
    for (int r = 1; r < 4; ++r) want = std::max(want, value(r, i));
    ASSERT_EQ(mine[i], want) << i;
  }
  EXPECT_EQ(comm->bytes_sent(), count * sizeof(float));
}

// reduce_scatter_sum leaves HostComm's rank-order sum in this rank's slice; all_gather then
// gives every process the whole sum.
TEST(MpiComm, ReduceScatterAndAllGatherAreBitwiseHostComms) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm(everyone(), *devs[0]);
  ASSERT_NE(comm, nullptr);
  auto stream = devs[0]->create_stream("s");
  std::uint64_t bytes = 0;
  for (std::size_t count : {std::size_t{3}, std::size_t{4}, std::size_t{4099}}) {
    std::vector<float> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = value(job().rank(), i);
    comm->reduce_scatter_sum(*stream, mine.data(), count);
    stream->synchronize();
    std::vector<float> want = host_comm_sum(count);
    stp::CommSlice s = stp::comm_slice(count, job().rank(), 4);
    if (s.count) {
      EXPECT_EQ(std::memcmp(mine.data() + s.first, want.data() + s.first, s.count * sizeof(float)), 0)
          << count << " elements";
    }
    comm->all_gather(*stream, mine.data(), count);
    stream->synchronize();
    EXPECT_EQ(std::memcmp(mine.data(), want.data(), count * sizeof(float)), 0) << count << " elements";
    bytes += 2 * (count - s.count) * sizeof(float);
  }
  EXPECT_EQ(comm->bytes_sent(), bytes);
}

// all_gather_bf16 copies every process's slice bit for bit (patterns distinct per process and
// element), uneven slices included, and counts 2 bytes per element sent.
TEST(MpiComm, Bf16AllGatherCopiesEverySliceBitForBit) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm(everyone(), *devs[0]);
  ASSERT_NE(comm, nullptr);
  auto stream = devs[0]->create_stream("s");
  auto pattern = [](int r, std::size_t k) { return static_cast<std::uint16_t>(0x4321 + 613 * k + 17 * r); };
  std::uint64_t bytes = 0;
  for (std::size_t count : {std::size_t{3}, std::size_t{4}, std::size_t{4099}}) {
    std::vector<stp::bf16> data(count);
    for (std::size_t k = 0; k < count; ++k) data[k].bits = pattern(job().rank(), k);
    comm->all_gather_bf16(*stream, data.data(), count);
    stream->synchronize();
    for (int owner = 0; owner < 4; ++owner) {
      stp::CommSlice s = stp::comm_slice(count, owner, 4);
      for (std::size_t k = s.first; k < s.first + s.count; ++k)
        ASSERT_EQ(data[k].bits, pattern(owner, k)) << count << " elements, element " << k;
    }
    bytes += (count - stp::comm_slice(count, job().rank(), 4).count) * sizeof(stp::bf16);
  }
  EXPECT_EQ(comm->bytes_sent(), bytes);
}

TEST(MpiComm, SubGroupSendRecvInOrderAnySize) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm({3, 1}, *devs[0]);  // group rank 0 = process 3
  const int me = job().rank();
  if (me == 0 || me == 2) {
    EXPECT_EQ(comm, nullptr);
    return;
  }
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), me == 3 ? 0 : 1);
  auto stream = devs[0]->create_stream("p2p");
  const std::vector<std::size_t> sizes = {0, 1, 4096, 100000, 7};
  std::vector<std::vector<char>> out(sizes.size()), in(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    out[k].assign(sizes[k], static_cast<char>('a' + k + static_cast<std::size_t>(me)));
    in[k].assign(sizes[k], 0);
  }
  const int peer = 1 - comm->rank();
  // Both send everything first (buffered sends never wait for the receiver), then receive.
  for (std::size_t k = 0; k < sizes.size(); ++k)
    comm->send(*stream, out[k].data(), sizes[k], peer, static_cast<std::uint32_t>(100 + k));
  for (std::size_t k = 0; k < sizes.size(); ++k)
    comm->recv(*stream, in[k].data(), sizes[k], peer, static_cast<std::uint32_t>(100 + k));
  stream->synchronize();
  const int other = me == 3 ? 1 : 3;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    EXPECT_EQ(in[k], std::vector<char>(sizes[k], static_cast<char>('a' + k + static_cast<std::size_t>(other))))
        << "message " << k;
  std::uint64_t sent = 0;
  for (auto n : sizes) sent += n;
  EXPECT_EQ(comm->bytes_sent(), sent);
}

TEST(MpiComm, CollectivesOnTwoStreamsMatchInIssueOrder) {
  auto devs = stp::make_cpu_devices(1);
  auto comm = job().make_comm(everyone(), *devs[0]);
  auto a = devs[0]->create_stream("a");
  auto b = devs[0]->create_stream("b");
  const int me = job().rank();
  std::vector<float> x(64, static_cast<float>(me + 1)), y(3, static_cast<float>(10 * (me + 1)));
  // Stream a is held back for a different time on every process; b's all-reduce was issued
  // second and must not overtake a's anywhere (it would pair with another process's first).
  a->enqueue_host([me] { std::this_thread::sleep_for(std::chrono::milliseconds(20 * (3 - me))); });
  comm->all_reduce_sum(*a, x.data(), x.size());
  comm->all_reduce_sum(*b, y.data(), y.size());
  a->synchronize();
  b->synchronize();
  EXPECT_EQ(x, std::vector<float>(64, 10.0f));
  EXPECT_EQ(y, std::vector<float>(3, 100.0f));
}

TEST(MpiJob, CheckTogetherFailsOnEveryProcessWithTheFailingMessage) {
  const int me = job().rank();
  try {
    job().check_together([&] { STP_CHECK(me != 2, "bad value on process two"); });
    ADD_FAILURE() << "no process failed";
  } catch (const stp::JobError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("bad value on process two"), std::string::npos) << what;
    if (me != 2) {
      EXPECT_NE(what.find("process 2 failed"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(job().check_together([] {}));
  EXPECT_TRUE(job().any(me == 1));
  EXPECT_FALSE(job().any(false));
  EXPECT_EQ(job().max(me == 2 ? 15 : me == 3 ? 1 : 0), 15) << "the largest value, whichever process holds it";
  EXPECT_EQ(job().max(0), 0);
  EXPECT_EQ(job().node_rank(), me) << "one node: node rank = world rank";
}

// memory.host_budget: auto divides the machine among the job's processes on this host, as the
// launcher announces them before MPI starts: all four here (one node).
TEST(MpiJob, ProcessesOnThisHostAreTheLaunchersLocalCount) {
  EXPECT_EQ(stp::processes_on_this_host(), job().size());
}

}  // namespace
