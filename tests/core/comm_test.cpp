// HostComm with 8 ranks: collectives equal the serial result, p2p delivers in order, errors abort.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "base/error.h"

namespace {

constexpr int kRanks = 8;

struct Ranks {
  std::vector<std::unique_ptr<stp::CpuDevice>> devs = stp::make_cpu_devices(kRanks);
  std::vector<std::unique_ptr<stp::Communicator>> comms = stp::make_host_comms(kRanks);
  std::vector<std::unique_ptr<stp::Stream>> streams;
  Ranks() {
    for (auto& d : devs) streams.push_back(d->create_stream("tp-comm"));
  }
  // Runs fn(rank) on one host thread per rank, as the executor does.
  template <typename F>
  void each(F fn) {
    std::vector<std::thread> ts;
    for (int r = 0; r < kRanks; ++r) ts.emplace_back([&fn, r] { fn(r); });
    for (auto& t : ts) t.join();
  }
};

// kRanks buffers of n values drawn uniformly from [lo, hi), rank after rank, from `seed`.
std::vector<std::vector<float>> random_buffers(std::size_t n, unsigned seed, float lo, float hi) {
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& v : data)
    for (auto& x : v) x = u(rng);
  return data;
}

// The serial reduction of the ranks' buffers, element by element in rank order:
// op(...op(op(data[0][i], data[1][i]), data[2][i])..., data[kRanks - 1][i]).
template <typename Op>
std::vector<float> serial_reduce(const std::vector<std::vector<float>>& data, Op op) {
  std::vector<float> out(data[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    float acc = data[0][i];
    for (int r = 1; r < kRanks; ++r) acc = op(acc, data[static_cast<std::size_t>(r)][i]);
    out[i] = acc;
  }
  return out;
}

// Every rank's buffer equals `expect`, element for element.
void expect_every_rank_holds(const std::vector<std::vector<float>>& data, const std::vector<float>& expect) {
  for (int r = 0; r < kRanks; ++r)
    for (std::size_t i = 0; i < expect.size(); ++i)
      ASSERT_EQ(data[static_cast<std::size_t>(r)][i], expect[i]) << r << " " << i;
}

TEST(HostComm, AllReduceEqualsSerialSumOnEveryRank) {
  Ranks g;
  const std::size_t n = 10007;  // not divisible by the rank count
  std::vector<std::vector<float>> data = random_buffers(n, 7, -1, 1);
  const std::vector<float> expect = serial_reduce(data, [](float a, float b) { return a + b; });
  g.each([&](int r) {
    auto& s = *g.streams[static_cast<std::size_t>(r)];
    g.comms[static_cast<std::size_t>(r)]->all_reduce_sum(s, data[static_cast<std::size_t>(r)].data(), n);
    s.synchronize();
  });
  ASSERT_NO_FATAL_FAILURE(expect_every_rank_holds(data, expect));
  EXPECT_EQ(g.comms[0]->bytes_sent(), n * sizeof(float));
}

// all_reduce_max leaves the elementwise maximum on every rank (negative values, -inf and uneven
// slices included), and is matched against sums by kind like every collective.
TEST(HostComm, AllReduceMaxIsTheElementwiseMaximumOnEveryRank) {
  Ranks g;
  const std::size_t n = 1001;  // not divisible by the rank count
  std::vector<std::vector<float>> data = random_buffers(n, 11, -5, -1);
  data[1][3] = -std::numeric_limits<float>::infinity();
  for (auto& v : data) v[7] = -std::numeric_limits<float>::infinity();  // every rank: stays -inf
  const std::vector<float> expect = serial_reduce(data, [](float a, float b) { return std::max(a, b); });
  g.each([&](int r) {
    auto& s = *g.streams[static_cast<std::size_t>(r)];
    g.comms[static_cast<std::size_t>(r)]->all_reduce_max(s, data[static_cast<std::size_t>(r)].data(), n);
    s.synchronize();
  });
  ASSERT_NO_FATAL_FAILURE(expect_every_rank_holds(data, expect));
  EXPECT_TRUE(std::isinf(expect[7]));
  EXPECT_EQ(g.comms[0]->bytes_sent(), n * sizeof(float));
}

// reduce_scatter_sum leaves the rank-order sum in each rank's own slice (bitwise the all-reduce
// there); all_gather then makes every rank's buffer the full sum. Uneven slices included.
TEST(HostComm, ReduceScatterThenAllGatherIsTheAllReduce) {
  Ranks g;
  for (std::size_t n : {std::size_t{3}, std::size_t{8}, std::size_t{10007}}) {
    std::vector<std::vector<float>> data = random_buffers(n, static_cast<unsigned>(n), -1, 1), reduced(kRanks);
    const std::vector<float> expect = serial_reduce(data, [](float a, float b) { return a + b; });
    std::vector<std::uint64_t> before(kRanks);
    for (int r = 0; r < kRanks; ++r)
      before[static_cast<std::size_t>(r)] = g.comms[static_cast<std::size_t>(r)]->bytes_sent();
    g.each([&](int r) {
      auto i = static_cast<std::size_t>(r);
      g.comms[i]->reduce_scatter_sum(*g.streams[i], data[i].data(), n);
      g.streams[i]->synchronize();
      reduced[i] = data[i];
      g.comms[i]->all_gather(*g.streams[i], data[i].data(), n);
      g.streams[i]->synchronize();
    });
    for (int r = 0; r < kRanks; ++r) {
      auto i = static_cast<std::size_t>(r);
      stp::CommSlice mine = stp::comm_slice(n, r, kRanks);
      for (std::size_t k = mine.first; k < mine.first + mine.count; ++k)
        ASSERT_EQ(reduced[i][k], expect[k]) << "reduce-scatter, rank " << r << " element " << k;
      for (std::size_t k = 0; k < n; ++k)
        ASSERT_EQ(data[i][k], expect[k]) << "all-gather, rank " << r << " element " << k;
      EXPECT_EQ(g.comms[i]->bytes_sent() - before[i], 2 * (n - mine.count) * sizeof(float));
    }
  }
}

// A bf16 all-gather copies each rank's slice (bits: distinct patterns per rank and element) into
// every rank's buffer, uneven slices included, and counts 2 bytes per element sent.
TEST(HostComm, Bf16AllGatherCopiesEverySliceBitForBit) {
  Ranks g;
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
    std::vector<std::vector<stp::bf16>> data(kRanks, std::vector<stp::bf16>(n));
    auto pattern = [](int r, std::size_t k) { return static_cast<std::uint16_t>(0x1234 + 977 * k + 31 * r); };
    for (int r = 0; r < kRanks; ++r)
      for (std::size_t k = 0; k < n; ++k) data[static_cast<std::size_t>(r)][k].bits = pattern(r, k);
    std::vector<std::uint64_t> before(kRanks);
    for (int r = 0; r < kRanks; ++r)
      before[static_cast<std::size_t>(r)] = g.comms[static_cast<std::size_t>(r)]->bytes_sent();
    g.each([&](int r) {
      auto i = static_cast<std::size_t>(r);
      g.comms[i]->all_gather_bf16(*g.streams[i], data[i].data(), n);
      g.streams[i]->synchronize();
    });
    for (int r = 0; r < kRanks; ++r) {
      auto i = static_cast<std::size_t>(r);
      for (int owner = 0; owner < kRanks; ++owner) {
        stp::CommSlice s = stp::comm_slice(n, owner, kRanks);
        for (std::size_t k = s.first; k < s.first + s.count; ++k)
          ASSERT_EQ(data[i][k].bits, pattern(owner, k)) << "rank " << r << " element " << k;
      }
      EXPECT_EQ(g.comms[i]->bytes_sent() - before[i], (n - stp::comm_slice(n, r, kRanks).count) * sizeof(stp::bf16));
    }
  }
}

