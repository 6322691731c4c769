// AdamW and global-norm clipping kernels against torch reference values
// (tests/optim/data/adamw_reference.txt, made by tools/reference/gen_adamw_reference.py).
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "core/cpu/cpu_device.h"
#include "core/kernels/optim_kernels.h"
#include "tests/support/files.h"

using namespace stp;

namespace {

std::map<std::string, std::vector<float>> load_reference() {
  std::ifstream f(std::string(STP_SOURCE_DIR) + "/tests/optim/data/adamw_reference.txt");
  EXPECT_TRUE(f.good());
  std::map<std::string, std::vector<float>> ref;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    std::string key;
    is >> key;
    float v;
    while (is >> v) ref[key].push_back(v);
  }
  return ref;
}

// Device buffers of one CPU device (device memory is host memory on the CPU backend).
struct Fixture {
  std::vector<std::unique_ptr<CpuDevice>> devs = make_cpu_devices(1);
  std::unique_ptr<Stream> s = devs[0]->create_stream("compute");
  std::vector<float*> owned;
  float* buffer(const std::vector<float>& init) {
    auto* p = static_cast<float*>(devs[0]->allocate(std::max<std::size_t>(1, init.size()) * 4));
    if (!init.empty()) std::memcpy(p, init.data(), init.size() * 4);
    owned.push_back(p);
    return p;
  }
  ~Fixture() {
    for (float* p : owned) devs[0]->deallocate(p);
  }
};

void expect_close(const float* got, const std::vector<float>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    // float32 math in a different (but equally valid) rounding order than torch's kernels:
    // agreement to a few ulps of the value.
    float tol = 4e-7f * std::max(1.0f, std::fabs(want[i]));
    EXPECT_NEAR(got[i], want[i], tol) << what << "[" << i << "]";
  }
}

void run_reference(bool clip) {
  auto ref = load_reference();
  const std::string run = clip ? "clip" : "noclip";
  Fixture fx;
  const std::size_t nw = 12, nb = 4;
  float* w = fx.buffer(ref["init.w"]);
  float* b = fx.buffer(ref["init.b"]);
  float *mw = fx.buffer(std::vector<float>(nw)), *vw = fx.buffer(std::vector<float>(nw));
  float *mb = fx.buffer(std::vector<float>(nb)), *vb = fx.buffer(std::vector<float>(nb));
  float* gw = fx.buffer(std::vector<float>(nw));
  float* gb = fx.buffer(std::vector<float>(nb));
  float* partials = fx.buffer(std::vector<float>(1));
  float* sumsq = fx.buffer({0});
  float* norm = fx.buffer({0});
  float* coef = fx.buffer({0});
  AdamWHyper h{0.9f, 0.95f, 1e-6f, 0.1f};
  for (int step = 1; step <= 5; ++step) {
    std::string k = ".step" + std::to_string(step);
    std::memcpy(gw, ref["grad" + k + ".w"].data(), nw * 4);
    std::memcpy(gb, ref["grad" + k + ".b"].data(), nb * 4);
    if (clip) {
      fx.s->zero(sumsq, 4);
      sumsq_accumulate(*fx.s, gw, nw, partials, sumsq);
      sumsq_accumulate(*fx.s, gb, nb, partials, sumsq);
      clip_coefficient(*fx.s, sumsq, 0.5f, norm, coef);
      scale_by_scalar(*fx.s, gw, nw, coef);
      scale_by_scalar(*fx.s, gb, nb, coef);
      fx.s->synchronize();
      expect_close(norm, ref[run + k + ".norm"], run + k + ".norm");
      EXPECT_LT(*coef, 1.0f);
      expect_close(gw, ref[run + k + ".clipped_w"], run + k + ".clipped_w");
      expect_close(gb, ref[run + k + ".clipped_b"], run + k + ".clipped_b");
    }
    float lr = ref["lr" + k][0];
    adamw_step(*fx.s, w, gw, mw, vw, nw, lr, h, step, /*decay=*/true);
    adamw_step(*fx.s, b, gb, mb, vb, nb, lr, h, step, /*decay=*/false);
    fx.s->synchronize();
    expect_close(w, ref[run + k + ".w"], run + k + ".w");
    expect_close(b, ref[run + k + ".b"], run + k + ".b");
  }
}

}  // namespace

TEST(OptimKernels, AdamWMatchesTorchForFiveSteps) { run_reference(false); }

TEST(OptimKernels, ClipThenAdamWMatchesTorch) { run_reference(true); }

