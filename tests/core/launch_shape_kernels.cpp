// Launch shapes (core/launch_shape.h) on every available device kind: each launch covers its
// iteration exactly once, in parts of the layout the stream's backend promises (whole rows and runs
// of cpu_run elements on a CPU stream; one element per thread, one warp per reduced row on CUDA).
// Each task records its part in device memory and the host checks the parts. The reduction shapes
// (RowReduce, ColumnSlices) are also checked against a plain scalar reference that spells out the
// canonical order of core/reduce_order.h on its own: bitwise, for several CPU thread counts and
// grains. This file is compiled by nvcc when the CUDA backend is built (name ends in
// _kernels.cpp), so the functors below run on the GPU there.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/launch_shape.h"
#include "tests/support/devices.h"

namespace {

using stp::DeviceKind;
using i64 = std::int64_t;

// parts[3 task ..] = {row, begin, size} of the task's part.
struct RecordRowParts {
  stp::RowSegments seg;
  i64* parts;
  STP_HD void operator()(std::size_t i) const {
    const stp::RowSegments::Part p = seg.part(i);
    parts[3 * i] = p.row, parts[3 * i + 1] = p.begin, parts[3 * i + 2] = p.size;
  }
};

// parts[3 task ..] = {row, lane, 0} of the task's part.
struct RecordRowReduceParts {
  stp::RowReduce rows;
  i64* parts;
  STP_HD void operator()(std::size_t i) const {
    const stp::RowReduce::Part p = rows.part(i);
    parts[3 * i] = p.row, parts[3 * i + 1] = p.lane, parts[3 * i + 2] = 0;
  }
};

struct RecordElementParts {
  stp::ElementRuns runs;
  i64* parts;
  STP_HD void operator()(std::size_t i) const {
    const stp::ElementRuns::Part p = runs.part(i);
    parts[3 * i] = 0, parts[3 * i + 1] = p.begin, parts[3 * i + 2] = p.size;
  }
};

struct Part {
  i64 row, begin, size;
};

// A RowBlock program (core/launch_shape.h) that needs its barriers and its per-thread values: block
// b stages x[b*N .. b*N + N) in shared memory, thread t keeping its own x as well; after the
// barrier thread t writes out[b*N + t] = staged[N - 1 - t] - own, 1000 * b + (N - 1 - t) - (1000 * b
// + t) for x[i] = i's block-and-thread code. A missing barrier or a lost PerThread value reads another
// thread's element or garbage.
template <typename Block>
struct ReverseInBlocks {
  const float* x;
  float* out;
  STP_HD void operator()(std::size_t b) const {
    constexpr int N = Block::threads;
    STP_BLOCK_SHARED float staged[N];
    stp::PerThread<float, N> own;
    const auto base = static_cast<i64>(b) * N;
    Block::phase([&](int t) {
      staged[t] = x[base + t];
      own[t] = x[base + t];
    });
    Block::phase([&](int t) { out[base + t] = staged[N - 1 - t] - own[t]; });
  }
};

// Launches `shape` with `record` on a fresh stream of `d` and returns every task's part. A task the
// launch skipped keeps the marker -1 in all three fields.
template <typename Shape, typename Record>
std::vector<Part> run_parts(stp::Device& d, const Shape& shape, Record record) {
  auto s = d.create_stream("compute");
  const std::size_t tasks = shape.tasks();
  std::vector<i64> host(3 * tasks, -1);
  i64* dev = tasks ? static_cast<i64*>(d.allocate(host.size() * sizeof(i64))) : nullptr;
  if (tasks) s->copy(dev, host.data(), host.size() * sizeof(i64));
  record.parts = dev;
  stp::launch(*s, shape, record, 1);
  if (tasks) s->copy(host.data(), dev, host.size() * sizeof(i64));
  s->synchronize();
  if (dev) d.deallocate(dev);
  std::vector<Part> parts(tasks);
  for (std::size_t t = 0; t < tasks; ++t) parts[t] = {host[3 * t], host[3 * t + 1], host[3 * t + 2]};
  return parts;
}

// Every index of rows x len is in exactly one part; every part is a non-empty range inside its row.
void expect_exact_cover(const std::vector<Part>& parts, i64 rows, i64 len) {
  std::vector<int> hits(static_cast<std::size_t>(rows * len), 0);
  for (std::size_t t = 0; t < parts.size(); ++t) {
    const Part& p = parts[t];
    ASSERT_TRUE(p.row >= 0 && p.row < rows && p.begin >= 0 && p.size >= 1 && p.begin + p.size <= len)
        << "task " << t << ": row " << p.row << ", [" << p.begin << ", " << p.begin + p.size << ") of " << rows
        << " rows of " << len;
    for (i64 e = p.begin; e < p.begin + p.size; ++e) ++hits[static_cast<std::size_t>(p.row * len + e)];
  }
  for (std::size_t x = 0; x < hits.size(); ++x) ASSERT_EQ(hits[x], 1) << "index " << x;
}

class LaunchShape : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(LaunchShape, RowWiseCoversEveryElementOnceWholeRowsPerCpuTaskOneElementPerGpuThread) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  for (const auto& [rows, len] : std::vector<std::pair<i64, i64>>{{7, 1000}, {3, 1}, {1, 4097}, {4, 0}, {0, 9}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows of " << len);
    const stp::RowSegments seg = stp::row_wise(*s, rows, len);
    EXPECT_EQ(seg.rows, rows);
    EXPECT_EQ(seg.len, len);
    const std::vector<Part> parts = run_parts(d, seg, RecordRowParts{seg, nullptr});
    expect_exact_cover(parts, rows, len);
    if (GetParam() == DeviceKind::Cpu) {  // one task per whole row, rows in task order
      ASSERT_EQ(parts.size(), static_cast<std::size_t>(len > 0 ? rows : 0));
      for (std::size_t t = 0; t < parts.size(); ++t) {
        EXPECT_EQ(parts[t].row, static_cast<i64>(t));
        EXPECT_EQ(parts[t].begin, 0);
        EXPECT_EQ(parts[t].size, len);
      }
    } else {  // one element per thread: adjacent threads, adjacent elements
      ASSERT_EQ(parts.size(), static_cast<std::size_t>(rows * len));
      for (std::size_t t = 0; t < parts.size(); ++t) {
        EXPECT_EQ(parts[t].row * len + parts[t].begin, static_cast<i64>(t));
        EXPECT_EQ(parts[t].size, 1);
      }
    }
  }
}

TEST_P(LaunchShape, RowReduceHasOneCpuTaskPerRowAndOneWarpPerGpuRow) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  for (const i64 rows : {i64{7}, i64{1}, i64{0}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const stp::RowReduce rr = stp::row_reduce(*s, rows);
    EXPECT_EQ(rr.rows, rows);
    const i64 lanes = GetParam() == DeviceKind::Cpu ? 1 : stp::RowReduce::kWarp;
    EXPECT_EQ(rr.lanes, lanes);
    const std::vector<Part> parts = run_parts(d, rr, RecordRowReduceParts{rr, nullptr});
    ASSERT_EQ(parts.size(), static_cast<std::size_t>(rows * lanes));
    for (std::size_t t = 0; t < parts.size(); ++t) {  // task t: lane t % lanes of row t / lanes
      EXPECT_EQ(parts[t].row, static_cast<i64>(t) / lanes);
      EXPECT_EQ(parts[t].begin, static_cast<i64>(t) % lanes);
    }
  }
}

TEST_P(LaunchShape, ColumnSumsHaveBlocksOf16ColumnsPerCpuTaskAndABlockOf32PerGpuGroup) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto s = devs[0]->create_stream("compute");
  for (const i64 columns : {i64{37}, i64{16}, i64{1}, i64{0}}) {
    const stp::ColumnSlices cols = stp::column_sums(*s, columns, 5);
    EXPECT_EQ(cols.columns, columns);
    EXPECT_EQ(cols.height, 5);
    if (GetParam() == DeviceKind::Cpu) EXPECT_EQ(cols.tasks(), static_cast<std::size_t>((columns + 15) / 16));
    else EXPECT_EQ(cols.tasks(), static_cast<std::size_t>((columns + 31) / 32) * stp::kGpuBlockThreads);
  }
}

