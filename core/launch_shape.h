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
//   row_reduce(s, rows) -> RowReduce: rows each reduced to numbers of their own (norm statistics,
//       softmax and cross-entropy rows), then written from them; part(task) = {row, lane}, and the
//       functor walks the row through the shape's sum(), max() and each()
//   column_sums(s, columns, height) -> ColumnSlices: columns, each summed down its height rows (bias
//       and norm-weight gradients); the functor calls reduce<K>(task, term, store)
//   row_tiles<CpuRows>(s, body) -> RowTile or RowBlock: rows worked on in tiles of a compile-time
//       height (the fused attention); body launches its functors for the tile it is handed: a CPU
//       task's tile, or a block of GPU threads whose functors are block programs (phases between
//       barriers, block-shared tiles)
//   stable_buckets(s, rows, buckets) -> StableBuckets: rows listed stably by an integer bucket (the
//       embedding gradient's token buckets); not walked by a functor of the kernel's but run whole
//       by bucket_rows(s, shape, key, offsets, order), with the kernel's bucket key
//
// What one task covers on each backend:
//
//   shape          CPU stream: a oneTBB task (host code)      CUDA stream: GPU threads
//   ElementRuns    a run of cpu_run adjacent elements          one element per thread
//   RowSegments    one whole row (its vector form in one call) one element of a row per thread
//   RowReduce      one whole row: all 32 partials of its sums  one warp per row: lane j is partial j
//                  (or a host vector form in the same order)   (strided loads), shuffle-down tree
//   ColumnSlices   kCpuWidth (16) adjacent columns, all rows   a block of kGpuBlockThreads threads per
//                  in order, the 32 slice partials kept        kGpuWidth (32) columns: lane = column,
//                                                              warp w = slices w, w + 8, ...; shared
//                                                              memory, then tree32 in warp 0
//   RowTile /      CpuRows rows (or the kernel's host form)    RowBlock: a block of kRowBlockThreads
//   RowBlock                                                   (64) threads per tile, one row per
//                                                              thread, shared operand tiles staged
//                                                              between barriers (tests emulate it
//                                                              on a CPU stream: EmulatedRowBlocks)
//   StableBuckets  one task: a stable counting sort over the   a warp per row counting the rows
//                  rows and the buckets                        before it (RowReduce), then a binary
//                                                              search per bucket for its start
//
// The reduction shapes have one canonical summation order each, whatever the backend, the thread
// count or the grain (core/reduce_order.h spells it out; tests/core/launch_shape_kernels.cpp checks
// it bitwise against a scalar reference):
//   RowReduce     32 partials, partial j adding the terms j, j + 32, ... in index order from 0.0f;
//                 then the pairwise tree over the partials, steps 16, 8, 4, 2, 1 (p[j] += p[j + step]).
//   ColumnSlices  32 contiguous row slices [s h / 32, (s + 1) h / 32), each added in row order from
//                 0.0f; then the same tree over the 32 slice partials.
// So no CUDA kernel runs one thread over a whole row, column or vocabulary, and the CPU backend,
// which runs the same order, stays the oracle bit for bit (up to fused multiply-adds inside a term).
//
// Contract for every shape: the parts of a launch cover the iteration exactly once; a functor
// computes each element (each reduction, in its shape's canonical order) by the same expression
// whichever part holds it, so no value depends on the layout: a layout can change (a backend's, or
// a new one) without changing a result. Counts are std::int64_t and >= 0 (an empty iteration
// launches nothing).
//
// Grain (launch's last argument): the minimum number of tasks per oneTBB chunk on a CPU stream,
// counted in the CPU tasks of the table (runs, whole rows, column blocks); pick ~16K scalar ops of
// work per chunk. A GPU launch ignores it.
//
// Extending. A shape's layout on each backend is decided here, in its factory, its launch() and
// (for the reduction shapes) its reduction members, and nowhere else; the call sites, which only
// name the shape, stay as they are. A GPU layout may change only within its shape's canonical
// order (more warps per column group, up to one per slice), never the order itself. A new
// iteration is a new shape here, with its layout on every backend and a case in
// tests/core/launch_shape_kernels.cpp.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "core/device.h"
#include "core/dtype.h"  // STP_HD
#include "core/launch.h"
#include "core/reduce_order.h"

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

