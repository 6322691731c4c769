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
