// Backend-generic runtime checks: the same test on CpuDevice and, where available, CudaDevice.
// This file is compiled by nvcc when the CUDA backend is built (name ends in _kernels.cpp), so
// launch() really runs the functor on the GPU there.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "core/launch.h"
#include "tests/support/devices.h"

namespace {

using stp::DeviceKind;

struct Saxpy {
  float a;
  const float* x;
  float* y;
  STP_HD void operator()(std::size_t i) const { y[i] = a * x[i] + y[i]; }
};

class OnDevice : public ::testing::TestWithParam<DeviceKind> {};

// Host data -> device, run, device -> host, all through the stream API.
template <typename T>
T* upload(stp::Device& d, stp::Stream& s, const std::vector<T>& host) {
  auto* p = static_cast<T*>(d.allocate(host.size() * sizeof(T)));
  s.copy(p, host.data(), host.size() * sizeof(T));
  return p;
}

TEST_P(OnDevice, LaunchRunsEveryIndexOnceInStreamOrder) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  const std::size_t n = 100003;
  std::vector<float> x(n), y(n, 1.0f);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  float* dx = upload(d, *s, x);
  float* dy = upload(d, *s, y);
  stp::launch(*s, n, Saxpy{2.0f, dx, dy}, 1000);
  stp::launch(*s, n, Saxpy{1.0f, dx, dy}, 1000);  // sees the first kernel's result
  s->copy(y.data(), dy, n * sizeof(float));
  s->synchronize();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 3.0f * static_cast<float>(i) + 1.0f) << i;
  d.deallocate(dx);
  d.deallocate(dy);
}

void reference_gemm(const stp::GemmArgs& g, const float* a, const float* b, const float* c, std::vector<double>& out) {
  out.assign(static_cast<std::size_t>(g.m * g.n), 0.0);
  for (int i = 0; i < g.m; ++i)
    for (int j = 0; j < g.n; ++j) {
      double acc = 0;
      for (int p = 0; p < g.k; ++p) {
        float av = g.trans_a ? a[p * g.lda + i] : a[i * g.lda + p];
        float bv = g.trans_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
        acc += static_cast<double>(av) * bv;
      }
      out[static_cast<std::size_t>(i * g.n + j)] = g.alpha * acc + g.beta * c[i * g.ldc + j];
    }
}

TEST_P(OnDevice, GemmMatchesNaiveReferenceForEveryTransposition) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  const int m = 37, n = 29, k = 53;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)),
          c(static_cast<std::size_t>(m * n));
      for (auto* v : {&a, &b, &c})
        for (auto& x : *v) x = u(rng);
      stp::GemmArgs g;
      g.trans_a = ta, g.trans_b = tb;
      g.m = m, g.n = n, g.k = k;
      g.alpha = 0.5f, g.beta = 2.0f;
      g.lda = ta ? m : k, g.ldb = tb ? k : n, g.ldc = n;
      std::vector<double> want;
      reference_gemm(g, a.data(), b.data(), c.data(), want);
      float *da = upload(d, *s, a), *db = upload(d, *s, b), *dc = upload(d, *s, c);
      g.a = da, g.b = db, g.c = dc;
      s->gemm(g);
      s->copy(c.data(), dc, c.size() * sizeof(float));
      s->synchronize();
      for (std::size_t i = 0; i < c.size(); ++i) ASSERT_NEAR(c[i], want[i], 1e-4) << ta << tb << " " << i;
      for (float* p : {da, db, dc}) d.deallocate(p);
    }
}

TEST_P(OnDevice, PinnedRoundTripIsByteExactAndOrderedByEvents) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto d2h = d.create_stream("d2h");
  auto h2d = d.create_stream("h2d");
  auto offloaded = d.create_event();
  const std::size_t n = 1 << 22;
  auto* host = static_cast<unsigned char*>(d.allocate_pinned_host(n));
  auto* src = static_cast<unsigned char*>(d.allocate(n));
  auto* back = static_cast<unsigned char*>(d.allocate(n));
  std::vector<unsigned char> pattern(n), out(n);
  for (std::size_t i = 0; i < n; ++i) pattern[i] = static_cast<unsigned char>(i * 131 + 7);
  d2h->copy(src, pattern.data(), n);
  d2h->copy(host, src, n);  // offload
  d2h->record(*offloaded);
  h2d->wait(*offloaded);  // prefetch only after the offload finished
  h2d->copy(back, host, n);
  h2d->copy(out.data(), back, n);
  h2d->synchronize();
  EXPECT_EQ(std::memcmp(out.data(), pattern.data(), n), 0);
  d.deallocate(src);
  d.deallocate(back);
  d.deallocate_pinned_host(host);
}

