// Kernel parity: every kernel of core/kernels/ (nn_kernels.h, optim_kernels.h) and Stream::gemm
// run on a CpuDevice, the oracle, and on the device under test with the same inputs; the device's
// outputs must match the oracle's within a tolerance stated, and derived, next to each test.
//
// Instances (Backends/KernelParity.NAME/KIND):
//   * cpu  — the device under test is a second CpuDevice. The CPU kernels are deterministic (fixed
//            reduction order, nn_kernels.h) and OpenBLAS splits GEMMs over M and N only, so every
//            output must be bitwise equal: this runs every test body and the comparison here.
//   * cuda — a CudaDevice: each output within its CUDA tolerance. Skipped (with cuda_usable's
//            reason, which tools/gpu-check reads) where no GPU is usable.
//
// Where the two backends can differ, for f32 storage (u = 2^-24, the unit roundoff):
//   * nvcc contracts a * b + c into one FMA (--fmad=true, its default); the host build has no FMA
//     (no -march), so each contracted product is rounded once less on the GPU: the same fixed-order
//     sum then differs by up to about one rounding per term.
//   * expf: CUDA's has at most 2 ulp of error (CUDA C++ Programming Guide, single-precision
//     mathematical functions), glibc's under 1 ulp: up to 3 ulp apart. logf: 1 ulp each.
//   * Division and sqrtf are IEEE round-to-nearest on both (nvcc's -prec-div/-prec-sqrt default to
//     true; stp does not use --use_fast_math), and so are + and * and float <-> double conversion.
//     Kernels made only of those, evaluated in the same order with no product to contract, are
//     therefore bitwise equal on CUDA too: that is asserted (tolerance "exact").
//   * cuBLAS sums GEMM products in its own order (blocking, split-K). For any order, with or without
//     FMA, a K-term f32 dot product is within gamma_K * sum|a_p * b_p| of the exact value, gamma_K =
//     K u / (1 - K u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §3.1); two
//     such results are within twice that. No TF32: stp asks for CUBLAS_COMPUTE_32F.
// Bounds below are those worst cases (a few rounded up). Typical errors are far smaller; a wrong
// kernel (an index, a missed element, a race) is off by O(1). Every comparison on a non-CPU device
// prints its largest errors next to the tolerance, so the first GPU run shows the margins.
//
// Element types: Buf<T>, matches<T> and unit_roundoff<T> are typed on the storage type, so bf16
// instances of these tests need a to_double and a unit_roundoff for the new type, and tolerances
// scaled by its u.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/kernels/nn_kernels.h"
#include "core/kernels/optim_kernels.h"
#include "tests/support/devices.h"

namespace {

using stp::DeviceKind;
using stp::Stream;
using i64 = std::int64_t;

// ---- Comparison -------------------------------------------------------------------------------

template <typename T>
constexpr double unit_roundoff();
template <>
constexpr double unit_roundoff<float>() { return 0x1p-24; }

template <typename T>
double to_double(T v) { return static_cast<double>(v); }

constexpr double kU = unit_roundoff<float>();

// How close element i of the device's output must be to the oracle's:
//   |got_i - want_i| <= rel * |want_i| + abs + of_max * max_j |want_j| + bound[i] (bound optional).
// The default, all zero, means bitwise: the same bytes (so -0 vs +0 or two NaNs are judged by bits).
struct Tolerance {
  double rel = 0, abs = 0, of_max = 0;
  std::vector<double> bound;  // per-element absolute bound (GEMM error bounds), or empty