TEST(OptimKernels, DecayOnlyWhenAsked) {
  Fixture fx;
  // Zero gradient: m = v = 0, the Adam term is 0 / (0 + eps) = 0; only decay moves p.
  float* p = fx.buffer({2.0f, -4.0f});
  float* q = fx.buffer({2.0f, -4.0f});
  float* g = fx.buffer({0, 0});
  float *m = fx.buffer({0, 0}), *v = fx.buffer({0, 0}), *m2 = fx.buffer({0, 0}), *v2 = fx.buffer({0, 0});
  AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.5f};
  adamw_step(*fx.s, p, g, m, v, 2, 0.1f, h, 1, true);
  adamw_step(*fx.s, q, g, m2, v2, 2, 0.1f, h, 1, false);
  fx.s->synchronize();
  EXPECT_FLOAT_EQ(p[0], 2.0f * (1 - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(p[1], -4.0f * (1 - 0.1f * 0.5f));
  EXPECT_EQ(q[0], 2.0f);
  EXPECT_EQ(q[1], -4.0f);
}

TEST(OptimKernels, ClipCoefficientIsClampedToOne) {
  Fixture fx;
  float* sumsq = fx.buffer({0.09f});  // norm 0.3 < max_norm 1: no scaling
  float* norm = fx.buffer({0});
  float* coef = fx.buffer({0});
  float* g = fx.buffer({0.3f});
  clip_coefficient(*fx.s, sumsq, 1.0f, norm, coef);
  scale_by_scalar(*fx.s, g, 1, coef);
  fx.s->synchronize();
  EXPECT_FLOAT_EQ(*norm, 0.3f);
  EXPECT_EQ(*coef, 1.0f);
  EXPECT_EQ(*g, 0.3f);
}

// The same bits whatever the thread count: fixed blocks, each summed in order, then in block order.
TEST(OptimKernels, SumOfSquaresIsDeterministicAcrossThreadCounts) {
  const std::size_t n = 37 * kSumSqBlock + 123;
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.001f * float(i)) * (1.0f + float(i % 7));
  // Host reference following the documented partition.
  double total = 0;
  for (std::size_t blk = 0; blk < sumsq_partials_count(n); ++blk) {
    double s = 0;
    for (std::size_t i = blk * kSumSqBlock; i < std::min(n, (blk + 1) * kSumSqBlock); ++i) s += double(x[i]) * x[i];
    total += double(float(s));
  }
  float want = float(0.5 + total);
  for (int threads : {1, 2, 3}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    for (int rep = 0; rep < 3; ++rep) {
      Fixture fx;
      float* dx = fx.buffer(x);
      float* partials = fx.buffer(std::vector<float>(sumsq_partials_count(n)));
      float* acc = fx.buffer({0.5f});  // accumulates onto what is there
      sumsq_accumulate(*fx.s, dx, n, partials, acc);
      fx.s->synchronize();
      EXPECT_EQ(std::memcmp(acc, &want, 4), 0) << "threads=" << threads << " got " << *acc << " want " << want;
    }
  }
}

namespace {

// Parameters of many sizes and both decays, back to back: more runs of equal decay than one
// fused launch holds, sizes across the CPU's runs of 8192 elements and the vector width.
std::vector<FlatSegment> many_segments() {
  std::vector<FlatSegment> out;
  for (std::size_t k = 0; k < 2 * kMaxFlatSegments + 37; ++k)
    out.push_back(FlatSegment{k % 5 == 0 ? 9000 + k : 1 + (k * 37) % 300, k % 2 == 0});
  return out;
}

std::vector<float> wave(std::size_t n, float scale, float phase) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = scale * std::sin(0.37f * float(i) + phase);
  return x;
}

}  // namespace

