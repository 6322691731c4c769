// CPU AdamW against the CPU backend's device kernel (adamw_step): bitwise equal for every
// instruction set this CPU runs, with and without weight decay, at several steps, over random
// values and edge cases (zeros, signed zeros, subnormals, huge and tiny magnitudes, infinities).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "core/cpu/cpu_device.h"
#include "memory/numa.h"
#include "optim/cpu_adamw.h"

using namespace stp;

namespace {

std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// n values: mostly random over many magnitudes, with edge cases sprinkled in.
std::vector<float> values(std::size_t n, std::uint32_t seed, bool nonnegative) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-40, 20);
  const float edge[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, 3.4e38f, -3.4e38f, 1.0f, -1.0f, 1e-20f, 1e20f};
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float x = i % 37 == 0 ? edge[(i / 37) % std::size(edge)] : std::ldexp(mant(rng), expo(rng));
    out[i] = nonnegative ? std::fabs(x) : x;
  }
  return out;
}

struct Case {
  std::vector<float> p, g, m, v;
};

Case make_case(std::size_t n, std::uint32_t seed) {
  return Case{values(n, seed, false), values(n, seed + 1, false), values(n, seed + 2, false),
              values(n, seed + 3, true)};
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs device " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace

TEST(CpuAdamW, BitwiseTheDeviceKernelForEveryIsa) {
  auto devs = make_cpu_devices(1);
  auto s = devs[0]->create_stream("compute");
  const std::size_t n = 3 * kCpuAdamWGrain + 1237;  // several parallel blocks and ragged tails
  AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  std::vector<CpuIsa> isas = {CpuIsa::Scalar};
  for (CpuIsa isa : {CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_has_isa(isa)) isas.push_back(isa);
  int checked = 0;
  for (bool decay : {false, true})
    for (int step : {1, 2, 7, 1000}) {
      const float lr = 3e-4f * static_cast<float>(step % 3 + 1);
      Case dev = make_case(n, static_cast<std::uint32_t>(step * 10 + decay));
      Case base = dev;
      adamw_step(*s, dev.p.data(), dev.g.data(), dev.m.data(), dev.v.data(), n, lr, h, step, decay);
      s->synchronize();
      for (CpuIsa isa : isas)
        for (bool parallel : {false, true}) {
          Case c = base;
          cpu_adamw_update(c.p.data(), c.g.data(), c.m.data(), c.v.data(), n, adamw_scalars(lr, h, step, decay), isa,
                           parallel);
          std::string what = to_string(isa) + (parallel ? " parallel" : " serial") + " step " + std::to_string(step) +
                             (decay ? " decay" : "");
          expect_bitwise(c.p, dev.p, what + " p");
          expect_bitwise(c.m, dev.m, what + " m");
          expect_bitwise(c.v, dev.v, what + " v");
          ++checked;
        }
    }
  EXPECT_EQ(checked, 8 * 2 * static_cast<int>(isas.size()));
}

// A range updated piecewise (as an offloaded chunk at a time) equals the whole at once.
TEST(CpuAdamW, ChunkwiseEqualsWhole) {
  const std::size_t n = 100003;
  Case whole = make_case(n, 99), parts = whole;
  AdamWScalars c = adamw_scalars(1e-3f, AdamWHyper{0.9f, 0.999f, 1e-8f, 0.01f}, 3, true);
  cpu_adamw_update(whole.p.data(), whole.g.data(), whole.m.data(), whole.v.data(), n, c);
  for (std::size_t at = 0; at < n; at += 7001) {
    std::size_t k = std::min<std::size_t>(7001, n - at);
    cpu_adamw_update(parts.p.data() + at, parts.g.data() + at, parts.m.data() + at, parts.v.data() + at, k, c);
  }
  expect_bitwise(parts.p, whole.p, "p");
  expect_bitwise(parts.v, whole.v, "v");
}

TEST(CpuAdamW, StateIsZeroedAlignedAndOnTheNode) {
  CpuAdamWState st({5, 1 << 20, 0}, 0);
  ASSERT_EQ(st.count(), 3u);
  for (std::size_t i = 0; i < st.count(); ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(st.exp_avg(i)) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(st.exp_avg_sq(i)) % 64, 0u);
    for (std::size_t j = 0; j < st.size(i); ++j) ASSERT_EQ(st.exp_avg(i)[j] + st.exp_avg_sq(i)[j], 0.0f);
  }
  EXPECT_GE(st.bytes(), 2 * ((1u << 20) + 16) * sizeof(float));
  if (st.bound()) {
    EXPECT_EQ(memory_node_of(st.exp_avg(1), st.size(1) * sizeof(float)), 0);
  }
}