// ---- Reductions against the canonical order, spelled out here ----------------------------------------

// Row order: partial j adds terms j, j + 32, ... from 0.0f; then the steps 16, 8, 4, 2, 1.
float reference_tree(std::vector<float> p) {
  for (std::size_t step = 16; step >= 1; step /= 2)
    for (std::size_t j = 0; j < step; ++j) p[j] = p[j] + p[j + step];
  return p[0];
}

float reference_row_sum(const float* x, i64 n) {
  std::vector<float> p(32, 0.0f);
  for (i64 c = 0; c < n; ++c) p[static_cast<std::size_t>(c % 32)] += x[c];
  return reference_tree(p);
}

// Column order: 32 slices [s h / 32, (s + 1) h / 32), each from 0.0f in row order; then the tree.
float reference_column_sum(const float* x, i64 height, i64 columns, i64 c, float factor) {
  std::vector<float> p(32, 0.0f);
  for (i64 s = 0; s < 32; ++s)
    for (i64 n = s * height / 32; n < (s + 1) * height / 32; ++n)
      p[static_cast<std::size_t>(s)] += factor * x[n * columns + c];
  return reference_tree(p);
}

// Per row: out[3 row] = sum of x, out[3 row + 1] = max of x, out[3 row + 2] = sum of x written
// back doubled through the sum's term; each() adds one to hits[c] of its row (every element once).
struct RowReduceProbe {
  float* x;
  float* out;
  float* hits;
  i64 len;
  stp::RowReduce rows;
  STP_HD void operator()(std::size_t task) const {
    const stp::RowReduce::Part p = rows.part(task);
    float* r = x + p.row * len;
    float* h = hits + p.row * len;
    const float sum = rows.sum(p, len, [&](i64 c) { return r[c]; });
    const float mx = rows.max(p, len, [&](i64 c) { return r[c]; });
    rows.each(p, len, [&](i64 c) { h[c] += 1.0f; });
    const float again = rows.sum(p, len, [&](i64 c) {
      const float v = r[c];
      r[c] = 2.0f * v;
      return v;
    });
    if (rows.leader(p)) out[3 * p.row] = sum, out[3 * p.row + 1] = mx, out[3 * p.row + 2] = again;
  }
};