TEST(HostComm, MismatchedCollectiveKindsAreAnError) {
  Ranks g;
  std::vector<std::vector<float>> data(kRanks, std::vector<float>(16, 1.0f));
  std::atomic<int> failed{0};
  g.each([&](int r) {
    auto i = static_cast<std::size_t>(r);
    if (r == 0) g.comms[i]->all_gather(*g.streams[i], data[i].data(), 16);
    else g.comms[i]->reduce_scatter_sum(*g.streams[i], data[i].data(), 16);
    try {
      g.streams[i]->synchronize();
    } catch (const stp::Error& e) {
      if (std::string(e.what()).find("all-gather") != std::string::npos) ++failed;
    }
  });
  EXPECT_EQ(failed.load(), kRanks);
}

TEST(HostComm, ManyAllReducesInARowStayMatched) {
  Ranks g;
  const int rounds = 50;
  std::vector<std::vector<float>> vals(kRanks, std::vector<float>(rounds));
  g.each([&](int r) {
    auto& s = *g.streams[static_cast<std::size_t>(r)];
    for (int k = 0; k < rounds; ++k) {
      vals[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)] = static_cast<float>(k * 100 + r);
      g.comms[static_cast<std::size_t>(r)]->all_reduce_sum(
          s, &vals[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)], 1);
    }
    s.synchronize();
  });
  for (int r = 0; r < kRanks; ++r)
    for (int k = 0; k < rounds; ++k)
      EXPECT_EQ(vals[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)],
                static_cast<float>(k * 100 * kRanks + 28));
}

