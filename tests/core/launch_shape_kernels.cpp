// Launch shapes (core/launch_shape.h) on every available device kind: each launch covers its
// iteration exactly once, in parts of the layout the stream's backend promises (whole rows, blocks
// of kMaxWidth columns and runs of cpu_run elements on a CPU stream; one element or column per
// thread on CUDA). Each task records its part in device memory and the host checks the parts. This
// file is compiled by nvcc when the CUDA backend is built (name ends in _kernels.cpp), so the
// functors below run on the GPU there.
#include <gtest/gtest.h>

#include <cstdint>
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

struct RecordColumnParts {
  stp::ColumnBlocks cols;
  i64* parts;
  STP_HD void operator()(std::size_t i) const {
    const stp::ColumnBlocks::Part p = cols.part(i);
    parts[3 * i] = 0, parts[3 * i + 1] = p.begin, parts[3 * i + 2] = p.size;
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

TEST_P(LaunchShape, ColumnWiseCoversEveryColumnOnceInBlocksOf16PerCpuTaskOnePerGpuThread) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  for (const auto& [columns, height] : std::vector<std::pair<i64, i64>>{{37, 5}, {16, 3}, {1, 4}, {48, 1}, {0, 2}}) {
    SCOPED_TRACE(::testing::Message() << columns << " columns of height " << height);
    const stp::ColumnBlocks cols = stp::column_wise(*s, columns, height);
    EXPECT_EQ(cols.columns, columns);
    EXPECT_EQ(cols.height, height);
    const std::vector<Part> parts = run_parts(d, cols, RecordColumnParts{cols, nullptr});
    expect_exact_cover(parts, 1, columns);
    const i64 width = GetParam() == DeviceKind::Cpu ? stp::ColumnBlocks::kMaxWidth : 1;
    EXPECT_EQ(cols.width, width);
    ASSERT_EQ(parts.size(), static_cast<std::size_t>((columns + width - 1) / width));
    for (std::size_t t = 0; t < parts.size(); ++t) {  // block t starts at t * width; only the last is narrower
      EXPECT_EQ(parts[t].begin, static_cast<i64>(t) * width);
      EXPECT_EQ(parts[t].size, t + 1 < parts.size() ? width : columns - static_cast<i64>(t) * width);
      EXPECT_LE(parts[t].size, stp::ColumnBlocks::kMaxWidth);
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

TEST_P(LaunchShape, RowTilesHandTheBodyOneTileOfCpuRowsOnACpuStreamAndOneRowOnAGpu) {
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
  EXPECT_EQ(rows, GetParam() == DeviceKind::Cpu ? 8 : 1);
  EXPECT_EQ(host, GetParam() == DeviceKind::Cpu);
}

INSTANTIATE_TEST_SUITE_P(Backends, LaunchShape, ::testing::ValuesIn(stp::testing::all_kinds()),
                         stp::testing::kind_name);

}  // namespace