// Per column c: sums[2 c] += sum of x, sums[2 c + 1] += sum of 0.5 x (exact products, so no fused
// multiply-add can change a term); count[c] += 1 per store.
struct ColumnSumsProbe {
  float* sums;
  float* count;
  const float* x;
  stp::ColumnSlices cols;
  STP_HD void operator()(std::size_t task) const {
    const i64 C = cols.columns;
    cols.reduce<2>(
        task,
        [&](i64 n, i64 c, float(&v)[2]) {
          v[0] = x[n * C + c];
          v[1] = 0.5f * x[n * C + c];
        },
        [&](i64 c, const float(&total)[2]) {
          sums[2 * c] += total[0];
          sums[2 * c + 1] += total[1];
          count[c] += 1.0f;
        });
  }
};

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);  // mixed signs: the order shows in the bits
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
  return v;
}

float* to_device(stp::Device& d, stp::Stream& s, const std::vector<float>& v) {
  float* p = static_cast<float*>(d.allocate(std::max<std::size_t>(v.size(), 1) * sizeof(float)));
  if (!v.empty()) s.copy(p, v.data(), v.size() * sizeof(float));
  s.synchronize();  // v may be a temporary
  return p;
}

std::vector<float> to_host(stp::Stream& s, const float* p, std::size_t n) {
  std::vector<float> v(n);
  if (n) s.copy(v.data(), p, n * sizeof(float));
  s.synchronize();
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST_P(LaunchShape, RowReduceIsTheCanonicalOrderBitwiseForEveryThreadCountAndGrain) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  for (const auto& [rows, len] :
       std::vector<std::pair<i64, i64>>{{5, 1000}, {3, 1}, {2, 31}, {2, 32}, {3, 33}, {1, 151936 / 8}, {4, 0}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows of " << len);
    const std::vector<float> x = random_floats(static_cast<std::size_t>(rows * len), static_cast<std::uint32_t>(len));
    for (const int threads : {1, 2, 3})
      for (const std::size_t grain : {std::size_t{1}, std::size_t{2}, std::size_t{1000}}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, grain " << grain);
        tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
        auto s = d.create_stream("compute");
        const stp::RowReduce rr = stp::row_reduce(*s, rows);
        float* dx = to_device(d, *s, x);
        float* dout = to_device(d, *s, std::vector<float>(static_cast<std::size_t>(3 * rows), -1.0f));
        float* dhits = to_device(d, *s, std::vector<float>(x.size(), 0.0f));
        stp::launch(*s, rr, RowReduceProbe{dx, dout, dhits, len, rr}, grain);
        const std::vector<float> out = to_host(*s, dout, static_cast<std::size_t>(3 * rows));
        const std::vector<float> hits = to_host(*s, dhits, x.size());
        const std::vector<float> doubled = to_host(*s, dx, x.size());
        for (void* p : {static_cast<void*>(dx), static_cast<void*>(dout), static_cast<void*>(dhits)}) d.deallocate(p);
        for (i64 r = 0; r < rows; ++r) {
          const float* xr = x.data() + r * len;
          const float want = reference_row_sum(xr, len);
          float want_max = -INFINITY;
          for (i64 c = 0; c < len; ++c) want_max = std::max(want_max, xr[c]);
          EXPECT_TRUE(same_bits(out[3 * r], want)) << "row " << r << ": " << out[3 * r] << " want " << want;
          EXPECT_TRUE(same_bits(out[3 * r + 1], want_max)) << "row " << r << " max " << out[3 * r + 1];
          EXPECT_TRUE(same_bits(out[3 * r + 2], want)) << "row " << r << " again " << out[3 * r + 2];
        }
        for (std::size_t e = 0; e < x.size(); ++e) {
          ASSERT_EQ(hits[e], 1.0f) << "element " << e << " visited " << hits[e] << " times by each()";
          ASSERT_EQ(doubled[e], 2.0f * x[e]) << "element " << e << " written by sum()'s term other than once";
        }
      }
  }
}

TEST_P(LaunchShape, ColumnSumsAreTheCanonicalOrderBitwiseForEveryThreadCountAndGrain) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  for (const auto& [columns, height] :
       std::vector<std::pair<i64, i64>>{{37, 1000}, {16, 3}, {1, 31}, {17, 32}, {33, 33}, {64, 4096}, {5, 0}, {0, 7}}) {
    SCOPED_TRACE(::testing::Message() << columns << " columns of height " << height);
    const std::vector<float> x =
        random_floats(static_cast<std::size_t>(columns * height), static_cast<std::uint32_t>(columns + height));
    for (const int threads : {1, 2, 3})
      for (const std::size_t grain : {std::size_t{1}, std::size_t{2}, std::size_t{1000}}) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, grain " << grain);
        tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
        auto s = d.create_stream("compute");
        const stp::ColumnSlices cols = stp::column_sums(*s, columns, height);
        float* dx = to_device(d, *s, x);
        float* dsums = to_device(d, *s, std::vector<float>(static_cast<std::size_t>(2 * columns), 0.0f));
        float* dcount = to_device(d, *s, std::vector<float>(static_cast<std::size_t>(columns), 0.0f));
        stp::launch(*s, cols, ColumnSumsProbe{dsums, dcount, dx, cols}, grain);
        const std::vector<float> sums = to_host(*s, dsums, static_cast<std::size_t>(2 * columns));
        const std::vector<float> count = to_host(*s, dcount, static_cast<std::size_t>(columns));
        for (void* p : {static_cast<void*>(dx), static_cast<void*>(dsums), static_cast<void*>(dcount)}) d.deallocate(p);
        for (i64 c = 0; c < columns; ++c) {
          ASSERT_EQ(count[c], 1.0f) << "column " << c << " stored " << count[c] << " times";
          // 0.0f + the sum: the probe accumulates onto zeros, as a gradient accumulates onto its buffer
          const float want = 0.0f + reference_column_sum(x.data(), height, columns, c, 1.0f);
          const float want_half = 0.0f + reference_column_sum(x.data(), height, columns, c, 0.5f);
          EXPECT_TRUE(same_bits(sums[2 * c], want)) << "column " << c << ": " << sums[2 * c] << " want " << want;
          EXPECT_TRUE(same_bits(sums[2 * c + 1], want_half)) << "column " << c << ": " << sums[2 * c + 1];
        }
      }
  }
}