// Every rank sends a sequence of tagged messages to every other rank over two streams (one for
// sends, one for receives, as the executor's p2p stream pairs do) and receives in order.
TEST(HostComm, InterleavedSendRecvDeliverInOrderWithoutDeadlock) {
  Ranks g;
  const int msgs = 20;
  std::vector<std::vector<int>> received(kRanks * kRanks, std::vector<int>(msgs, -1));
  std::vector<std::vector<int>> sent(kRanks * kRanks, std::vector<int>(msgs));
  g.each([&](int r) {
    auto& dev = *g.devs[static_cast<std::size_t>(r)];
    auto send_s = dev.create_stream("p2p-send");
    auto recv_s = dev.create_stream("p2p-recv");
    auto& comm = *g.comms[static_cast<std::size_t>(r)];
    for (int k = 0; k < msgs; ++k) {
      for (int step = 1; step < kRanks; ++step) {
        int to = (r + step) % kRanks, from = (r - step + kRanks) % kRanks;
        auto& out = sent[static_cast<std::size_t>(r * kRanks + to)][static_cast<std::size_t>(k)];
        out = r * 10000 + to * 100 + k;
        comm.send(*send_s, &out, sizeof(int), to, static_cast<std::uint32_t>(k));
        comm.recv(*recv_s, &received[static_cast<std::size_t>(from * kRanks + r)][static_cast<std::size_t>(k)],
                  sizeof(int), from, static_cast<std::uint32_t>(k));
      }
    }
    send_s->synchronize();
    recv_s->synchronize();
  });
  for (int a = 0; a < kRanks; ++a) {
    for (int b = 0; b < kRanks; ++b) {
      if (a == b) continue;
      for (int k = 0; k < msgs; ++k)
        EXPECT_EQ(received[static_cast<std::size_t>(a * kRanks + b)][static_cast<std::size_t>(k)],
                  a * 10000 + b * 100 + k);
    }
  }
}

TEST(HostComm, TagMismatchIsAnErrorNotSilentCorruption) {
  auto devs = stp::make_cpu_devices(2);
  auto comms = stp::make_host_comms(2);
  auto s0 = devs[0]->create_stream("p2p");
  auto s1 = devs[1]->create_stream("p2p");
  float x = 1, y = 0;
  comms[0]->send(*s0, &x, sizeof x, 1, /*tag=*/1);  // e.g. an activation
  comms[1]->recv(*s1, &y, sizeof y, 0, /*tag=*/2);  // but the receiver expects a gradient
  s0->synchronize();
  try {
    s1->synchronize();
    FAIL() << "mismatch not detected";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected message tag 2"), std::string::npos) << e.what();
  }
}

TEST(HostComm, AbortReleasesRanksWaitingInACollective) {
  auto devs = stp::make_cpu_devices(2);
  auto comms = stp::make_host_comms(2);
  auto s0 = devs[0]->create_stream("tp");
  float x = 1;
  comms[0]->all_reduce_sum(*s0, &x, 1);  // rank 1 never joins
  comms[1]->abort("rank 1 failed while loading data");
  try {
    s0->synchronize();
    FAIL() << "collective did not fail";
  } catch (const stp::CommunicatorAborted& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed while loading data"), std::string::npos) << e.what();
  }
}

TEST(HostComm, BarrierHoldsEveryRankUntilAllArrived) {
  Ranks g;
  std::atomic<int> arrived{0};
  std::vector<int> seen(kRanks, -1);
  g.each([&](int r) {
    auto& s = *g.streams[static_cast<std::size_t>(r)];
    s.enqueue_host([&, r] {
      std::this_thread::sleep_for(std::chrono::milliseconds(r));  // arrive at different times
      ++arrived;
    });
    g.comms[static_cast<std::size_t>(r)]->barrier(s);
    s.enqueue_host([&, r] { seen[static_cast<std::size_t>(r)] = arrived.load(); });
    s.synchronize();
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], kRanks);
}

}  // namespace