// ---- Row reductions -------------------------------------------------------------------------------

// `rows` rows, each reduced to numbers of its own (a norm's statistics, a softmax's maximum and
// sum, a cross-entropy row) and then written back elementwise from them. Task t is lane t % lanes
// of row t / lanes. A functor finds its row with part(task) and walks it only through sum(), max()
// and each(), which lay the row out for the backend:
//   sum(p, n, f)   sum of f(c) over c in [0, n), in the canonical row order of
//                  core/reduce_order.h (32 strided partials, then tree32); every lane of the row
//                  gets the same value. f may also write element c (each c is visited once).
//   max(p, n, f)   maximum of f(c) over [0, n) (NaN terms skipped; -inf for n == 0), every lane.
//   each(p, n, f)  f(c) once for every c in [0, n), lanes taking c in turn.
//   leader(p)      the one lane of the row that writes the row's own numbers (mean, rstd, lse).
// A row's result therefore never depends on the backend's layout, the thread count or the grain.
struct RowReduce {
  static constexpr std::int64_t kWarp = reduce_order::kPartials;  // lanes of a GPU row
  std::int64_t rows = 0;
  std::int64_t lanes = 1;  // tasks per row: 1 (a CPU task computes all 32 partials) or kWarp
  struct Part {
    std::int64_t row, lane;
  };
  STP_HD Part part(std::size_t task) const {
    const auto t = static_cast<std::int64_t>(task);
    return {t / lanes, t % lanes};
  }
  std::size_t tasks() const { return static_cast<std::size_t>(rows * lanes); }
  STP_HD bool leader(Part p) const { return p.lane == 0; }

  template <typename F>
  STP_HD void each(Part p, std::int64_t n, F&& f) const {
#if defined(__CUDA_ARCH__)
    for (std::int64_t c = p.lane; c < n; c += kWarp) f(c);
#else
    (void)p;  // a host task is the whole row
    for (std::int64_t c = 0; c < n; ++c) f(c);
#endif
  }

  template <typename F>
  STP_HD float sum(Part p, std::int64_t n, F&& f) const {
#if defined(__CUDA_ARCH__)
    // Lane j is partial j; the shuffle-down steps 16, 8, 4, 2, 1 are tree32's steps.
    float acc = 0.0f;
    for (std::int64_t c = p.lane; c < n; c += kWarp) acc += f(c);
    for (int step = kWarp / 2; step >= 1; step /= 2) acc = acc + __shfl_down_sync(0xffffffffu, acc, step);
    return __shfl_sync(0xffffffffu, acc, 0);
#else
    (void)p;
    float acc[kWarp] = {};
    std::int64_t v = 0;
    for (; v + kWarp <= n; v += kWarp)  // whole blocks: a fixed trip count the compiler vectorises
      for (std::int64_t j = 0; j < kWarp; ++j) acc[j] += f(v + j);
    for (std::int64_t j = 0; v + j < n; ++j) acc[j] += f(v + j);  // the last, partial block
    return reduce_order::tree32(acc);
#endif
  }

  template <typename F>
  STP_HD float max(Part p, std::int64_t n, F&& f) const {
#if defined(__CUDA_ARCH__)
    float acc = -INFINITY;
    for (std::int64_t c = p.lane; c < n; c += kWarp) {
      const float x = f(c);
      acc = x > acc ? x : acc;
    }
    for (int step = kWarp / 2; step >= 1; step /= 2) {
      const float o = __shfl_down_sync(0xffffffffu, acc, step);
      acc = o > acc ? o : acc;
    }
    return __shfl_sync(0xffffffffu, acc, 0);
#else
    (void)p;
    float acc[kWarp];
    for (float& a : acc) a = -INFINITY;
    for (std::int64_t c = 0; c < n; ++c) {
      const float x = f(c);
      acc[c % kWarp] = x > acc[c % kWarp] ? x : acc[c % kWarp];
    }
    return reduce_order::tree32_max(acc);
#endif
  }
};