TEST_P(LaunchShape, ElementWiseCoversEveryElementOnceInCpuRunsOnePerGpuThread) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  constexpr i64 kRun = 1024;
  for (const i64 n : {i64{10000}, kRun, i64{1}, i64{0}}) {
    SCOPED_TRACE(::testing::Message() << n << " elements");
    const stp::ElementRuns runs = stp::element_wise(*s, n, kRun);
    const std::vector<Part> parts = run_parts(d, runs, RecordElementParts{runs, nullptr});
    expect_exact_cover(parts, 1, n);
    const i64 run = GetParam() == DeviceKind::Cpu ? kRun : 1;
    EXPECT_EQ(runs.run, run);
    EXPECT_EQ(runs.grain(2048), static_cast<std::size_t>(GetParam() == DeviceKind::Cpu ? 2 : 2048));
    EXPECT_EQ(runs.grain(1), 1u);
    ASSERT_EQ(parts.size(), static_cast<std::size_t>((n + run - 1) / run));
    for (std::size_t t = 0; t < parts.size(); ++t) {  // run t starts at t * run; only the last is shorter
      EXPECT_EQ(parts[t].begin, static_cast<i64>(t) * run);
      EXPECT_EQ(parts[t].size, t + 1 < parts.size() ? run : n - static_cast<i64>(t) * run);
    }
  }
}