TEST_P(OnDevice, AllReduceOverTwoDevicesEqualsTheSum) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 2);
  auto comms = stp::make_comms({devs[0].get(), devs[1].get()});
  std::vector<std::unique_ptr<stp::Stream>> streams;
  std::vector<float*> bufs;
  const std::size_t n = 1000;
  for (int r = 0; r < 2; ++r) {
    streams.push_back(devs[static_cast<std::size_t>(r)]->create_stream("tp-comm"));
    std::vector<float> v(n, static_cast<float>(r + 1));
    bufs.push_back(upload(*devs[static_cast<std::size_t>(r)], *streams.back(), v));
    streams.back()->synchronize();  // v dies here; the upload must have finished
  }
  std::vector<std::thread> ts;  // one host thread per rank, as the executor does
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      comms[static_cast<std::size_t>(r)]->all_reduce_sum(*streams[static_cast<std::size_t>(r)],
                                                         bufs[static_cast<std::size_t>(r)], n);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    std::vector<float> out(n);
    streams[static_cast<std::size_t>(r)]->copy(out.data(), bufs[static_cast<std::size_t>(r)], n * sizeof(float));
    streams[static_cast<std::size_t>(r)]->synchronize();
    for (float x : out) ASSERT_EQ(x, 3.0f);
    devs[static_cast<std::size_t>(r)]->deallocate(bufs[static_cast<std::size_t>(r)]);
  }
}

// Event::elapsed_ms: device time between two timing events on one stream and across
// streams, without a host task on either stream; events without timing are refused.
TEST_P(OnDevice, TimingEventsMeasureStreamWorkAndRefuseEventsWithoutTiming) {
  STP_DEVICES_OR_SKIP(devs, GetParam(), 1);
  auto& d = *devs[0];
  auto s = d.create_stream("compute");
  auto other = d.create_stream("h2d");
  auto start = d.create_timing_event();
  auto end = d.create_timing_event();
  auto plain = d.create_event();
  auto later = d.create_timing_event();
  const std::size_t n = 1 << 22;
  std::vector<float> x(n, 1.0f);
  float* dx = upload(d, *s, x);
  float* dy = upload(d, *s, x);
  s->record(*start);
  for (int i = 0; i < 8; ++i) stp::launch(*s, n, Saxpy{1.0f, dx, dy}, 1 << 16);
  s->record(*end);
  s->record(*plain);
  other->wait(*end);
  other->record(*later);  // on another stream, reached after `end`
  s->synchronize();
  other->synchronize();
  const double ms = end->elapsed_ms(*start);
  EXPECT_GT(ms, 0.0) << "eight kernels over 16 MiB take time";
  EXPECT_LT(ms, 60e3);
  EXPECT_NEAR(start->elapsed_ms(*end), -ms, 1e-3 + 1e-6 * ms) << "reversed: negative";
  EXPECT_GE(later->elapsed_ms(*end), 0.0);
  EXPECT_ANY_THROW((void)plain->elapsed_ms(*start)) << "an event without timing";
  EXPECT_ANY_THROW((void)end->elapsed_ms(*plain)) << "an event without timing as the start";
  d.deallocate(dx);
  d.deallocate(dy);
}

INSTANTIATE_TEST_SUITE_P(Backends, OnDevice, ::testing::ValuesIn(stp::testing::all_kinds()), stp::testing::kind_name);

TEST(CudaBackend, WithoutAUsableGpuTheErrorIsOneClearLine) {
  std::string why;
  if (stp::cuda_usable(1, &why)) GTEST_SKIP() << "a GPU is usable here";
  stp::BackendOptions o;
  o.kind = DeviceKind::Cuda;
  try {
    stp::make_devices(o);
    FAIL() << "no error";
  } catch (const stp::Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    // What was found (cuda_usable's reason: no CUDA in this build, no driver, too few GPUs) and
    // what to do, in that order.
    EXPECT_EQ(msg.find("parallel.backend is cuda but " + why), 0u) << msg;
    EXPECT_NE(msg.find("; use parallel.backend: cpu or run on a GPU machine"), std::string::npos) << msg;
  }
}

}  // namespace