// CPU stream: one task per row (lanes 1), which computes the 32 partials itself (a host vector form
// may stand in, adding the same terms in the same order). CUDA stream: one warp per row (lanes 32).
inline RowReduce row_reduce(Stream& s, std::int64_t rows) {
  STP_ASSERT(rows >= 0, "row_reduce: rows ", rows);
  return {rows, launch_detail::host_tasks(s) ? 1 : RowReduce::kWarp};
}

// ---- Column reductions ----------------------------------------------------------------------------

// `columns` columns of a row-major (height, columns) matrix, each reduced down its `height` rows to
// K numbers (a bias or norm-weight gradient; K <= kMaxTerms), in the canonical column order of
// core/reduce_order.h: 32 row slices, each summed in row order, then tree32 over the slices.
// reduce<K>(task, term, store) does a task's share: term(n, c, v) sets the K terms v[0, K) of row n,
// column c; store(c, total) receives column c's K sums once. The layout:
//   CPU stream: a task is a block of kCpuWidth adjacent columns (one 64-byte line of f32 per row
//       read), walking all rows once;
//   CUDA stream: a block of kGpuBlockThreads threads (core/launch.h) is a group of kGpuWidth
//       adjacent columns: lane l of every warp takes column l (adjacent threads read adjacent
//       columns), warp w the slices w, w + 8, ...; the slice partials meet in shared memory and
//       lane l of warp 0 adds them with tree32.
// So a column's sums do not depend on the backend, the thread count or the grain.
struct ColumnSlices {
  static constexpr std::int64_t kCpuWidth = 16;
  static constexpr std::int64_t kGpuWidth = 32;
  static constexpr int kMaxTerms = 2;
  std::int64_t columns = 0, height = 0;
  bool gpu = false;  // the CUDA layout

  std::size_t tasks() const {
    if (!gpu) return static_cast<std::size_t>((columns + kCpuWidth - 1) / kCpuWidth);
    return static_cast<std::size_t>((columns + kGpuWidth - 1) / kGpuWidth) * kGpuBlockThreads;
  }

  template <int K, typename Term, typename Store>
  STP_HD void reduce(std::size_t task, Term&& term, Store&& store) const {
    static_assert(K >= 1 && K <= kMaxTerms, "ColumnSlices: 1 to kMaxTerms sums per column");
#if defined(__CUDA_ARCH__)
    constexpr int kSlices = reduce_order::kPartials;
    __shared__ float partial[kSlices][kGpuWidth][kMaxTerms];
    constexpr int kWarps = static_cast<int>(kGpuBlockThreads / kGpuWidth);
    const auto t = static_cast<std::int64_t>(task);
    const std::int64_t within = t % kGpuBlockThreads;
    const int lane = static_cast<int>(within % kGpuWidth), warp = static_cast<int>(within / kGpuWidth);
    const std::int64_t c = t / kGpuBlockThreads * kGpuWidth + lane;
    const bool live = c < columns;  // every thread of the block reaches the barrier
    for (int s = warp; s < kSlices; s += kWarps) {
      float acc[K] = {};
      if (live)
        for (std::int64_t n = reduce_order::slice_begin(s, height); n < reduce_order::slice_begin(s + 1, height); ++n) {
          float v[K];
          term(n, c, v);
          for (int q = 0; q < K; ++q) acc[q] += v[q];
        }
      for (int q = 0; q < K; ++q) partial[s][lane][q] = acc[q];
    }
    __syncthreads();
    if (warp == 0 && live) {
      float total[K];
      for (int q = 0; q < K; ++q) {
        float p[kSlices];
        for (int s = 0; s < kSlices; ++s) p[s] = partial[s][lane][q];
        total[q] = reduce_order::tree32(p);
      }
      store(c, total);
    }
#else
    const std::int64_t c0 = static_cast<std::int64_t>(task) * kCpuWidth;
    const std::int64_t w = columns - c0 < kCpuWidth ? columns - c0 : kCpuWidth;
    if (w == kCpuWidth) host_block<K, kCpuWidth>(c0, w, term, store);
    else host_block<K, 0>(c0, w, term, store);
#endif
  }