TEST_P(LaunchShape, RowTilesHandTheBodyOneTileOfCpuRowsOnACpuStreamAndABlockOnAGpu) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto s = devs[0]->create_stream("compute");
  int calls = 0, rows = 0;
  bool host = false;
  stp::row_tiles<8>(*s, [&](auto tile) {
    ++calls;
    rows = decltype(tile)::rows;
    host = decltype(tile)::host_tasks;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(rows, GetParam() == DeviceKind::Cpu ? 8 : stp::kRowBlockThreads);
  EXPECT_EQ(host, GetParam() == DeviceKind::Cpu);
  {
    // A test may ask a CPU stream for the CUDA layout, emulated; only while the guard lives.
    stp::EmulatedRowBlocks emulate;
    stp::row_tiles<8>(*s, [&](auto tile) {
      rows = decltype(tile)::rows;
      host = decltype(tile)::host_tasks;
    });
    EXPECT_EQ(rows, stp::kRowBlockThreads);
    EXPECT_FALSE(host);
  }
  stp::row_tiles<8>(*s, [&](auto tile) { host = decltype(tile)::host_tasks; });
  EXPECT_EQ(host, GetParam() == DeviceKind::Cpu);
}

// RowBlock's phases: every thread of a block finishes a phase before any starts the next, its
// PerThread value survives the barrier, and every block runs (emulated thread by thread on a CPU
// stream, a real block of threads on CUDA).
TEST_P(LaunchShape, RowBlockPhasesMeetAtBarriersAndKeepPerThreadValues) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  using Block = stp::RowBlock<stp::kRowBlockThreads>;
  constexpr i64 N = Block::threads, blocks = 5;
  std::vector<float> x(blocks * N), out(blocks * N, -1.0f);
  for (i64 b = 0; b < blocks; ++b)
    for (i64 t = 0; t < N; ++t) x[b * N + t] = static_cast<float>(1000 * b + t);
  auto* dx = static_cast<float*>(d.allocate(x.size() * sizeof(float)));
  auto* dout = static_cast<float*>(d.allocate(out.size() * sizeof(float)));
  s->copy(dx, x.data(), x.size() * sizeof(float));
  s->copy(dout, out.data(), out.size() * sizeof(float));
  stp::launch(*s, Block::blocks(blocks), ReverseInBlocks<Block>{dx, dout}, 1);
  s->copy(out.data(), dout, out.size() * sizeof(float));
  s->synchronize();
  d.deallocate(dx);
  d.deallocate(dout);
  for (i64 b = 0; b < blocks; ++b)
    for (i64 t = 0; t < N; ++t)
      EXPECT_EQ(out[b * N + t], static_cast<float>(N - 1 - 2 * t)) << "block " << b << ", thread " << t;
}

// A row's bucket as the embedding gradient keys it: its token's entry in the shard [v0, v0 + buckets),
// or buckets (none) for a token of another shard.
struct ShardBucket {
  const std::int32_t* tokens;
  i64 v0, buckets;
  STP_HD i64 bucket(i64 n) const {
    const i64 r = static_cast<i64>(tokens[n]) - v0;
    return r >= 0 && r < buckets ? r : buckets;
  }
};

