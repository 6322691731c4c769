// Launch shapes: a kernel names what it iterates; the launch layer lays it out for the stream.
//
// A kernel never asks which backend its stream runs on (tests/tools/single_source_check.py, rule
// S5). It names the iteration its functor walks and gets a shape whose numbers the stream's
// backend chose, then runs it with launch(stream, shape, functor, grain) (below; the tasks run as
// core/launch.h's launch() runs indices). The functor receives a task index and finds its part of
// the iteration with shape.part(task):
//
//   element_wise(s, n, cpu_run) -> ElementRuns: elements [0, n), each computed on its own;
//       part(task) = {begin, size}
//   row_wise(s, rows, len) -> RowSegments: rows of len elements, each computed on its own;
//       part(task) = {row, begin, size}
//   column_wise(s, columns, height) -> ColumnBlocks: columns, each summed down its height rows;
//       part(task) = {begin, size} (columns)
//   row_tiles<CpuRows>(s, body) -> RowTile: rows worked on in tiles of a compile-time height (the
//       fused attention); body launches its functors for the tile height it is handed
//
// What one task covers on each backend today:
//
//   shape          CPU stream: a oneTBB task (host code)      CUDA stream: one GPU thread
//   ElementRuns    a run of cpu_run adjacent elements          one element
//   RowSegments    one whole row (its vector form in one call) one element of a row
//   ColumnBlocks   kMaxWidth adjacent columns (one 64-byte     one column (adjacent threads read
//                  line of f32 per row read)                   adjacent columns)
//   RowTile        CpuRows rows (or the kernel's host form)    one row
//
// Contract for every shape: the parts of a launch are contiguous ranges that cover the iteration
// exactly once; a functor computes each element (each column's sum, in row order) by the same
// expression whichever part holds it, so no value depends on the layout: a layout can change (a
// backend's, or a new one) without changing a result. Counts are std::int64_t and >= 0 (an empty
// iteration launches nothing).
//
// Grain (launch's last argument): the minimum number of tasks per oneTBB chunk on a CPU stream,
// counted in the CPU tasks of the table (runs, whole rows, column blocks); pick ~16K scalar ops of
// work per chunk. A GPU launch ignores it.
//
// Extending. A shape's layout on each backend is decided here, in its factory and its launch(),
// and nowhere else. A faster GPU layout for a shape (one warp or one block per row or per column
// group) changes that shape's factory and launch() here, and the functors take their thread's
// share through the shape; the call sites, which only name the shape, stay as they are. A new
// iteration is a new shape here, with its layout on every backend and a case in
// tests/core/launch_shape_kernels.cpp.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"  // STP_HD
#include "core/launch.h"

