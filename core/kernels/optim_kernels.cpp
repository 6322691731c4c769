// Single-source optimizer kernels (compiled by nvcc when the CUDA backend is on).
#include "core/kernels/optim_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/kernels/adamw_ranges.h"
#include "core/launch_shape.h"

namespace stp {
namespace {

// One task per run of elements (an element-wise launch): a CPU run of kAdamWRun goes through
// adamw_range with the widest vector instruction set (bitwise adamw_element, adamw_ranges.h); runs of
// one element (the GPU layout) are the element formula itself.
constexpr std::int64_t kAdamWRun = 8192;

struct AdamWKernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  ElementRuns runs;
  AdamWScalars c;
  STP_HD void operator()(std::size_t r) const {
    const ElementRuns::Part part = runs.part(r);
    const auto begin = static_cast<std::size_t>(part.begin), end = static_cast<std::size_t>(part.begin + part.size);
#if !defined(__CUDA_ARCH__)
    if (runs.run > 1) return adamw_range(best_cpu_isa(), p, g, m, v, begin, end, c);
#endif
    for (std::size_t i = begin; i < end; ++i) adamw_element(p, g, m, v, i, c);
  }
};

// The runs of equal flags of one adamw_flat_step launch, in its arguments (a GPU kernel's
// parameters live in constant memory: every thread reads its run boundary from there).
struct FlagRuns {
  int count = 0;
  std::uint32_t end[kMaxFlatSegments] = {};    // exclusive end of run k, from the launch's first element
  std::uint32_t shift[kMaxFlatSegments] = {};  // run k's element i has its copy at copies[i - shift[k]]
  unsigned char decay[kMaxFlatSegments] = {};  // 1: the decay scalars
  unsigned char copy[kMaxFlatSegments] = {};   // 1: write the bf16 copy
};

// Elements of one launch (offsets in the tables are 32-bit).
constexpr std::size_t kMaxFlatElements = std::size_t{1} << 31;

struct AdamWFlatKernel {
  float* p;
  const float* g;
  float* m;
  float* v;
  ElementRuns runs;
  AdamWScalars c[2];  // [no decay, decay]
  const float* coef;  // null: no clipping
  bf16* copies;       // element i of a copy run k: copies[i - table.shift[k]]
  FlagRuns table;
  STP_HD void operator()(std::size_t r) const {
    const ElementRuns::Part part = runs.part(r);
    auto begin = static_cast<std::size_t>(part.begin);
    const auto end = static_cast<std::size_t>(part.begin + part.size);
    int lo = 0, hi = table.count - 1;  // the first run ending after begin
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (table.end[mid] > begin) hi = mid;
      else lo = mid + 1;
    }
    const float gscale = coef ? *coef : 1.0f;
    for (int k = lo; begin < end; ++k) {
      const std::size_t stop = table.end[k] < end ? table.end[k] : end;
      const AdamWScalars& ck = c[table.decay[k]];
      const bool copy = table.copy[k] != 0;
      const std::size_t shift = table.shift[k];
#if !defined(__CUDA_ARCH__)
      if (runs.run > 1) {
        if (coef) adamw_range_scaled(best_cpu_isa(), p, g, m, v, begin, stop, ck, gscale);
        else adamw_range(best_cpu_isa(), p, g, m, v, begin, stop, ck);
        if (copy)  // the run is still in cache
          for (std::size_t i = begin; i < stop; ++i) copies[i - shift] = from_f32<bf16>(p[i]);
        begin = stop;
        continue;
      }
#endif
      for (std::size_t i = begin; i < stop; ++i) {
        if (coef) adamw_element_scaled(p, g, m, v, i, ck, gscale);
        else adamw_element(p, g, m, v, i, ck);
        if (copy) copies[i - shift] = from_f32<bf16>(p[i]);
      }
      begin = stop;
    }
  }
};

// The ranges of one sumsq_flat_accumulate launch, in its arguments.
struct SumSqRanges {
  int count = 0;
  std::uint32_t begin[kMaxFlatSegments] = {}, end[kMaxFlatSegments] = {};  // elements, from the launch's x
  std::uint32_t first_block[kMaxFlatSegments + 1] = {};  // range k's blocks: [first_block[k], [k + 1])
};

struct SumSqRangeBlockKernel {  // one index per block of a range
  const float* x;
  float* partials;
  SumSqRanges t;
  STP_HD void operator()(std::size_t b) const {
    int lo = 0, hi = t.count - 1;  // the range holding block b: the last with first_block <= b
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (t.first_block[mid] <= b) lo = mid;
      else hi = mid - 1;
    }
    const std::size_t begin = t.begin[lo] + (b - t.first_block[lo]) * kSumSqBlock;
    const std::size_t end = begin + kSumSqBlock < t.end[lo] ? begin + kSumSqBlock : t.end[lo];
    double s = 0.0;
    for (std::size_t i = begin; i < end; ++i) s += double(x[i]) * double(x[i]);
    partials[b] = float(s);
  }
};