 private:
  // A CPU task's block of w columns from c0: the rows once, slice by slice, then the tree per
  // column. W > 0: w == W, a trip count the compiler knows (the full blocks), so it vectorises
  // across the columns.
  template <int K, std::int64_t W, typename Term, typename Store>
  STP_HD void host_block(std::int64_t c0, std::int64_t w, Term& term, Store& store) const {
    constexpr int kSlices = reduce_order::kPartials;
    const std::int64_t width = W > 0 ? W : w;
    float partial[K][kSlices][kCpuWidth];
    for (int s = 0; s < kSlices; ++s) {
      float acc[K][kCpuWidth] = {};
      for (std::int64_t n = reduce_order::slice_begin(s, height); n < reduce_order::slice_begin(s + 1, height); ++n)
        for (std::int64_t k = 0; k < width; ++k) {
          float v[K];
          term(n, c0 + k, v);
          for (int q = 0; q < K; ++q) acc[q][k] += v[q];
        }
      for (int q = 0; q < K; ++q)
        for (std::int64_t k = 0; k < width; ++k) partial[q][s][k] = acc[q][k];
    }
    for (std::int64_t k = 0; k < width; ++k) {
      float total[K];
      for (int q = 0; q < K; ++q) {
        float p[kSlices];
        for (int s = 0; s < kSlices; ++s) p[s] = partial[q][s][k];
        total[q] = reduce_order::tree32(p);
      }
      store(c0 + k, total);
    }
  }
};

// The layout of the table above for the stream's backend.
inline ColumnSlices column_sums(Stream& s, std::int64_t columns, std::int64_t height) {
  STP_ASSERT(columns >= 0 && height >= 0, "column_sums: columns ", columns, ", height ", height);
  return {columns, height, !launch_detail::host_tasks(s)};
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

// ---- Stable buckets -------------------------------------------------------------------------------

// `rows` rows, each in one of `buckets` buckets or in none, listed stably by bucket (the embedding
// gradient's token buckets). key.bucket(n), an STP_HD member returning std::int64_t in
// [0, buckets], is row n's bucket (buckets itself: none). bucket_rows(s, shape, key, offsets, order)
// writes
//   order[0, rows)        the rows by (bucket, row): each bucket's rows in ascending order, then the
//                         rows of no bucket in ascending order;
//   offsets[0, buckets]   offsets[k] = where bucket k starts in order, the number of rows whose
//                         bucket is below k (offsets[buckets]: the rows in some bucket).
// Both are integers fixed by the keys alone, so they are the same whatever the layout:
//   CPU stream: one task, a stable counting sort: one pass over the rows, one over the buckets,
//       one more over the rows (O(rows + buckets));
//   CUDA stream: row n's place in order is a row reduction (RowReduce, one warp per row) counting
//       the rows before it by (bucket, row) (0/1 terms, so the f32 sum is the exact count below
//       kMaxRows rows), then every bucket's start is a binary search of order, one task per
//       bucket: rows^2 comparisons, but no thread walks the rows or the buckets alone.
struct StableBuckets {
  static constexpr std::int64_t kMaxRows = std::int64_t{1} << 24;
  std::int64_t rows = 0, buckets = 0;
  bool gpu = false;  // the CUDA layout
  RowReduce ranks;   // the CUDA layout's rank rows, one per row
};

inline StableBuckets stable_buckets(Stream& s, std::int64_t rows, std::int64_t buckets) {
  STP_ASSERT(rows >= 0 && rows < StableBuckets::kMaxRows && buckets >= 0 && buckets < (std::int64_t{1} << 31),
             "stable_buckets: rows ", rows, ", buckets ", buckets);
  return {rows, buckets, !launch_detail::host_tasks(s), row_reduce(s, rows)};
}

namespace launch_detail {

// The CPU layout: the stable counting sort, in one task.
template <typename Key>
struct BucketCountingSort {
  Key key;
  std::int32_t* offsets;
  std::int32_t* order;
  std::int64_t rows, buckets;
  STP_HD void operator()(std::size_t) const {
    for (std::int64_t k = 0; k <= buckets; ++k) offsets[k] = 0;
    for (std::int64_t n = 0; n < rows; ++n) {
      const std::int64_t k = key.bucket(n);
      if (k < buckets) ++offsets[k + 1];
    }
    for (std::int64_t k = 0; k < buckets; ++k) offsets[k + 1] += offsets[k];
    std::int32_t none = offsets[buckets];  // offsets[k]: the next place in bucket k
    for (std::int64_t n = 0; n < rows; ++n) {
      const std::int64_t k = key.bucket(n);
      order[k < buckets ? offsets[k]++ : none++] = static_cast<std::int32_t>(n);
    }
    for (std::int64_t k = buckets; k > 0; --k) offsets[k] = offsets[k - 1];  // ends back to starts
    offsets[0] = 0;
  }
};

// The CUDA layout, first launch: row n's place is the number of rows before it by (bucket, row).
template <typename Key>
struct BucketRanks {
  Key key;
  std::int32_t* order;
  std::int64_t rows;
  RowReduce rr;
  STP_HD void operator()(std::size_t task) const {
    const RowReduce::Part p = rr.part(task);
    const std::int64_t n = p.row, kn = key.bucket(n);
    const float before = rr.sum(p, rows, [&](std::int64_t m) {
      const std::int64_t km = key.bucket(m);
      return km < kn || (km == kn && m < n) ? 1.0f : 0.0f;
    });
    if (rr.leader(p)) order[static_cast<std::int64_t>(before)] = static_cast<std::int32_t>(n);
  }
};

// The CUDA layout, second launch: offsets[k] = the rows whose bucket is below k, by a binary search
// of order (sorted by bucket), one task per k in [0, buckets].
template <typename Key>
struct BucketStarts {
  Key key;
  std::int32_t* offsets;
  const std::int32_t* order;
  std::int64_t rows;
  STP_HD void operator()(std::size_t k) const {
    std::int64_t lo = 0, hi = rows;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (key.bucket(order[mid]) < static_cast<std::int64_t>(k)) lo = mid + 1;
      else hi = mid;
    }
    offsets[k] = static_cast<std::int32_t>(lo);
  }
};

}  // namespace launch_detail