namespace stp {

namespace launch_detail {
// Whether a stream runs shapes as oneTBB tasks of host code (a CPU stream) rather than as GPU
// threads: the one backend test behind every shape. For this header only, never for kernels.
inline bool host_tasks(Stream& s) { return s.device().kind() == DeviceKind::Cpu; }
}  // namespace launch_detail

// ---- Elements ------------------------------------------------------------------------------------

// Elements [0, n), each computed on its own, in runs of `run` adjacent elements per task.
struct ElementRuns {
  std::int64_t n = 0;    // elements
  std::int64_t run = 1;  // elements per task (>= 1); the last run may be short
  struct Part {
    std::int64_t begin, size;  // elements [begin, begin + size)
  };
  STP_HD Part part(std::size_t task) const {
    const std::int64_t begin = static_cast<std::int64_t>(task) * run;
    return {begin, n - begin < run ? n - begin : run};
  }
  std::size_t tasks() const { return n > 0 ? static_cast<std::size_t>((n + run - 1) / run) : 0; }
  // A grain of at least `elements` elements per CPU chunk, in tasks (at least 1).
  std::size_t grain(std::int64_t elements) const {
    const std::int64_t g = (elements + run - 1) / run;
    return static_cast<std::size_t>(g > 1 ? g : 1);
  }
};

// cpu_run (>= 1): the run a CPU task takes, long enough for the element loop's vector form. CPU
// stream: runs of cpu_run; CUDA stream: one element per thread.
inline ElementRuns element_wise(Stream& s, std::int64_t n, std::int64_t cpu_run) {
  STP_ASSERT(n >= 0 && cpu_run >= 1, "element_wise: n ", n, ", cpu_run ", cpu_run);
  return {n, launch_detail::host_tasks(s) ? cpu_run : 1};
}

// ---- Rows of independent elements -----------------------------------------------------------------

// `rows` rows of `len` elements, each element computed on its own (the softmax gradient, SwiGLU, an
// embedding row's channels): a row is `count` segments of `width` elements (the last may be
// short), and task i is segment i % count of row i / count. count == 1: every task holds whole rows.
struct RowSegments {
  std::int64_t rows = 0, len = 0;
  std::int64_t width = 1, count = 0;
  struct Part {
    std::int64_t row, begin, size;  // elements [begin, begin + size) of row `row`
  };
  STP_HD Part part(std::size_t task) const {
    const auto t = static_cast<std::int64_t>(task);
    const std::int64_t begin = t % count * width;
    return {t / count, begin, len - begin < width ? len - begin : width};
  }
  std::size_t tasks() const { return static_cast<std::size_t>(rows * count); }
};

// CPU stream: one task per whole row, so it runs the row's vector form in one call. CUDA stream:
// one element per thread, so a row of 151,936 logits is that many threads rather than one
// (adjacent threads, adjacent elements).
inline RowSegments row_wise(Stream& s, std::int64_t rows, std::int64_t len) {
  STP_ASSERT(rows >= 0 && len >= 0, "row_wise: rows ", rows, ", len ", len);
  const std::int64_t width = launch_detail::host_tasks(s) && len > 0 ? len : 1;
  return {rows, len, width, (len + width - 1) / width};
}

// ---- Column reductions ----------------------------------------------------------------------------

// `columns` columns of a row-major (height, columns) matrix, each reduced down its `height` rows
// (a bias or norm-weight gradient): task t sums the block of `width` adjacent columns from t *
// width (the last may be narrower), walking the rows once with one accumulator per column. Each
// column still adds its rows in ascending order, so the sums are bitwise those of one task per
// column, whatever the width.
struct ColumnBlocks {
  static constexpr std::int64_t kMaxWidth = 16;  // the widest block: the size of a task's accumulator array
  std::int64_t columns = 0, height = 0;
  std::int64_t width = 1;  // columns per task, 1 .. kMaxWidth
  struct Part {
    std::int64_t begin, size;  // columns [begin, begin + size)
  };
  STP_HD Part part(std::size_t task) const {
    const std::int64_t begin = static_cast<std::int64_t>(task) * width;
    return {begin, columns - begin < width ? columns - begin : width};
  }
  std::size_t tasks() const { return static_cast<std::size_t>((columns + width - 1) / width); }
};

// CPU stream: blocks of kMaxWidth columns (one 64-byte line of f32), so a row's cache line is read
// once per block rather than once per column. CUDA stream: one column per thread.
inline ColumnBlocks column_wise(Stream& s, std::int64_t columns, std::int64_t height) {
  STP_ASSERT(columns >= 0 && height >= 0, "column_wise: columns ", columns, ", height ", height);
  return {columns, height, launch_detail::host_tasks(s) ? ColumnBlocks::kMaxWidth : 1};
}

// ---- Launch ---------------------------------------------------------------------------------------

template <typename S>
concept LaunchShape = requires(const S& shape) {
  { shape.tasks() } -> std::convertible_to<std::size_t>;
};

// Runs f(task) for every task of `shape` in stream order, one task per part as the tables above
// say; grain as above. Today every shape's tasks run as launch(stream, shape.tasks(), f, grain).
template <LaunchShape S, typename F>
void launch(Stream& stream, const S& shape, F f, std::size_t grain) {
  launch(stream, shape.tasks(), f, grain);
}

// ---- Row tiles ------------------------------------------------------------------------------------

// A tile of `Rows` rows: a compile-time height, because the tile lives in the task's own arrays.
// host_tasks: the tiles run as oneTBB tasks of host code (a CPU stream), few and long, so a host
// form of the tile body (vector instructions chosen at run time) may stand in for the functor, and
// a task may own more than one tile; otherwise each tile is a GPU thread. It is the one layout
// property a kernel branches on, and only to choose such a host form or its task split: host-only
// code cannot run as a GPU thread, whatever the tile.
template <int Rows, bool HostTasks>
struct RowTile {
  static constexpr int rows = Rows;
  static constexpr bool host_tasks = HostTasks;
};

// For a kernel whose functors are templates on a tile height (the fused attention): calls body(tile)
// once with the tile the stream's backend works in, RowTile<CpuRows, true> on a CPU stream and
// RowTile<1, false> (one row per GPU thread) on a CUDA stream; body launches its functors
// instantiated for tile.rows. Both calls are compiled in every build.
template <int CpuRows, typename Body>
void row_tiles(Stream& s, Body&& body) {
  static_assert(CpuRows >= 1, "row_tiles: a tile holds at least one row");
  if (launch_detail::host_tasks(s)) {
    body(RowTile<CpuRows, true>{});
  } else {
    body(RowTile<1, false>{});
  }
}

}  // namespace stp