// The fused pass is bitwise the per-tensor one: scale_by_scalar on each gradient, then
// adamw_step on each parameter with its decay.
TEST(OptimKernels, FusedClippedAdamWIsBitwiseThePerTensorSteps) {
  const std::vector<FlatSegment> segs = many_segments();
  std::size_t n = 0;
  for (const FlatSegment& sg : segs) n += sg.count;
  EXPECT_EQ(adamw_flat_launches(segs), 3u);  // > 2 * kMaxFlatSegments runs of equal decay
  EXPECT_EQ(adamw_flat_launches({{100, true}, {5, true}, {7, false}}), 1u);
  std::vector<FlatSegment> merged;  // equal decays merge: 2 * kMaxFlatSegments tensors, 2 runs
  for (int k = 0; k < 2 * kMaxFlatSegments; ++k) merged.push_back({10, k < kMaxFlatSegments});
  EXPECT_EQ(adamw_flat_launches(merged), 1u);
  const AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  for (bool clipped : {false, true}) {
    Fixture fx;
    float *p1 = fx.buffer(wave(n, 1, 0)), *g1 = fx.buffer(wave(n, 2, 1)), *m1 = fx.buffer(std::vector<float>(n)),
          *v1 = fx.buffer(std::vector<float>(n));
    float *p2 = fx.buffer(wave(n, 1, 0)), *g2 = fx.buffer(wave(n, 2, 1)), *m2 = fx.buffer(std::vector<float>(n)),
          *v2 = fx.buffer(std::vector<float>(n));
    float* coef = fx.buffer({0.3f});
    for (int step = 1; step <= 3; ++step) {
      adamw_flat_step(*fx.s, p1, g1, m1, v1, segs, 1e-2f, h, step, clipped ? coef : nullptr);
      std::size_t at = 0;
      for (const FlatSegment& sg : segs) {
        if (clipped) scale_by_scalar(*fx.s, g2 + at, sg.count, coef);
        adamw_step(*fx.s, p2 + at, g2 + at, m2 + at, v2 + at, sg.count, 1e-2f, h, step, sg.decay);
        at += sg.count;
      }
      if (clipped) fx.s->copy(g2, g1, n * 4);  // the fused pass leaves its gradients as they were
    }
    // The fused bf16 copies of the copy segments: every third parameter's (a GEMM weight's).
    std::vector<FlatSegment> with_copies = segs;
    std::size_t copied = 0;
    for (std::size_t k = 0; k < with_copies.size(); ++k) {
      with_copies[k].copy = k % 3 == 0;
      if (with_copies[k].copy) copied += with_copies[k].count;
    }
    float *p3 = fx.buffer(wave(n, 1, 0)), *m3 = fx.buffer(std::vector<float>(n)),
          *v3 = fx.buffer(std::vector<float>(n));
    std::vector<bf16> copies(copied + 1, from_f32<bf16>(7.0f));  // one past the end: not written
    for (int step = 1; step <= 3; ++step)
      adamw_flat_step(*fx.s, p3, g1, m3, v3, with_copies, 1e-2f, h, step, clipped ? coef : nullptr, copies.data());
    EXPECT_EQ(adamw_flat_launches(with_copies), 3u);
    fx.s->synchronize();
    EXPECT_EQ(std::memcmp(p1, p3, n * 4), 0) << "clipped " << clipped;
    std::size_t at = 0, c = 0;
    for (const FlatSegment& sg : with_copies) {
      for (std::size_t i = 0; sg.copy && i < sg.count; ++i, ++c)
        ASSERT_EQ(copies[c].bits, from_f32<bf16>(p1[at + i]).bits) << "copy " << c;
      at += sg.count;
    }
    EXPECT_EQ(copies[copied].bits, from_f32<bf16>(7.0f).bits);
    EXPECT_EQ(std::memcmp(p1, p2, n * 4), 0) << "clipped " << clipped;
    EXPECT_EQ(std::memcmp(m1, m2, n * 4), 0) << "clipped " << clipped;
    EXPECT_EQ(std::memcmp(v1, v2, n * 4), 0) << "clipped " << clipped;
    EXPECT_EQ(std::memcmp(g1, wave(n, 2, 1).data(), n * 4), 0);
  }
}

// The flat sum of squares is bitwise one sumsq_accumulate per range, in range order (gaps
// between the ranges are not read), whatever the thread count.
TEST(OptimKernels, FlatSumOfSquaresIsBitwiseThePerRangeSums) {
  std::vector<FlatRange> ranges;
  std::size_t at = 0;
  for (std::size_t k = 0; k < kMaxFlatSegments + 40; ++k) {
    const std::size_t count = k % 7 == 0 ? 2 * kSumSqBlock + 5 * k : 1 + (k * 53) % 900;
    ranges.push_back(FlatRange{at, count});
    at += count + (k % 4 == 0 ? 13 : 0);  // an uncounted gradient between some ranges
  }
  ranges.push_back(FlatRange{at, 0});
  const std::vector<float> x = wave(at, 3, 0.5f);
  EXPECT_EQ(sumsq_flat_launches(ranges), 4u);  // two launches per kMaxFlatSegments ranges
  Fixture ref;
  float* rx = ref.buffer(x);
  float* racc = ref.buffer({0.25f});
  float* rpartials = ref.buffer(std::vector<float>(sumsq_partials_count(at)));
  for (const FlatRange& r : ranges) sumsq_accumulate(*ref.s, rx + r.offset, r.count, rpartials, racc);
  ref.s->synchronize();
  for (int threads : {1, 2}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    Fixture fx;
    float* dx = fx.buffer(x);
    float* acc = fx.buffer({0.25f});
    float* partials = fx.buffer(std::vector<float>(sumsq_flat_partials_count(ranges)));
    sumsq_flat_accumulate(*fx.s, dx, ranges, partials, acc);
    fx.s->synchronize();
    EXPECT_EQ(std::memcmp(acc, racc, 4), 0) << "threads " << threads << ": " << *acc << " vs " << *racc;
  }
}