// Fills offsets (buckets + 1 of them) and order (rows) as StableBuckets says, in stream order.
template <typename Key>
void bucket_rows(Stream& s, const StableBuckets& shape, Key key, std::int32_t* offsets, std::int32_t* order) {
  if (!shape.gpu) {
    launch(s, 1, launch_detail::BucketCountingSort<Key>{key, offsets, order, shape.rows, shape.buckets}, 1);
    return;
  }
  // ~16K comparisons per CPU chunk where this layout runs on a CPU stream (a test).
  const std::int64_t per_chunk = shape.rows >= 16384 ? 1 : 16384 / (shape.rows > 0 ? shape.rows : 1);
  launch(s, shape.ranks, launch_detail::BucketRanks<Key>{key, order, shape.rows, shape.ranks},
         static_cast<std::size_t>(per_chunk));
  launch(s, static_cast<std::size_t>(shape.buckets + 1),
         launch_detail::BucketStarts<Key>{key, offsets, order, shape.rows}, 4096);
}

// ---- Row tiles ------------------------------------------------------------------------------------

// A tile of `Rows` rows: a compile-time height, because the tile lives in the task's own arrays.
// host_tasks: the tiles run as oneTBB tasks of host code (a CPU stream), few and long, so a host
// form of the tile body (vector instructions chosen at run time) may stand in for the functor, and
// a task may own more than one tile. It is the one layout property a kernel branches on, and only
// to choose such a host form or its task split: host-only code cannot run as a GPU thread.
template <int Rows, bool HostTasks>
struct RowTile {
  static constexpr int rows = Rows;
  static constexpr bool host_tasks = HostTasks;
};

// Storage of a block program that all its threads share: `__shared__` in device code (static
// shared memory, at most 48 KiB per block), a plain local of the emulating task on a CPU.
#if defined(__CUDA_ARCH__)
#define STP_BLOCK_SHARED __shared__
#else
#define STP_BLOCK_SHARED
#endif

// One value of T per thread of a block program that outlives a phase (a thread's row, its
// accumulators): the thread's own (registers or local memory) on CUDA, Threads of them in the
// emulating task on a CPU; [t] is thread t's.
template <typename T, int Threads>
struct PerThread {
#if defined(__CUDA_ARCH__)
  T own;
  STP_HD T& operator[](int) { return own; }
#else
  T own[Threads];
  STP_HD T& operator[](int t) { return own[t]; }
#endif
};