struct SumRangePartialsKernel {  // a single index: SumPartialsKernel per range, in range order
  const float* partials;
  float* acc;
  SumSqRanges t;
  STP_HD void operator()(std::size_t) const {
    for (int k = 0; k < t.count; ++k) {
      double s = 0.0;
      for (std::uint32_t b = t.first_block[k]; b < t.first_block[k + 1]; ++b) s += double(partials[b]);
      *acc = float(double(*acc) + s);
    }
  }
};

struct SumSqBlockKernel {  // one index per block of kSumSqBlock elements
  const float* x;
  std::size_t n;
  float* partials;
  STP_HD void operator()(std::size_t b) const {
    std::size_t begin = b * kSumSqBlock;
    std::size_t end = begin + kSumSqBlock < n ? begin + kSumSqBlock : n;
    double s = 0.0;
    for (std::size_t i = begin; i < end; ++i) s += double(x[i]) * double(x[i]);
    partials[b] = float(s);
  }
};

struct SumPartialsKernel {  // a single index: adds the block sums in block order
  const float* partials;
  std::size_t blocks;
  float* acc;
  STP_HD void operator()(std::size_t) const {
    double s = 0.0;
    for (std::size_t b = 0; b < blocks; ++b) s += double(partials[b]);
    *acc = float(double(*acc) + s);
  }
};

struct ClipCoefKernel {
  const float* sumsq;
  float max_norm;
  float* norm;
  float* coef;
  STP_HD void operator()(std::size_t) const {
    float total = sqrtf(*sumsq);
    float c = max_norm / (total + 1e-6f);
    *norm = total;
    *coef = c < 1.0f ? c : 1.0f;
  }
};

struct ScaleKernel {
  float* x;
  const float* coef;
  STP_HD void operator()(std::size_t i) const { x[i] *= *coef; }
};

}  // namespace

AdamWScalars adamw_scalars(float lr, const AdamWHyper& h, int step, bool decay) {
  STP_ASSERT(step >= 1, "adamw_step: step is 1-based, got ", step);
  // Bias corrections in double, as torch computes them with Python floats.
  double bias1 = 1.0 - std::pow(double(h.beta1), step);
  double bias2 = 1.0 - std::pow(double(h.beta2), step);
  return AdamWScalars{decay ? float(1.0 - double(lr) * double(h.weight_decay)) : 1.0f,
                      h.beta1,
                      h.beta2,
                      1.0f - h.beta1,
                      1.0f - h.beta2,
                      float(double(lr) / bias1),
                      float(std::sqrt(bias2)),
                      h.eps};
}

void adamw_step(Stream& s, float* param, const float* grad, float* m, float* v, std::size_t n, float lr,
                const AdamWHyper& h, int step, bool decay) {
  const ElementRuns runs = element_wise(s, static_cast<std::int64_t>(n), kAdamWRun);
  launch(s, runs, AdamWKernel{param, grad, m, v, runs, adamw_scalars(lr, h, step, decay)}, runs.grain(32768));
}

std::size_t sumsq_partials_count(std::size_t n) { return n == 0 ? 1 : (n + kSumSqBlock - 1) / kSumSqBlock; }

void sumsq_accumulate(Stream& s, const float* x, std::size_t n, float* partials, float* acc) {
  if (n == 0) return;
  std::size_t blocks = sumsq_partials_count(n);
  launch(s, blocks, SumSqBlockKernel{x, n, partials}, 4);
  launch(s, 1, SumPartialsKernel{partials, blocks, acc}, 1);
}

namespace {

// The launches of a flat run: consecutive pieces, each at most kMaxFlatSegments pieces and
// kMaxFlatElements elements long. pieces: (offset, count) in order, offsets ascending.
template <typename Piece>
std::vector<std::pair<std::size_t, std::size_t>> flat_groups(const std::vector<Piece>& pieces,
                                                             std::size_t (*offset)(const Piece&),
                                                             std::size_t (*count)(const Piece&)) {
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // [first piece, end piece)
  std::size_t first = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    STP_ASSERT(count(pieces[k]) <= kMaxFlatElements, "a flat piece of ", count(pieces[k]), " elements");
    const bool full = k - first == static_cast<std::size_t>(kMaxFlatSegments) ||
                      offset(pieces[k]) + count(pieces[k]) - offset(pieces[first]) > kMaxFlatElements;
    if (k > first && full) {
      groups.emplace_back(first, k);
      first = k;
    }
  }
  if (first < pieces.size()) groups.emplace_back(first, pieces.size());
  return groups;
}

struct FlagRun {
  std::size_t offset, count;
  bool decay, copy;
  std::size_t copy_at;  // copy elements before the run
};
std::size_t run_offset(const FlagRun& r) { return r.offset; }
std::size_t run_count(const FlagRun& r) { return r.count; }
std::size_t range_offset(const FlatRange& r) { return r.offset; }
std::size_t range_count(const FlatRange& r) { return r.count; }