  static Tolerance exact() { return {}; }
  bool bitwise() const { return rel == 0 && abs == 0 && of_max == 0 && bound.empty(); }
  std::string describe() const {
    if (bitwise()) return "bitwise";
    std::ostringstream s;
    s << "rel " << rel << ", abs " << abs << ", of_max " << of_max << (bound.empty() ? "" : ", per-element bound");
    return s.str();
  }
};

// Largest errors of got against want, and whether they are within tol. The message always carries
// the largest absolute and relative errors; on failure also how many elements failed and the worst.
template <typename T>
::testing::AssertionResult matches(const std::vector<T>& got, const std::vector<T>& want, const Tolerance& tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << want.size();
  if (!tol.bound.empty() && tol.bound.size() != want.size())
    return ::testing::AssertionFailure() << "tolerance has " << tol.bound.size() << " bounds for " << want.size() << " elements";
  double scale = 0;
  for (const T& w : want) scale = std::max(scale, std::fabs(to_double(w)));
  std::size_t bad = 0, worst = 0;
  double max_abs = 0, max_rel = 0, worst_excess = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    double g = to_double(got[i]), w = to_double(want[i]);
    double err = std::fabs(g - w);
    if (!std::isnan(err)) {
      max_abs = std::max(max_abs, err);
      if (w != 0) max_rel = std::max(max_rel, err / std::fabs(w));
    }
    bool ok;
    double allowed = 0;
    if (tol.bitwise()) {
      ok = std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
    } else {
      allowed = tol.rel * std::fabs(w) + tol.abs + tol.of_max * scale + (tol.bound.empty() ? 0.0 : tol.bound[i]);
      ok = err <= allowed;  // false for NaN
    }
    if (!ok) {
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  auto result = bad ? ::testing::AssertionFailure() : ::testing::AssertionSuccess();
  result << "max abs error " << max_abs << ", max rel error " << max_rel << " over " << want.size()
         << " elements (largest |want| " << scale << "; tolerance " << tol.describe() << ")";
  if (bad) {
    double w = to_double(want[worst]);
    result << "; " << bad << " outside it, worst [" << worst << "]: got " << to_double(got[worst]) << ", want " << w
           << ", allowed error "
           << (tol.bitwise() ? 0.0 : tol.rel * std::fabs(w) + tol.abs + tol.of_max * scale + (tol.bound.empty() ? 0.0 : tol.bound[worst]));
  }
  return result;
}

// The comparison itself must be able to fail: one ulp breaks "bitwise", an error just past the
// bound breaks a tolerance, NaN breaks both.
TEST(ParityCompare, BitwiseRejectsOneUlpAndNegativeZero) {
  std::vector<float> want = {1.0f, -2.5f, 0.0f, 3.0e-3f};
  EXPECT_TRUE(matches(want, want, Tolerance::exact()));
  std::vector<float> got = want;
  got[3] = std::nextafter(got[3], 1.0f);
  EXPECT_FALSE(matches(got, want, Tolerance::exact()));
  got = want;
  got[2] = -0.0f;
  EXPECT_FALSE(matches(got, want, Tolerance::exact()));
}

TEST(ParityCompare, ToleranceAcceptsUpToTheBoundAndNoFurther) {
  std::vector<float> want = {1.0f, -2.0f, 0.5f};
  Tolerance tol{.rel = 1e-3, .abs = 0, .of_max = 0, .bound = {}};
  std::vector<float> got = {1.0005f, -2.0015f, 0.5f};  // within 1e-3 * |want|
  EXPECT_TRUE(matches(got, want, tol));
  got[1] = -2.0025f;  // 1.25e-3 relative
  auto r = matches(got, want, tol);
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("worst [1]"), std::string::npos) << r.message();
  // of_max: relative to the largest |want| (2), so 0.5 may be off by 2e-3 * 2.
  Tolerance norm{.rel = 0, .abs = 0, .of_max = 2e-3, .bound = {}};
  EXPECT_TRUE(matches(std::vector<float>{1.0f, -2.0f, 0.5035f}, want, norm));
  EXPECT_FALSE(matches(std::vector<float>{1.0f, -2.0f, 0.5045f}, want, norm));
  // Per-element bounds.
  Tolerance per{.rel = 0, .abs = 0, .of_max = 0, .bound = {0, 0, 0.01}};
  EXPECT_TRUE(matches(std::vector<float>{1.0f, -2.0f, 0.509f}, want, per));
  EXPECT_FALSE(matches(std::vector<float>{1.0f, -1.999f, 0.5f}, want, per));
  got = want;
  got[0] = NAN;
  EXPECT_FALSE(matches(got, want, Tolerance{.rel = 1, .abs = 1, .of_max = 1, .bound = {}}));
}

// ---- Oracle and device under test ---------------------------------------------------------------

// A buffer with one copy per side: [0] on the oracle, [1] on the device under test.
template <typename T>
struct Buf {
  T* on[2] = {nullptr, nullptr};
  std::size_t n = 0;
};

// Picks one side's pointer of a Buf inside KernelParity::run.
struct Side {
  int i;
  template <typename T>
  T* operator()(const Buf<T>& b) const { return b.on[i]; }
};

class KernelParity : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    STP_DEVICES_OR_SKIP(dut, GetParam(), 1);
    stp::BackendOptions o;  // the oracle: always a CpuDevice of its own
    dev_[0] = std::move(stp::make_devices(o)[0]);
    dev_[1] = std::move(dut[0]);
    for (int i = 0; i < 2; ++i) stream_[i] = dev_[i]->create_stream("compute");
  }

  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (!stream_[i]) continue;
      stream_[i]->synchronize();
      for (void* p : owned_[i]) dev_[i]->deallocate(p);
    }
  }

  bool on_cpu() const { return GetParam() == DeviceKind::Cpu; }

  // The same bytes on both sides.
  template <typename T>
  Buf<T> upload(const std::vector<T>& host) {
    Buf<T> b;
    b.n = host.size();
    for (int i = 0; i < 2; ++i) {
      b.on[i] = static_cast<T*>(dev_[i]->allocate(std::max<std::size_t>(1, host.size()) * sizeof(T)));
      owned_[i].push_back(b.on[i]);
      if (!host.empty()) stream_[i]->copy(b.on[i], host.data(), host.size() * sizeof(T));
      stream_[i]->synchronize();  // host dies with the caller
    }
    return b;
  }

  template <typename T>
  std::vector<T> download(const Buf<T>& b, int side) {
    std::vector<T> out(b.n);
    stream_[side]->copy(out.data(), b.on[side], b.n * sizeof(T));
    stream_[side]->synchronize();
    return out;
  }

  // f(stream, side) enqueues the kernel under test with side(buf) as pointers: once on each side.
  template <typename F>
  void run(F f) {
    for (int i = 0; i < 2; ++i) f(*stream_[i], Side{i});
  }

  // The device's copy of b against the oracle's: bitwise on a CPU device, `cuda` on a GPU.
  template <typename T>
  void expect_match(const char* what, const Buf<T>& b, const Tolerance& cuda) {
    std::vector<T> want = download(b, 0), got = download(b, 1);
    const Tolerance& tol = on_cpu() ? Tolerance::exact() : cuda;
    auto r = matches(got, want, tol);
    EXPECT_TRUE(r) << what << ": " << r.message();
    if (!on_cpu() && r) std::cout << "[parity] " << what << ": " << r.message() << "\n";
  }

  std::vector<float> uniform(std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  std::vector<std::int32_t> tokens(std::size_t n, int below) {
    std::uniform_int_distribution<int> d(0, below - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  std::mt19937 rng_{20240611};
  std::unique_ptr<stp::Device> dev_[2];
  std::unique_ptr<Stream> stream_[2];
  std::vector<void*> owned_[2];
};

// ---- GEMM error bound -------------------------------------------------------------------------------

// Per element of C = alpha * op(A) op(B) + beta * C0 (row-major, GemmArgs conventions): the largest
// difference between two f32 evaluations in different orders, 2 * gamma_{K+2} * (|alpha| sum_p
// |a_ip b_pj| + |beta c_ij|) (K products, the alpha scaling and the beta add; see the file header).
std::vector<double> gemm_bound(const stp::GemmArgs& g, const std::vector<float>& a, const std::vector<float>& b,
                               const std::vector<float>& c0) {
  const double gamma = (g.k + 2) * kU / (1 - (g.k + 2) * kU);
  std::vector<double> out(static_cast<std::size_t>(g.m) * g.n);
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double s = 0;
      for (int p = 0; p < g.k; ++p) {
        double av = g.trans_a ? a[static_cast<std::size_t>(p) * g.lda + i] : a[static_cast<std::size_t>(i) * g.lda + p];
        double bv = g.trans_b ? b[static_cast<std::size_t>(j) * g.ldb + p] : b[static_cast<std::size_t>(p) * g.ldb + j];
        s += std::fabs(av * bv);
      }
      double c = g.beta != 0 ? std::fabs(g.beta * c0[static_cast<std::size_t>(i) * g.ldc + j]) : 0;
      out[static_cast<std::size_t>(i) * g.n + j] = 2 * gamma * (std::fabs(g.alpha) * s + c);
    }
  return out;
}

// ---- Stream::gemm -----------------------------------------------------------------------------------

// Every transposition, alpha/beta, leading dimensions wider than the matrices (as attention's
// head slices use). Tolerance: gemm_bound per element. ldc == n here so C is compared whole.
TEST_P(KernelParity, Gemm) {
  struct Shape { int m, n, k; };
  for (Shape sh : {Shape{37, 29, 53}, Shape{64, 48, 300}, Shape{5, 70, 1}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(::testing::Message() << sh.m << "x" << sh.n << "x" << sh.k << " ta=" << ta << " tb=" << tb);
        stp::GemmArgs g;
        g.trans_a = ta, g.trans_b = tb;
        g.m = sh.m, g.n = sh.n, g.k = sh.k;
        g.alpha = 0.75f, g.beta = -1.5f;
        g.lda = (ta ? sh.m : sh.k) + 3, g.ldb = (tb ? sh.k : sh.n) + 5, g.ldc = sh.n;
        auto a = uniform(static_cast<std::size_t>(ta ? sh.k : sh.m) * g.lda, -1, 1);
        auto b = uniform(static_cast<std::size_t>(tb ? sh.n : sh.k) * g.ldb, -1, 1);
        auto c = uniform(static_cast<std::size_t>(sh.m) * sh.n, -1, 1);
        auto da = upload(a), db = upload(b), dc = upload(c);
        run([&](Stream& s, Side at) {
          stp::GemmArgs h = g;
          h.a = at(da), h.b = at(db), h.c = at(dc);
          s.gemm(h);
        });
        expect_match("C", dc, {.rel = 0, .abs = 0, .of_max = 0, .bound = gemm_bound(g, a, b, c)});
      }
}

// ---- LayerNorm -------------------------------------------------------------------------------------

constexpr i64 kRows = 300, kC = 96;  // 300 rows: two CUDA blocks of 256 threads

TEST_P(KernelParity, LayerNormForward) {
  auto x = uniform(kRows * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), b = uniform(kC, -0.5f, 0.5f);
  auto dx = upload(x), dw = upload(w), db = upload(b);
  auto out = upload(uniform(kRows * kC, -9, 9)), mean = upload(uniform(kRows, -9, 9)), rstd = upload(uniform(kRows, -9, 9));
  run([&](Stream& s, Side at) { stp::layernorm_forward(s, at(out), at(mean), at(rstd), at(dx), at(dw), at(db), kRows, kC); });
  // mean: C adds in index order and one division: exact.
  expect_match("mean", mean, Tolerance::exact());
  // rstd: the variance sums C squares, each (x-m)*(x-m) + v contracted on CUDA: a positive sum whose
  // roundings may all differ, so relatively C u apart; the square root halves it; + eps, sqrtf and
  // 1 / . may each flip a rounding: (C/2 + 3) u, doubled and rounded up.
  expect_match("rstd", rstd, {.rel = (kC + 8) * kU, .abs = 0, .of_max = 0, .bound = {}});
  // out = xhat * w + b (contracted on CUDA): xhat carries rstd's (C/2 + 2) u and 2 u of its own,
  // relative to |xhat * w| <= max|out| + max|b|; (C + 16) u of the largest output covers that twice.
  expect_match("out", out, {.rel = 2 * kU, .abs = 0, .of_max = (kC + 16) * kU, .bound = {}});
}

TEST_P(KernelParity, LayerNormBackwardInput) {
  auto x = uniform(kRows * kC, -2, 3), w = uniform(kC, 0.5f, 1.5f), dout = uniform(kRows * kC, -1, 1);
  // mean and rstd as the forward saves them (from the oracle), the same on both sides.
  std::vector<float> m(kRows), r(kRows);
  for (i64 n = 0; n < kRows; ++n) {
    double s = 0, s2 = 0;
    for (i64 c = 0; c < kC; ++c) s += x[static_cast<std::size_t>(n * kC + c)];
    for (i64 c = 0; c < kC; ++c) s2 += std::pow(x[static_cast<std::size_t>(n * kC + c)] - s / kC, 2);
    m[static_cast<std::size_t>(n)] = static_cast<float>(s / kC);
    r[static_cast<std::size_t>(n)] = static_cast<float>(1 / std::sqrt(s2 / kC + 1e-5));
  }
  auto dx_ = upload(x), dw = upload(w), dd = upload(dout), dm = upload(m), dr = upload(r);
  auto resid = upload(uniform(kRows * kC, -1, 1));
  auto out = upload(uniform(kRows * kC, -9, 9)), out_resid = upload(uniform(kRows * kC, -9, 9));
  auto in_place = upload(uniform(kRows * kC, -1, 1));  // resid aliasing dx (the residual stream's gradient)
  run([&](Stream& s, Side at) {
    stp::layernorm_backward_input(s, at(out), nullptr, at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
    stp::layernorm_backward_input(s, at(out_resid), at(resid), at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
    stp::layernorm_backward_input(s, at(in_place), at(in_place), at(dd), at(dx_), at(dm), at(dr), at(dw), kRows, kC);
  });
  // dx = resid + rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * w. Both row means are
  // C-term sums of products (2 roundings each, contracted on CUDA): each evaluation within
  // gamma_{C+2} sum|terms| of the exact sum, so the means are 2 gamma_{C+2} sum|terms| / C apart;
  // they enter dx times rstd and times rstd |xhat|. The elementwise part (4 operations, the
  // residual add) adds 8 u of its terms. Per element, doubled.
  std::vector<double> bound(kRows * kC);
  const double gamma = (kC + 2) * kU / (1 - (kC + 2) * kU);
  for (i64 n = 0; n < kRows; ++n) {
    const double rs = r[static_cast<std::size_t>(n)];
    double sg = 0, sgx = 0, g_mean = 0, gx_mean = 0;
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = (x[i] - m[static_cast<std::size_t>(n)]) * rs;
      sg += std::fabs(g), sgx += std::fabs(g * xh), g_mean += g / kC, gx_mean += g * xh / kC;
    }
    for (i64 c = 0; c < kC; ++c) {
      auto i = static_cast<std::size_t>(n * kC + c);
      double g = double(dout[i]) * w[static_cast<std::size_t>(c)], xh = (x[i] - m[static_cast<std::size_t>(n)]) * rs;
      double means = rs * 2 * gamma * (sg + std::fabs(xh) * sgx) / kC;
      double elementwise = 8 * kU * (rs * (std::fabs(g) + std::fabs(g_mean) + std::fabs(xh * gx_mean)) + 2.0);  // |resid| <= 1
      bound[i] = 2 * (means + elementwise);
    }
  }
  const Tolerance tol{.rel = 0, .abs = 0, .of_max = 0, .bound = bound};
  expect_match("dx", out, tol);
  expect_match("dx + resid", out_resid, tol);
  expect_match("dx += (in place)", in_place, tol);
}

// Per-channel sums over rows: sum_n dout * xhat (contracted on CUDA) and sum_n dout (adds only).
TEST_P(KernelParity, LayerNormBackwardWeight) {
  auto x = uniform(kRows * kC, -2, 3), dout = uniform(kRows * kC, -1, 1);
  auto m = uniform(kRows, 0.4f, 0.6f), r = uniform(kRows, 0.6f, 0.8f);
  auto dwi = uniform(kC, -1, 1), dbi = uniform(kC, -1, 1);  // accumulates onto what is there
  auto dx_ = upload(x), dd = upload(dout), dm = upload(m), dr = upload(r), dw = upload(dwi), db = upload(dbi);
  run([&](Stream& s, Side at) {
    stp::layernorm_backward_weight_accumulate(s, at(dw), at(db), at(dd), at(dx_), at(dm), at(dr), kRows, kC);
  });
  // dw: an N-term dot product (+ the initial value) evaluated with and without FMA: the GEMM bound
  // 2 gamma_{N+2} (sum_n |dout * xhat| + |dw0|), xhat itself 2 u apart at most (the same two
  // roundings on both sides unless contracted): 4 u more of the sum.
  std::vector<double> bound(kC);
  const double gamma = (kRows + 4) * kU;
  for (i64 c = 0; c < kC; ++c) {
    double s = 0;
    for (i64 n = 0; n < kRows; ++n) {
      auto i = static_cast<std::size_t>(n * kC + c);
      s += std::fabs(double(dout[i]) * (x[i] - m[static_cast<std::size_t>(n)]) * r[static_cast<std::size_t>(n)]);
    }
    bound[static_cast<std::size_t>(c)] = 2 * gamma * (s + std::fabs(dwi[static_cast<std::size_t>(c)]));
  }
  expect_match("dw", dw, {.rel = 0, .abs = 0, .of_max = 0, .bound = bound});
  // db: N adds in row order, then one add: exact.
  expect_match("db", db, Tolerance::exact());
}

// ---- Linear layers -----------------------------------------------------------------------------

constexpr i64 kIn = 48, kOut = 72;

// y = init + x W, init = bias (+ resid) (one add, exact on both): a GEMM with beta = 1 and C0 = init.
TEST_P(KernelParity, LinearForward) {
  auto x = uniform(kRows * kIn, -1, 1), W = uniform(kIn * kOut, -0.5f, 0.5f), bias = uniform(kOut, -1, 1);
  auto resid = uniform(kRows * kOut, -1, 1);
  auto dx_ = upload(x), dW = upload(W), db = upload(bias), dr = upload(resid);
  auto y_full = upload(uniform(kRows * kOut, -9, 9)), y_bias = upload(uniform(kRows * kOut, -9, 9)),
       y_none = upload(uniform(kRows * kOut, -9, 9));
  run([&](Stream& s, Side at) {
    stp::linear_forward(s, at(y_full), at(dx_), at(dW), at(db), at(dr), kRows, kIn, kOut);
    stp::linear_forward(s, at(y_bias), at(dx_), at(dW), at(db), nullptr, kRows, kIn, kOut);
    stp::linear_forward(s, at(y_none), at(dx_), at(dW), nullptr, nullptr, kRows, kIn, kOut);
  });
  stp::GemmArgs g;
  g.m = kRows, g.n = kOut, g.k = kIn, g.lda = kIn, g.ldb = kOut, g.ldc = kOut;
  g.beta = 1;
  std::vector<float> init_full(kRows * kOut), init_bias(kRows * kOut);
  for (std::size_t i = 0; i < init_full.size(); ++i) {
    init_bias[i] = bias[i % kOut];
    init_full[i] = bias[i % kOut] + resid[i];
  }
  expect_match("y = x W + bias + resid", y_full, {.rel = 0, .abs = 0, .of_max = 0, .bound = gemm_bound(g, x, W, init_full)});
  expect_match("y = x W + bias", y_bias, {.rel = 0, .abs = 0, .of_max = 0, .bound = gemm_bound(g, x, W, init_bias)});
  g.beta = 0;
  expect_match("y = x W", y_none, {.rel = 0, .abs = 0, .of_max = 0, .bound = gemm_bound(g, x, W, {})});
}

// dx = dy W^T: a GEMM with K = out.
TEST_P(KernelParity, LinearBackwardInput) {
  auto dy = uniform(kRows * kOut, -1, 1), W = uniform(kIn * kOut, -0.5f, 0.5f);
  auto ddy = upload(dy), dW = upload(W), dx = upload(uniform(kRows * kIn, -9, 9));
  run([&](Stream& s, Side at) { stp::linear_backward_input(s, at(dx), at(ddy), at(dW), kRows, kIn, kOut); });
  stp::GemmArgs g;
  g.trans_b = true;
  g.m = kRows, g.n = kIn, g.k = kOut, g.lda = kOut, g.ldb = kOut, g.ldc = kIn;
  expect_match("dx", dx, {.rel = 0, .abs = 0, .of_max = 0, .bound = gemm_bound(g, dy, W, {})});
}

// dW += x^T dy (a GEMM with K = N, beta = 1), dbias += column sums of dy (adds only: exact).
TEST_P(KernelParity, LinearBackwardWeight) {
  auto x = uniform(kRows * kIn, -1, 1), dy = uniform(kRows * kOut, -1, 1);
  auto W0 = uniform(kIn * kOut, -1, 1), b0 = uniform(kOut, -1, 1);
  auto dx_ = upload(x), ddy = upload(dy), dW = upload(W0), db = upload(b0), dW_only = upload(W0);
  run([&](Stream& s, Side at) {
    stp::linear_backward_weight_accumulate(s, at(dW), at(db), at(dx_), at(ddy), kRows, kIn, kOut);
    stp::linear_backward_weight_accumulate(s, at(dW_only), nullptr, at(dx_), at(ddy), kRows, kIn, kOut);
  });
  stp::GemmArgs g;
  g.trans_a = true;
  g.m = kIn, g.n = kOut, g.k = kRows, g.lda = kIn, g.ldb = kOut, g.ldc = kOut;
  g.beta = 1;
  const auto bound = gemm_bound(g, x, dy, W0);
  expect_match("dW", dW, {.rel = 0, .abs = 0, .of_max = 0, .bound = bound});
  expect_match("dW (no bias)", dW_only, {.rel = 0, .abs = 0, .of_max = 0, .bound = bound});
  expect_match("dbias", db, Tolerance::exact());
}

// db[j] += sum_n dy[n, j]: adds in row order only: exact.
TEST_P(KernelParity, ColumnSum) {
  const i64 n = 513, m = 300;
  auto dy = upload(uniform(n * m, -1, 1)), db = upload(uniform(m, -1, 1));
  run([&](Stream& s, Side at) { stp::column_sum_accumulate(s, at(db), at(dy), n, m); });
  expect_match("db", db, Tolerance::exact());
}

// ---- GELU, add -------------------------------------------------------------------------------------

constexpr i64 kElems = 100003;  // several CUDA blocks, a partial last one

// gelu(x) = x * s, s = 1 / (1 + expf(-2u)), u = c (x + 0.044715 x^3). u is 3 u (unit roundoff)
// apart at most (the cubic term's product may be contracted; same sign, no cancellation), so
// exp(-2u) is (6 |u| + 3) u apart (3 ulp of expf); s and x * s add 3 roundings. |x| <= 4 here gives
// |u| <= 5.5: 39 u, rounded up to 64 u, relative (no cancellation anywhere).
constexpr double kGeluRel = 64 * kU;

TEST_P(KernelParity, GeluForward) {
  auto x = upload(uniform(kElems, -4, 4)), y = upload(uniform(kElems, -9, 9));
  run([&](Stream& s, Side at) { stp::gelu_forward(s, at(y), at(x), kElems); });
  expect_match("y", y, {.rel = kGeluRel, .abs = 0, .of_max = 0, .bound = {}});
}

// dx = dy * (s + x u' 2 s (1 - s)): s is 3 u apart where it matters (the error of exp(-2u)
// enters s scaled by s (1 - s)), the second term <= ~1.1 in size; the sum cancels near x = -0.75, so
// the bound is absolute in |dy| (<= 1 here): 64 u, with the relative 64 u for the rest.
TEST_P(KernelParity, GeluBackward) {
  auto x = upload(uniform(kElems, -4, 4)), dy = upload(uniform(kElems, -1, 1)), dx = upload(uniform(kElems, -9, 9));
  auto in_place = upload(uniform(kElems, -1, 1));  // dx aliasing dy
  run([&](Stream& s, Side at) {
    stp::gelu_backward(s, at(dx), at(dy), at(x), kElems);
    stp::gelu_backward(s, at(in_place), at(in_place), at(x), kElems);
  });
  const Tolerance tol{.rel = kGeluRel, .abs = 64 * kU, .of_max = 0, .bound = {}};
  expect_match("dx", dx, tol);
  expect_match("dx (in place)", in_place, tol);
}

// One IEEE add per element: exact.
TEST_P(KernelParity, Add) {
  auto a = upload(uniform(kElems, -1, 1)), b = upload(uniform(kElems, -1e3f, 1e3f)), y = upload(uniform(kElems, -9, 9));
  auto in_place = upload(uniform(kElems, -1, 1));
  run([&](Stream& s, Side at) {
    stp::add(s, at(y), at(a), at(b), kElems);
    stp::add(s, at(in_place), at(in_place), at(b), kElems);
  });
  expect_match("y", y, Tolerance::exact());
  expect_match("y (in place)", in_place, Tolerance::exact());
}

// ---- Embedding -------------------------------------------------------------------------------------

constexpr i64 kB = 3, kT = 16, kEmb = 24, kV = 50;

// out = wte[token] + wpe[t]: one add per element: exact.
TEST_P(KernelParity, EmbeddingForward) {
  auto tok = upload(tokens(kB * kT, kV));
  auto wte = upload(uniform(kV * kEmb, -1, 1)), wpe = upload(uniform((kT + 4) * kEmb, -1, 1));
  auto out = upload(uniform(kB * kT * kEmb, -9, 9));
  run([&](Stream& s, Side at) { stp::embedding_forward(s, at(out), at(tok), at(wte), at(wpe), kB, kT, kEmb); });
  expect_match("out", out, Tolerance::exact());
}

// dwte[v] += the rows of token v summed in row order (a stable counting sort, integers), dwpe[t] +=
// sum over the batch: adds only, in a fixed order: exact. Tokens are drawn below 37 of 50 so some
// entries get no rows (and must keep their value), and many get several.
TEST_P(KernelParity, EmbeddingBackward) {
  auto tok = upload(tokens(kB * kT, 37));
  auto dout = upload(uniform(kB * kT * kEmb, -1, 1));
  auto dwte = upload(uniform(kV * kEmb, -1, 1)), dwpe = upload(uniform((kT + 4) * kEmb, -1, 1));
  auto ws = upload(std::vector<std::int32_t>(static_cast<std::size_t>(stp::embedding_backward_workspace(kV, kB * kT)), -1));
  run([&](Stream& s, Side at) {
    stp::embedding_backward_accumulate(s, at(dwte), at(dwpe), at(dout), at(tok), at(ws), kB, kT, kEmb, kV);
  });
  expect_match("dwte", dwte, Tolerance::exact());
  expect_match("dwpe", dwpe, Tolerance::exact());
}

// ---- Attention -------------------------------------------------------------------------------------

constexpr i64 kAB = 2, kAT = 16, kNH = 3, kD = 8, kW = kNH * kD;

// Scores q.k / sqrt(D): GEMMs with K = D, within 2 gamma_{D+2} sum|q k| / sqrt(D) <= 2 (D+2) u
// sqrt(D) (|q|, |k| <= 1) = 57 u apart. Softmax turns score errors d into a relative error <= 2 d
// in att, plus the subtraction of the row max (|s - max| <= 2 sqrt(D): 6 u), 3 ulp of expf and up
// to T flipped roundings of the row sum (same order): (114 + 6 + 3 + 16 + 2) u = 141 u -> 256 u
// relative. y = att v (K = T): att's relative error times sum att |v| <= 1, plus 2 gamma_{T+2}
// sum att |v| <= 36 u: 177 u -> 512 u absolute (|v| <= 1, so |y| <= 1).
TEST_P(KernelParity, AttentionForward) {
  auto qkv = upload(uniform(kAB * kAT * 3 * kW, -1, 1));
  auto y = upload(uniform(kAB * kAT * kW, -9, 9)), att = upload(uniform(kAB * kNH * kAT * kAT, -9, 9));
  run([&](Stream& s, Side at) { stp::attention_forward(s, at(y), at(att), at(qkv), kAB, kAT, kNH, kD); });
  expect_match("att", att, {.rel = 256 * kU, .abs = 0, .of_max = 0, .bound = {}});
  expect_match("y", y, {.rel = 0, .abs = 512 * kU, .of_max = 0, .bound = {}});
}

// Backward, with the same att on both sides (the oracle's forward), |q|, |k|, |v|, |dy| <= 1:
//   datt = dy v^T (K = D): within 2 gamma_{D+2} sum|dy v| <= 160 u.
//   dv = att^T dy (K = T): 2 gamma_{T+2} sum_t att_tj |dy_t| <= 36 u * (column sum of att <= T) = 576 u.
//   dscores = att (datt - sum_j att datt) / sqrt(D): datt's 160 u, the dot's 160 u + T u max|datt|
//     (<= D) = 128 u: att_ij * 448 u / sqrt(8) <= att_ij * 160 u.
//   dq = dscores k (K = T, over a row of att, which sums to 1): 160 u + 2 gamma_{T+2} sum|ds k|
//     (|ds| <= att * 2 D / sqrt(D)) <= 160 u + 36 u * 5.7 = 365 u.
//   dk = dscores^T q (K = T, over a column of att, which sums to <= T): 16 * 365 u = 5840 u.
// 8192 u (4.9e-4) absolute bounds every part of dqkv. These are worst cases; a wrong index or a
// missed head is off by O(0.1 .. 1).
TEST_P(KernelParity, AttentionBackward) {
  auto qkv_h = uniform(kAB * kAT * 3 * kW, -1, 1);
  auto qkv = upload(qkv_h);
  auto y = upload(std::vector<float>(kAB * kAT * kW)), att_fwd = upload(std::vector<float>(kAB * kNH * kAT * kAT));
  stp::attention_forward(*stream_[0], y.on[0], att_fwd.on[0], qkv.on[0], kAB, kAT, kNH, kD);
  auto att = upload(download(att_fwd, 0));  // the oracle's att, on both sides
  auto dy = upload(uniform(kAB * kAT * kW, -1, 1));
  auto dqkv = upload(uniform(kAB * kAT * 3 * kW, -9, 9)), datt = upload(uniform(kAB * kNH * kAT * kAT, -9, 9));
  run([&](Stream& s, Side at) {
    stp::attention_backward(s, at(dqkv), at(datt), at(dy), at(qkv), at(att), kAB, kAT, kNH, kD);
  });
  expect_match("dqkv", dqkv, {.rel = 0, .abs = 8192 * kU, .of_max = 0, .bound = {}});
}

// ---- Cross-entropy --------------------------------------------------------------------------------

constexpr i64 kCeN = 40, kCeV = 257;

// lse = max + logf(sum_v expf(l - max)): V positive terms added in the same order, each 3 ulp
// apart (expf), so the sums are within (V + 3) u relative (a rounding of each partial sum may
// flip); logf turns that into an absolute (V + 3) u + 2 ulp of |lse|. losses = lse - l[target]
// (same target logit) adds one rounding: (V + 8) u (1 + max|lse|) absolute for both. loss = mean
// of losses (N adds in order, one division): their error + (N + 2) u of the largest loss.
TEST_P(KernelParity, CrossEntropyForward) {
  auto logits = uniform(kCeN * kCeV, -3, 3);
  auto dl = upload(logits);
  auto tg = upload(tokens(kCeN, kCeV));
  auto loss = upload(std::vector<float>{-9}), losses = upload(uniform(kCeN, -9, 9)), lse = upload(uniform(kCeN, -9, 9));
  run([&](Stream& s, Side at) { stp::cross_entropy_forward(s, at(loss), at(losses), at(lse), at(dl), at(tg), kCeN, kCeV); });
  std::vector<float> want_lse = download(lse, 0), want_losses = download(losses, 0);
  double max_lse = 0, max_loss = 0;
  for (float v : want_lse) max_lse = std::max(max_lse, double(std::fabs(v)));
  for (float v : want_losses) max_loss = std::max(max_loss, double(std::fabs(v)));
  const double rows = (kCeV + 8) * kU * (1 + max_lse);
  expect_match("lse", lse, {.rel = 0, .abs = rows, .of_max = 0, .bound = {}});
  expect_match("losses", losses, {.rel = 0, .abs = rows, .of_max = 0, .bound = {}});
  expect_match("loss", loss, {.rel = 0, .abs = rows + (kCeN + 2) * kU * max_loss, .of_max = 0, .bound = {}});
}

// dlogits = expf(l - lse) * scale (lse: the oracle's, on both sides), minus scale at the target:
// 3 ulp of expf + 1 rounding relative, and at the target an absolute 4 u * scale (p - 1 may cancel);
// 8 u of each, doubled.
TEST_P(KernelParity, CrossEntropyBackward) {
  auto logits = uniform(kCeN * kCeV, -3, 3);
  auto tg_h = tokens(kCeN, kCeV);
  auto dl0 = upload(logits);
  auto tg = upload(tg_h);
  auto loss = upload(std::vector<float>{0}), losses = upload(std::vector<float>(kCeN)), lse_fwd = upload(std::vector<float>(kCeN));
  stp::cross_entropy_forward(*stream_[0], loss.on[0], losses.on[0], lse_fwd.on[0], dl0.on[0], tg.on[0], kCeN, kCeV);
  auto lse = upload(download(lse_fwd, 0));
  auto dl = upload(logits);
  const float scale = 1.0f / kCeN;
  run([&](Stream& s, Side at) { stp::cross_entropy_backward_inplace(s, at(dl), at(lse), at(tg), scale, kCeN, kCeV); });
  expect_match("dlogits", dl, {.rel = 8 * kU, .abs = 8 * kU * scale, .of_max = 0, .bound = {}});
}

// ---- Optimizer ---------------------------------------------------------------------------------------

// m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p = p (1 - lr wd) - step_size m / (sqrt(v) / c2 +
// eps): each line has one product CUDA may contract (one rounding less) and m may cancel, so m and
// v are within 2 u of their terms (<= max|m|, max|g|); the update's quotient carries m's error
// over denom (v >= 0.01 here, so denom >= 0.1 c2^-1) and 3 roundings; p adds 2 roundings. 8 u
// relative plus 8 u of the largest value, for all three.
TEST_P(KernelParity, AdamWStep) {
  const std::size_t n = 5000;
  stp::AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  auto p = upload(uniform(n, -1, 1)), g = upload(uniform(n, -1, 1)), m = upload(uniform(n, -0.3f, 0.3f)),
       v = upload(uniform(n, 0.01f, 1));
  auto q = upload(uniform(n, -1, 1)), mq = upload(uniform(n, -0.3f, 0.3f)), vq = upload(uniform(n, 0.01f, 1));
  run([&](Stream& s, Side at) {
    for (int step = 1; step <= 3; ++step) stp::adamw_step(s, at(p), at(g), at(m), at(v), n, 0.05f, h, step, /*decay=*/true);
    stp::adamw_step(s, at(q), at(g), at(mq), at(vq), n, 0.05f, h, 7, /*decay=*/false);
  });
  // Three chained steps: the differences of one step enter the next unamplified (m, v are
  // averages), so the per-step bound times 3.
  const Tolerance three{.rel = 24 * kU, .abs = 0, .of_max = 24 * kU, .bound = {}};
  const Tolerance one{.rel = 8 * kU, .abs = 0, .of_max = 8 * kU, .bound = {}};
  expect_match("p (3 steps, decay)", p, three);
  expect_match("m (3 steps)", m, three);
  expect_match("v (3 steps)", v, three);
  expect_match("p (step 7, no decay)", q, one);
  expect_match("m (step 7)", mq, one);
  expect_match("v (step 7)", vq, one);
}

// Clipping end to end: sumsq over two tensors (more than one block of kSumSqBlock), the
// coefficient, the scaling. All exact on CUDA: a product of two floats is exact in double, so a
// contracted double FMA x * x + s rounds once as the separate multiply-add does; the block and
// partial sums are double adds in a fixed order; the conversions, sqrtf, the add and the division
// of clip_coefficient and the one multiply of scale_by_scalar are IEEE.
TEST_P(KernelParity, GradientClipping) {
  const std::size_t n1 = 3 * stp::kSumSqBlock + 77, n2 = 500;
  auto g1 = upload(uniform(n1, -1, 1)), g2 = upload(uniform(n2, -2, 2));
  auto partials = upload(std::vector<float>(stp::sumsq_partials_count(n1)));
  auto sumsq = upload(std::vector<float>{0.25f}), norm = upload(std::vector<float>{-1}), coef = upload(std::vector<float>{-1});
  auto norm_alias = upload(std::vector<float>{0}), coef2 = upload(std::vector<float>{-1});
  run([&](Stream& s, Side at) {
    stp::sumsq_accumulate(s, at(g1), n1, at(partials), at(sumsq));  // onto 0.25
    stp::sumsq_accumulate(s, at(g2), n2, at(partials), at(sumsq));
    s.copy(at(norm_alias), at(sumsq), sizeof(float));
    stp::clip_coefficient(s, at(sumsq), 1.0f, at(norm), at(coef));
    stp::clip_coefficient(s, at(norm_alias), 1e6f, at(norm_alias), at(coef2));  // norm aliasing sumsq; coef 1
    stp::scale_by_scalar(s, at(g1), n1, at(coef));
    stp::scale_by_scalar(s, at(g2), n2, at(coef));
  });
  ASSERT_LT(download(coef, 0)[0], 1.0f) << "the test must clip";
  expect_match("sumsq", sumsq, Tolerance::exact());
  expect_match("norm", norm, Tolerance::exact());
  expect_match("coef", coef, Tolerance::exact());
  expect_match("norm (aliasing sumsq)", norm_alias, Tolerance::exact());
  expect_match("coef (clamped to 1)", coef2, Tolerance::exact());
  expect_match("g1 scaled", g1, Tolerance::exact());
  expect_match("g2 scaled", g2, Tolerance::exact());
}

INSTANTIATE_TEST_SUITE_P(Backends, KernelParity, ::testing::ValuesIn(stp::testing::all_kinds()), stp::testing::kind_name);

}  // namespace