// The launch of n blocks of a RowBlock<Threads> program (RowBlock::blocks).
template <int Threads>
struct RowBlocks {
  std::size_t n;
};

// The CUDA layout of row_tiles: a block of Threads GPU threads works one tile of `rows` = Threads
// rows together, one row (or key) per thread, staging the operands the rows share in block-shared
// memory. Its functors are block programs, written as phases: phase(f) runs f(t) for every thread
// t of the block, then waits for all of them (a barrier). Between phases a thread keeps only its
// PerThread values and the block its STP_BLOCK_SHARED arrays. Every thread of a block reaches every
// phase (the control flow around phases depends on the block's task only).
//   CUDA stream: the block's threads run f(threadIdx.x) together, then __syncthreads();
//   CPU stream (EmulatedRowBlocks, tests): one oneTBB task runs the block, f(0), f(1), ...,
//       f(Threads - 1) in turn, the end of that loop the barrier.
// So the emulation computes every value by the GPU's expressions in the GPU's order: the CPU proves
// the CUDA layout bitwise, but for the multiply-adds nvcc fuses.
// blocks(n) is the launch of n blocks: launch(stream, tile.blocks(n), f, grain) runs f(block) for
// block in [0, n) (core/launch.h, launch_blocks).
template <int Threads>
struct RowBlock {
  static_assert(Threads % 32 == 0, "RowBlock: whole warps");
  static constexpr int rows = Threads;
  static constexpr int threads = Threads;
  static constexpr bool host_tasks = false;

  template <typename F>
  STP_HD static void phase(F&& f) {
#if defined(__CUDA_ARCH__)
    f(static_cast<int>(threadIdx.x));
    __syncthreads();
#else
    for (int t = 0; t < Threads; ++t) f(t);
#endif
  }

  static RowBlocks<Threads> blocks(std::size_t n) { return {n}; }
};

// Threads of a RowBlock on CUDA: two warps, so that a block's 64 rows share each staged tile of
// keys (or query rows) while a 2048-row sequence still yields enough blocks to fill every SM; the
// shared tiles stay within the 48 KiB of static shared memory (docs/gpu-readiness.md, The fused
// attention's CUDA blocks).
constexpr int kRowBlockThreads = 64;

template <int Threads, typename F>
void launch(Stream& stream, const RowBlocks<Threads>& blocks, F f, std::size_t grain) {
  launch_blocks<static_cast<unsigned>(Threads)>(stream, blocks.n, f, grain);
}

namespace launch_detail {
inline thread_local bool emulate_row_blocks = false;
}  // namespace launch_detail

// For tests: while one lives, row_tiles on this thread hands a CPU stream's body the CUDA layout,
// RowBlock<kRowBlockThreads>, whose blocks the CPU then runs thread by thread, phase by phase.
class EmulatedRowBlocks {
 public:
  EmulatedRowBlocks() : previous_(launch_detail::emulate_row_blocks) { launch_detail::emulate_row_blocks = true; }
  ~EmulatedRowBlocks() { launch_detail::emulate_row_blocks = previous_; }
  EmulatedRowBlocks(const EmulatedRowBlocks&) = delete;
  EmulatedRowBlocks& operator=(const EmulatedRowBlocks&) = delete;

 private:
  bool previous_;
};

// For a kernel whose functors are templates on a tile height (the fused attention): calls body(tile)
// once with the tile the stream's backend works in, RowTile<CpuRows, true> on a CPU stream and
// RowBlock<kRowBlockThreads> (a block of threads per tile) on a CUDA stream, or on a CPU stream
// while an EmulatedRowBlocks lives; body launches its functors for that tile. Both calls are
// compiled in every build.
template <int CpuRows, typename Body>
void row_tiles(Stream& s, Body&& body) {
  static_assert(CpuRows >= 1, "row_tiles: a tile holds at least one row");
  if (launch_detail::host_tasks(s) && !launch_detail::emulate_row_blocks) {
    body(RowTile<CpuRows, true>{});
  } else {
    body(RowBlock<kRowBlockThreads>{});
  }
}

}  // namespace stp
