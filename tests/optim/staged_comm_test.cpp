// StagedComm (optim/staged_comm.h): collectives through a device staging piece give the bits of the
// same collective on the host buffer itself (HostComm, three ranks so the slices are uneven), the
// device holds at most one piece, and with no communicator (a dry run) the pieces are allocated
// and copied alike while nothing is reduced.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "memory/block_arena.h"
#include "optim/staged_comm.h"

namespace {

constexpr int kRanks = 3;

// Values whose sums depend on the order of the additions (magnitudes from 1e-4 to 1e4).
std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(rank)) *
           std::pow(10.0f, static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 9) - 4.0f);
  return v;
}

struct Ranks {
  std::vector<std::unique_ptr<stp::CpuDevice>> devs = stp::make_cpu_devices(kRanks);
  std::vector<std::unique_ptr<stp::Communicator>> comms = stp::make_host_comms(kRanks);
  std::vector<std::unique_ptr<stp::Stream>> streams;
  // The caching arena training uses: a block is free for the next request once the host drops it
  // (stream-ordered by fences), so its peak is what the device holds at once.
  std::vector<std::unique_ptr<stp::BlockArena>> memory;
  std::vector<std::unique_ptr<stp::StagedComm>> staged;

  explicit Ranks(bool dry = false) {
    for (int r = 0; r < kRanks; ++r) {
      streams.push_back(devs[r]->create_stream("dp-comm"));
      memory.push_back(std::make_unique<stp::BlockArena>(*devs[r], *streams[r], stp::device_arena_options(*devs[r])));
      staged.push_back(std::make_unique<stp::StagedComm>(dry ? nullptr : comms[r].get(), *memory[r], r, kRanks));
    }
  }
  void synchronize() {
    for (auto& s : streams) s->synchronize();
  }
  std::size_t peak(int r) const { return memory[r]->stats().peak_allocated; }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(StagedComm, AllReduceInPiecesIsBitwiseTheDirectOne) {
  const std::size_t n = 1000, piece = 64;
  Ranks direct, staged;
  std::vector<std::vector<float>> want(kRanks), got(kRanks);
  for (int r = 0; r < kRanks; ++r) want[r] = got[r] = values(r, n);
  for (int r = 0; r < kRanks; ++r) {
    direct.comms[r]->all_reduce_sum(*direct.streams[r], want[r].data(), n);
    staged.staged[r]->all_reduce_sum(*staged.streams[r], got[r].data(), n, piece);
  }
  direct.synchronize();
  staged.synchronize();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(same_bits(got[r], want[r])) << "rank " << r;
    EXPECT_FALSE(same_bits(got[r], values(r, n))) << "rank " << r << ": nothing was reduced";
    const stp::StagedCommCounters& c = staged.staged[r]->counters();
    EXPECT_EQ(c.pieces, (n + piece - 1) / piece);
    EXPECT_EQ(c.largest_piece_bytes, piece * sizeof(float));
    EXPECT_EQ(c.h2d_bytes, n * sizeof(float));
    EXPECT_EQ(c.d2h_bytes, n * sizeof(float));
    EXPECT_EQ(staged.peak(r), piece * sizeof(float)) << "rank " << r << ": more than one piece at a time";
    EXPECT_GT(staged.peak(r), 0u);
  }
}

TEST(StagedComm, ReduceScatterLeavesTheDirectSumInTheOwnedSlice) {
  const std::size_t n = 1001;
  Ranks direct, staged;
  std::vector<std::vector<float>> want(kRanks), got(kRanks);
  for (int r = 0; r < kRanks; ++r) want[r] = got[r] = values(r, n);
  for (int r = 0; r < kRanks; ++r) {
    direct.comms[r]->reduce_scatter_sum(*direct.streams[r], want[r].data(), n);
    staged.staged[r]->reduce_scatter_sum(*staged.streams[r], got[r].data(), n);
  }
  direct.synchronize();
  staged.synchronize();
  for (int r = 0; r < kRanks; ++r) {
    const stp::CommSlice s = stp::comm_slice(n, r, kRanks);
    EXPECT_EQ(std::memcmp(got[r].data() + s.first, want[r].data() + s.first, s.count * sizeof(float)), 0)
        << "rank " << r;
    const std::vector<float> input = values(r, n);  // the other slices keep this rank's values
    EXPECT_EQ(std::memcmp(got[r].data(), input.data(), s.first * sizeof(float)), 0) << "rank " << r;
    EXPECT_EQ(staged.staged[r]->counters().d2h_bytes, s.count * sizeof(float));
    EXPECT_LE(staged.peak(r), n * sizeof(float) + 512) << "rank " << r;
  }
}

TEST(StagedComm, AllGatherIsBitwiseTheDirectOneInF32AndBf16) {
  const std::size_t n = 1001;
  Ranks direct, staged;
  std::vector<std::vector<float>> want(kRanks), got(kRanks);
  std::vector<std::vector<stp::bf16>> want16(kRanks), got16(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    // Each rank's own slice holds its values; the rest is stale (NaN), which the gather replaces.
    want[r].assign(n, std::nanf(""));
    const std::vector<float> v = values(r, n);
    const stp::CommSlice s = stp::comm_slice(n, r, kRanks);
    for (std::size_t i = s.first; i < s.first + s.count; ++i) want[r][i] = v[i];
    got[r] = want[r];
    for (float x : want[r]) want16[r].push_back(stp::from_f32<stp::bf16>(x));
    got16[r] = want16[r];
  }
  for (int r = 0; r < kRanks; ++r) {
    direct.comms[r]->all_gather(*direct.streams[r], want[r].data(), n);
    direct.comms[r]->all_gather_bf16(*direct.streams[r], want16[r].data(), n);
    staged.staged[r]->all_gather(*staged.streams[r], got[r].data(), n);
    staged.staged[r]->all_gather_bf16(*staged.streams[r], got16[r].data(), n);
  }
  direct.synchronize();
  staged.synchronize();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(same_bits(got[r], want[r])) << "rank " << r;
    EXPECT_EQ(std::memcmp(got16[r].data(), want16[r].data(), n * sizeof(stp::bf16)), 0) << "rank " << r;
    for (float x : got[r]) ASSERT_FALSE(std::isnan(x)) << "rank " << r;
  }
}

TEST(StagedComm, WithoutACommunicatorThePiecesAreAllocatedAndNothingIsReduced) {
  const std::size_t n = 1000, piece = 100;
  Ranks dry(/*dry=*/true);
  std::vector<float> v = values(0, n);
  dry.staged[0]->all_reduce_sum(*dry.streams[0], v.data(), n, piece);
  dry.staged[0]->reduce_scatter_sum(*dry.streams[0], v.data(), n);
  dry.synchronize();
  EXPECT_TRUE(same_bits(v, values(0, n)));
  EXPECT_EQ(dry.staged[0]->counters().pieces, n / piece + 1);
  EXPECT_EQ(dry.staged[0]->counters().largest_piece_bytes, n * sizeof(float));
}

}  // namespace
