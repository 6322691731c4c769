// Runtime micro-benchmark (CPU backend). Prints, each as the median of several repeats:
//   * GEMM GFLOP/s through Stream::gemm vs cblas_sgemm called directly, same run, and the ratio
//     (target: stream path within 10% of direct), for 2048^3 and a transformer-shaped case;
//   * event round trip: record on a stream + host wait, microseconds;
//   * empty kernel launch overhead on a CPU stream (launch() of a no-op, amortised), microseconds.
// Usage: build/bench_runtime [--threads N] [--repeats R]   (or --help)
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/trace_names.h"
#include "core/cpu/cpu_device.h"
#include "core/launch.h"
#include "tools/cli/cli.h"

extern "C" void openblas_set_num_threads(int);

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct GemmCase {
  const char* name;
  int m, n, k;
};

void bench_gemm(const GemmCase& c, stp::Stream& stream, int repeats) {
  std::vector<float> a(static_cast<std::size_t>(c.m) * c.k, 0.5f), b(static_cast<std::size_t>(c.k) * c.n, 0.25f),
      out(static_cast<std::size_t>(c.m) * c.n, 0.0f);
  stp::GemmArgs g;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.a = a.data(), g.lda = c.k, g.b = b.data(), g.ldb = c.n, g.c = out.data(), g.ldc = c.n;
  double flops = 2.0 * c.m * c.n * c.k;
  std::vector<double> direct, via_stream;
  for (int r = 0; r < repeats + 1; ++r) {  // first round warms up both paths
    auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c.m, c.n, c.k, 1.0f, a.data(), c.k, b.data(), c.n, 0.0f,
                out.data(), c.n);
    double td = seconds_since(t0);
    t0 = Clock::now();
    stream.gemm(g);
    stream.synchronize();
    double ts = seconds_since(t0);
    if (r == 0) continue;
    direct.push_back(flops / td / 1e9);
    via_stream.push_back(flops / ts / 1e9);
  }
  double d = median(direct), s = median(via_stream);
  std::printf("gemm %-28s (M,N,K)=(%d,%d,%d): direct %7.1f GFLOP/s, stream %7.1f GFLOP/s, ratio %.3f %s\n", c.name, c.m,
              c.n, c.k, d, s, s / d, s / d >= 0.9 ? "(within 10%: ok)" : "(MORE THAN 10% SLOWER)");
}

void bench_event_round_trip(stp::Device& dev, int repeats) {
  auto s = dev.create_stream("s");
  auto e = dev.create_event();
  std::vector<double> us;
  const int per = 2000;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < per; ++i) {
      s->record(*e);
      e->synchronize();
    }
    us.push_back(seconds_since(t0) / per * 1e6);
  }
  std::printf("event round trip (record + host wait):  %.2f us\n", median(us));
}

struct Noop {
  STP_HD void operator()(std::size_t) const {}
};

void bench_empty_launch(stp::Device& dev, int repeats) {
  auto s = dev.create_stream("s");
  std::vector<double> us;
  const int per = 20000;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < per; ++i) stp::launch(*s, 1, Noop{});
    s->synchronize();
    us.push_back(seconds_since(t0) / per * 1e6);
  }
  std::printf("empty kernel launch on a CPU stream:     %.2f us (enqueue + run, amortised over %d)\n", median(us), per);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 5;
  CLI::App app{
      "Runtime micro-benchmark on the CPU backend: GEMM through a stream vs OpenBLAS directly, event "
      "round trip, empty launch overhead; medians of repeats.",
      "bench_runtime"};
  stp::tools::init_cli(app);
  app.add_option("--threads", threads, "OpenBLAS threads")->type_name("N")->capture_default_str();
  app.add_option("--repeats", repeats, "repeats of each measurement (the median is printed)")
      ->type_name("R")
      ->capture_default_str();
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    openblas_set_num_threads(threads);
    std::printf("stp runtime benchmark: CPU backend, OpenBLAS threads %d, median of %d repeats\n", threads, repeats);
    stp::CpuDevice dev(0, {});
    auto stream = dev.create_stream(stp::trace::stream::kCompute);
    for (const GemmCase& c :
         {GemmCase{"square", 2048, 2048, 2048}, GemmCase{"transformer mlp (B*T, 4C, C)", 2048, 1536, 384},
          GemmCase{"transformer qkv (B*T, 3C, C)", 2048, 1152, 384}})
      bench_gemm(c, *stream, repeats);
    bench_event_round_trip(dev, repeats);
    bench_empty_launch(dev, repeats);
    return 0;
  });
}