// Segments merged into runs of equal flags, each at most kMaxFlatElements long.
std::vector<FlagRun> flag_runs(const std::vector<FlatSegment>& segments) {
  std::vector<FlagRun> runs;
  std::size_t at = 0, copied = 0;
  for (const FlatSegment& sg : segments) {
    if (sg.count == 0) continue;
    if (!runs.empty() && runs.back().decay == sg.decay && runs.back().copy == sg.copy &&
        runs.back().count + sg.count <= kMaxFlatElements)
      runs.back().count += sg.count;
    else
      for (std::size_t done = 0; done < sg.count; done += kMaxFlatElements)
        runs.push_back(FlagRun{at + done, std::min(kMaxFlatElements, sg.count - done), sg.decay, sg.copy,
                               copied + (sg.copy ? done : 0)});
    at += sg.count;
    if (sg.copy) copied += sg.count;
  }
  return runs;
}

std::vector<FlatRange> nonempty(const std::vector<FlatRange>& ranges) {
  std::vector<FlatRange> out;
  for (const FlatRange& r : ranges)
    if (r.count > 0) out.push_back(r);
  return out;
}

// The table of ranges [first, end) of one launch, offsets from ranges[first].offset.
SumSqRanges sumsq_table(const std::vector<FlatRange>& ranges, std::size_t first, std::size_t end) {
  SumSqRanges t;
  const std::size_t base = ranges[first].offset;
  std::uint32_t blocks = 0;
  for (std::size_t k = first; k < end; ++k) {
    const int i = t.count++;
    t.begin[i] = static_cast<std::uint32_t>(ranges[k].offset - base);
    t.end[i] = static_cast<std::uint32_t>(ranges[k].offset + ranges[k].count - base);
    t.first_block[i] = blocks;
    blocks += static_cast<std::uint32_t>(sumsq_partials_count(ranges[k].count));
  }
  t.first_block[t.count] = blocks;
  return t;
}

}  // namespace

std::size_t adamw_flat_launches(const std::vector<FlatSegment>& segments) {
  return flat_groups(flag_runs(segments), run_offset, run_count).size();
}

void adamw_flat_step(Stream& s, float* param, const float* grad, float* m, float* v,
                     const std::vector<FlatSegment>& segments, float lr, const AdamWHyper& h, int step,
                     const float* coef, bf16* copies) {
  const std::vector<FlagRun> runs = flag_runs(segments);
  const AdamWScalars c[2] = {adamw_scalars(lr, h, step, false), adamw_scalars(lr, h, step, true)};
  for (const auto& [first, end] : flat_groups(runs, run_offset, run_count)) {
    const std::size_t base = runs[first].offset;
    FlagRuns table;
    for (std::size_t k = first; k < end; ++k) {
      const int i = table.count++;
      table.end[i] = static_cast<std::uint32_t>(runs[k].offset + runs[k].count - base);
      table.decay[i] = runs[k].decay ? 1 : 0;
      table.copy[i] = runs[k].copy ? 1 : 0;
      STP_ASSERT(!runs[k].copy || copies, "adamw_flat_step: a copy segment and no copies");
      // Element i (from base) of run k is element base + i of the run, whose copy is at
      // copy_at + (base + i - offset) of copies: with copies advanced by runs[first]'s copy_at,
      // i - shift.
      table.shift[i] = static_cast<std::uint32_t>(runs[k].offset - base - (runs[k].copy_at - runs[first].copy_at));
    }
    const ElementRuns shape =
        element_wise(s, static_cast<std::int64_t>(runs[end - 1].offset + runs[end - 1].count - base), kAdamWRun);
    launch(s, shape,
           AdamWFlatKernel{param + base,
                           grad + base,
                           m + base,
                           v + base,
                           shape,
                           {c[0], c[1]},
                           coef,
                           copies ? copies + runs[first].copy_at : nullptr,
                           table},
           shape.grain(32768));
  }
}

std::size_t sumsq_flat_launches(const std::vector<FlatRange>& ranges) {
  return 2 * flat_groups(nonempty(ranges), range_offset, range_count).size();
}

std::size_t sumsq_flat_partials_count(const std::vector<FlatRange>& ranges) {
  const std::vector<FlatRange> rs = nonempty(ranges);
  std::size_t most = 1;
  for (const auto& [first, end] : flat_groups(rs, range_offset, range_count))
    most = std::max<std::size_t>(most, sumsq_table(rs, first, end).first_block[end - first]);
  return most;
}

void sumsq_flat_accumulate(Stream& s, const float* x, const std::vector<FlatRange>& ranges, float* partials,
                           float* acc) {
  const std::vector<FlatRange> rs = nonempty(ranges);
  for (const auto& [first, end] : flat_groups(rs, range_offset, range_count)) {
    const SumSqRanges t = sumsq_table(rs, first, end);
    const float* base = x + rs[first].offset;
    launch(s, t.first_block[t.count], SumSqRangeBlockKernel{base, partials, t}, 4);
    launch(s, 1, SumRangePartialsKernel{partials, acc, t}, 1);
  }
}

void clip_coefficient(Stream& s, const float* sumsq, float max_norm, float* norm, float* coef) {
  launch(s, 1, ClipCoefKernel{sumsq, max_norm, norm, coef}, 1);
}

void scale_by_scalar(Stream& s, float* x, std::size_t n, const float* coef) { launch(s, n, ScaleKernel{x, coef}); }

}  // namespace stp
