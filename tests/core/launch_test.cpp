// Single-source kernels on the CPU backend: launch() and the GEMM conventions.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/launch.h"

namespace {

struct Saxpy {
  float a;
  const float* x;
  float* y;
  STP_HD void operator()(std::size_t i) const { y[i] = a * x[i] + y[i]; }
};

TEST(Launch, RunsEveryIndexExactlyOnceInStreamOrder) {
  stp::CpuDevice dev(0, {});
  auto s = dev.create_stream("compute");
  const std::size_t n = 100003;
  std::vector<float> x(n), y(n, 1.0f);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  stp::launch(*s, n, Saxpy{2.0f, x.data(), y.data()}, 1000);
  stp::launch(*s, n, Saxpy{1.0f, x.data(), y.data()}, 1000);  // must see the first kernel's result
  s->synchronize();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 3.0f * static_cast<float>(i) + 1.0f) << i;
}

// Naive reference with the GemmArgs conventions (row-major, op(X) = X or X^T).
void reference_gemm(const stp::GemmArgs& g, std::vector<double>& out) {
  out.assign(static_cast<std::size_t>(g.m * g.n), 0.0);
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int p = 0; p < g.k; ++p) {
        float a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
        float b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
        acc += static_cast<double>(a) * b;
      }
      out[static_cast<std::size_t>(i * g.n + j)] = g.alpha * acc + g.beta * g.c[i * g.ldc + j];
    }
}

TEST(Gemm, MatchesNaiveReferenceForEveryTransposition) {
  stp::CpuDevice dev(0, {});
  auto s = dev.create_stream("compute");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  const int m = 37, n = 29, k = 53;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)), c(static_cast<std::size_t>(m * n));
      for (auto* v : {&a, &b, &c})
        for (auto& x : *v) x = u(rng);
      stp::GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.m = m, g.n = n, g.k = k;
      g.alpha = 0.5f, g.beta = 2.0f;
      g.a = a.data(), g.lda = ta ? m : k;
      g.b = b.data(), g.ldb = tb ? k : n;
      g.c = c.data(), g.ldc = n;
      std::vector<double> want;
      reference_gemm(g, want);
      s->gemm(g);
      s->synchronize();
      for (std::size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], want[i], 1e-4) << ta << tb << " " << i;
    }
}

}  // namespace