// Both layouts of StableBuckets (the CPU's counting sort and the GPU's rank rows and binary search,
// each run on this stream whatever its backend) and the factory's give the buckets of a stable sort
// by bucket, integer for integer.
TEST_P(LaunchShape, StableBucketsAreAStableSortByBucketInEitherLayout) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  struct Case {
    const char* what;
    i64 rows, buckets, v0, token_lo, token_hi;  // tokens uniform in [token_lo, token_hi]
  };
  for (const Case& c : std::vector<Case>{{"many repeats", 1000, 7, 0, 0, 6},
                                         {"one key", 513, 50, 0, 17, 17},
                                         {"half of another shard", 700, 40, 100, 60, 180},
                                         {"all of another shard", 65, 10, 10, 20, 30},
                                         {"more buckets than rows", 300, 5000, 0, 0, 4999},
                                         {"one row", 1, 3, 0, 0, 2},
                                         {"no rows", 0, 4, 0, 0, 3},
                                         {"no buckets", 33, 0, 0, 0, 5}}) {
    SCOPED_TRACE(::testing::Message() << c.what << ": " << c.rows << " rows, " << c.buckets << " buckets");
    std::mt19937 rng(static_cast<std::uint32_t>(c.rows * 31 + c.buckets));
    std::uniform_int_distribution<std::int32_t> pick(static_cast<std::int32_t>(c.token_lo),
                                                     static_cast<std::int32_t>(c.token_hi));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.rows));
    for (std::int32_t& t : tokens) t = pick(rng);
    // The reference: a stable sort of the rows by bucket, and each bucket's start.
    const ShardBucket host_key{tokens.data(), c.v0, c.buckets};
    std::vector<std::int32_t> want_order(tokens.size());
    for (std::size_t n = 0; n < want_order.size(); ++n) want_order[n] = static_cast<std::int32_t>(n);
    std::stable_sort(want_order.begin(), want_order.end(),
                     [&](std::int32_t a, std::int32_t b) { return host_key.bucket(a) < host_key.bucket(b); });
    std::vector<std::int32_t> want_offsets(static_cast<std::size_t>(c.buckets + 1), 0);
    for (std::int32_t n = 0; n < static_cast<std::int32_t>(c.rows); ++n)
      for (i64 k = host_key.bucket(n) + 1; k <= c.buckets; ++k) ++want_offsets[static_cast<std::size_t>(k)];

    auto s = d.create_stream("compute");
    for (const int layout : {0, 1, 2}) {  // the factory's, the CPU's, the GPU's
      SCOPED_TRACE(layout == 0 ? "the stream's layout" : layout == 1 ? "the CPU layout" : "the GPU layout");
      stp::StableBuckets shape = stp::stable_buckets(*s, c.rows, c.buckets);
      EXPECT_EQ(shape.gpu, GetParam() != DeviceKind::Cpu);
      if (layout > 0) shape.gpu = layout == 2;
      const std::size_t nbytes = tokens.size() * sizeof(std::int32_t);
      const std::size_t obytes = want_offsets.size() * sizeof(std::int32_t);
      auto* dtokens = static_cast<std::int32_t*>(d.allocate(nbytes + 1));
      auto* dorder = static_cast<std::int32_t*>(d.allocate(nbytes + 1));
      auto* doffsets = static_cast<std::int32_t*>(d.allocate(obytes));
      if (nbytes) s->copy(dtokens, tokens.data(), nbytes);
      stp::bucket_rows(*s, shape, ShardBucket{dtokens, c.v0, c.buckets}, doffsets, dorder);
      std::vector<std::int32_t> order(tokens.size()), offsets(want_offsets.size());
      if (nbytes) s->copy(order.data(), dorder, nbytes);
      s->copy(offsets.data(), doffsets, obytes);
      s->synchronize();
      for (void* p : {static_cast<void*>(dtokens), static_cast<void*>(dorder), static_cast<void*>(doffsets)})
        d.deallocate(p);
      EXPECT_EQ(order, want_order);
      EXPECT_EQ(offsets, want_offsets);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LaunchShape, ::testing::ValuesIn(stp::testing::all_kinds()),
                         stp::testing::kind_name);

}  // namespace
