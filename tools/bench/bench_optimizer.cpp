// bench_optimizer: the CPU AdamW (optim/cpu_adamw.h) against the memory bandwidth of this host and
// against torch.optim.AdamW(foreach=True).
//
//   ninja -C build bench_optimizer && build/bench_optimizer [--params 10000000,100000000] [--reps 9]
//                                     [--torch tools/bench/bench_optimizer_torch.py | --no-torch]
//
// For each parameter count N, in one run and interleaved repeat by repeat (this host is noisy):
//   adamw  one cpu_adamw_update over N elements (best instruction set, every TBB worker);
//          it moves 28 bytes per parameter (reads p, g, m, v; writes p, m, v).
//   copy   a parallel copy over the same footprint: src 2N floats -> dst 2N floats (16 N bytes
//          touched, as AdamW's four arrays), counted as bytes read + bytes written. Two kinds
//          are timed each repeat, non-temporal stores (the write does not also read the
//          destination) and memcpy; the column is the faster kind's median, the bandwidth bound
//          the AdamW is held to. Target: adamw GB/s >= 0.7 x copy GB/s.
//   torch  torch.optim.AdamW(foreach=True) on N parameters with as many threads, run through
//          /usr/bin/python3 (tools/bench/bench_optimizer_torch.py); "skipped" without torch.
//          Target: the CPU AdamW >= 3x torch's parameters per second.
// Each column is the median over --reps with [min, max] beside it.
//
// Then the device optimizer step on the CPU backend (a compute stream of a CPU device), on the
// parameter list of a GPT-2 shape (--step-layers, --step-width; vocabulary 50257, 1024
// positions; 0 layers skips it), interleaved repeat by repeat:
//   per-tensor  the pass before the fused one: per parameter, the sum of squares
//               (sumsq_accumulate), then the coefficient, per parameter the clip scaling
//               (scale_by_scalar) and adamw_step: about 4 launches per tensor;
//   fused       the flat pass (optim_kernels.h): sumsq_flat_accumulate, the coefficient and
//               adamw_flat_step over the flat buffers, 4 launches in all.
// Both give the same bits; the columns are milliseconds per step and the launches per step.
#include <sys/mman.h>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "base/trace_names.h"
#include "base/error.h"
#include "core/cpu/cpu_device.h"
#include "core/cpu/cpu_stream.h"
#include "core/kernels/optim_kernels.h"
#include "optim/cpu_adamw.h"
#include "tools/cli/cli.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
using stp::CpuIsa;

struct Stats {
  double median, min, max;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

// Page-aligned host floats, touched (so the timed runs take no page faults).
struct Buffer {
  float* data = nullptr;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t floats) : bytes(floats * sizeof(float)) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    STP_CHECK(p != MAP_FAILED, "bench_optimizer: cannot map ", stp::format_bytes(bytes));
    data = static_cast<float*>(p);
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, floats, 1 << 20),
        [&](const tbb::blocked_range<std::size_t>& r) { std::memset(data + r.begin(), 0, r.size() * sizeof(float)); });
  }
  ~Buffer() { munmap(data, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

#if defined(__x86_64__)
__attribute__((target("avx2"))) void stream_copy_avx2(float* dst, const float* src, std::size_t n) {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // 128 bytes per iteration; dst and src 32-byte aligned
    _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
    _mm256_stream_ps(dst + i + 8, _mm256_load_ps(src + i + 8));
    _mm256_stream_ps(dst + i + 16, _mm256_load_ps(src + i + 16));
    _mm256_stream_ps(dst + i + 24, _mm256_load_ps(src + i + 24));
  }
  std::memcpy(dst + i, src + i, (n - i) * sizeof(float));
  _mm_sfence();
}
#endif

void stream_copy(float* dst, const float* src, std::size_t n, bool non_temporal) {
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n / 32, stp::kCpuAdamWGrain / 32),
      [&](const tbb::blocked_range<std::size_t>& r) {
        std::size_t b = r.begin() * 32, e = r.end() == n / 32 ? n : r.end() * 32;
#if defined(__x86_64__)
        if (non_temporal && stp::cpu_has_isa(CpuIsa::Avx2)) return stream_copy_avx2(dst + b, src + b, e - b);
#endif
        std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
      },
      tbb::simple_partitioner());
}

// torch's step times (seconds) for n parameters, or empty (with the reason printed) when skipped.
std::vector<double> run_torch(const std::string& script, std::size_t n, int threads, int reps) {
  if (script.empty()) return {};
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    std::printf("  torch: skipped (no python3-torch for /usr/bin/python3)\n");
    return {};
  }
  std::string cmd = "/usr/bin/python3 " + script + " --params " + std::to_string(n) + " --threads " +
                    std::to_string(threads) + " --reps " + std::to_string(reps);
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::vector<double> out;
  char line[256];
  double s = 0;
  while (std::fgets(line, sizeof line, p))
    if (std::sscanf(line, "torch adamw_step_s %lf", &s) == 1) out.push_back(s);
  if (pclose(p) != 0 || out.empty()) std::printf("  torch: skipped (%s failed)\n", cmd.c_str());
  return out;
}

int bench(const std::vector<std::size_t>& counts, int reps, const std::string& torch) {
  const int threads = tbb::info::default_concurrency();
  const CpuIsa isa = stp::best_cpu_isa();
  std::printf("bench_optimizer: %d threads, instruction set %s, %d repeats (median [min, max])\n", threads,
              stp::to_string(isa).c_str(), reps);
  std::printf("%12s %24s %24s %-6s %7s %26s %8s\n", "params", "adamw GB/s", "copy GB/s", "kind", "ratio",
              "torch foreach GB/s", "speedup");
  for (std::size_t n : counts) {
    Buffer p(n), g(n), m(n), v(n), src(2 * n), dst(2 * n);
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1 << 16), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t i = r.begin(); i < r.end(); ++i) {  // uniform in [-1, 1) from a hash of i
        std::uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
        float u = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2 - 1);
        p.data[i] = 0.02f * u;
        g.data[i] = 1e-3f * u;
      }
    });
    const stp::AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
    std::vector<double> adamw_gbs, copy_gbs[2];  // [non-temporal, memcpy]
    int step = 1;
    stp::cpu_adamw_update(p.data, g.data, m.data, v.data, n, stp::adamw_scalars(1e-3f, h, step++, true), isa);
    stream_copy(dst.data, src.data, 2 * n, true);  // warm-up of all three
    stream_copy(dst.data, src.data, 2 * n, false);
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      stp::cpu_adamw_update(p.data, g.data, m.data, v.data, n, stp::adamw_scalars(1e-3f, h, step++, true), isa);
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      adamw_gbs.push_back(28.0 * static_cast<double>(n) / s / 1e9);
      for (int k = 0; k < 2; ++k) {
        t0 = Clock::now();
        stream_copy(dst.data, src.data, 2 * n, k == 0);
        s = std::chrono::duration<double>(Clock::now() - t0).count();
        copy_gbs[k].push_back(2.0 * 8.0 * static_cast<double>(n) / s / 1e9);
      }
    }
    Stats a = stats(adamw_gbs), nt = stats(copy_gbs[0]), mc = stats(copy_gbs[1]);
    Stats c = nt.median >= mc.median ? nt : mc;
    const char* kind = nt.median >= mc.median ? "nt" : "memcpy";
    char torch_col[64] = "skipped", speedup[32] = "-";
    std::vector<double> t = run_torch(torch, n, threads, reps);
    if (!t.empty()) {
      std::vector<double> t_gbs;
      for (double s : t) t_gbs.push_back(28.0 * static_cast<double>(n) / s / 1e9);
      Stats ts = stats(t_gbs);
      std::snprintf(torch_col, sizeof torch_col, "%.2f [%.2f, %.2f]", ts.median, ts.min, ts.max);
      std::snprintf(speedup, sizeof speedup, "%.2fx", a.median / ts.median);
    }
    std::printf("%12zu %8.2f [%6.2f, %6.2f] %8.2f [%6.2f, %6.2f] %-6s %7.2f %26s %8s\n", n, a.median, a.min, a.max,
                c.median, c.min, c.max, kind, a.median / c.median, torch_col, speedup);
  }
  std::printf("targets: ratio >= 0.70 (adamw vs streaming copy), speedup >= 3x (vs torch foreach)\n");
  return 0;
}

// The parameter sizes of a GPT-2 shape (token and position embeddings, per layer ln_1, c_attn,
// attn.c_proj, ln_2, c_fc, mlp.c_proj with their biases, ln_f), and their decay.
std::vector<stp::FlatSegment> gpt2_segments(int layers, std::size_t c) {
  std::vector<stp::FlatSegment> out = {{50257 * c, true}, {1024 * c, true}};
  for (int l = 0; l < layers; ++l)
    for (stp::FlatSegment sg : std::vector<stp::FlatSegment>{{c, false},
                                                             {c, false},
                                                             {3 * c * c, true},
                                                             {3 * c, false},
                                                             {c * c, true},
                                                             {c, false},
                                                             {c, false},
                                                             {c, false},
                                                             {4 * c * c, true},
                                                             {4 * c, false},
                                                             {4 * c * c, true},
                                                             {c, false}})
      out.push_back(sg);
  out.push_back({c, false});
  out.push_back({c, false});
  return out;
}

int bench_step(int layers, std::size_t width, int reps) {
  if (layers <= 0) return 0;
  auto devs = stp::make_cpu_devices(1);
  std::unique_ptr<stp::Stream> s = devs[0]->create_stream(stp::trace::stream::kCompute);
  const std::vector<stp::FlatSegment> segs = gpt2_segments(layers, width);
  std::vector<stp::FlatRange> ranges;
  std::size_t n = 0;
  for (const stp::FlatSegment& sg : segs) {
    ranges.push_back({n, sg.count});
    n += sg.count;
  }
  Buffer p(n), g(n), m(n), v(n), scalars(4 + stp::sumsq_flat_partials_count(ranges));
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1 << 16), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i < r.end(); ++i) {
      p.data[i] = 0.02f * static_cast<float>(static_cast<int>(i % 2001) - 1000) / 1000.0f;
      g.data[i] = 1e-3f * static_cast<float>(static_cast<int>((i * 7) % 2001) - 1000) / 1000.0f;
    }
  });
  float *sumsq = scalars.data, *norm = sumsq + 1, *coef = sumsq + 2, *partials = sumsq + 4;
  const stp::AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  int step = 0;
  auto per_tensor = [&] {
    s->zero(sumsq, sizeof(float));
    for (const stp::FlatRange& r : ranges) stp::sumsq_accumulate(*s, g.data + r.offset, r.count, partials, sumsq);
    stp::clip_coefficient(*s, sumsq, 1e-3f, norm, coef);
    ++step;
    for (std::size_t k = 0; k < segs.size(); ++k) {
      float* gk = g.data + ranges[k].offset;
      stp::scale_by_scalar(*s, gk, segs[k].count, coef);
      stp::adamw_step(*s, p.data + ranges[k].offset, gk, m.data + ranges[k].offset, v.data + ranges[k].offset,
                      segs[k].count, 1e-4f, h, step, segs[k].decay);
    }
    s->synchronize();
  };
  auto fused = [&] {
    s->zero(sumsq, sizeof(float));
    stp::sumsq_flat_accumulate(*s, g.data, ranges, partials, sumsq);
    stp::clip_coefficient(*s, sumsq, 1e-3f, norm, coef);
    stp::adamw_flat_step(*s, p.data, g.data, m.data, v.data, segs, 1e-4f, h, ++step, coef);
    s->synchronize();
  };
  const stp::Device& device = s->device();
  auto launches = [&](auto&& fn) {
    const std::uint64_t before = device.launch_count();
    fn();
    return device.launch_count() - before;
  };
  const std::uint64_t l_tensor = launches(per_tensor), l_fused = launches(fused);  // warm-up
  std::vector<double> t_tensor, t_fused;
  for (int r = 0; r < reps; ++r)
    for (int k = 0; k < 2; ++k) {  // alternate which goes first
      const bool fused_first = r % 2 == 1;
      auto t0 = Clock::now();
      (k == 0) == fused_first ? fused() : per_tensor();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      ((k == 0) == fused_first ? t_fused : t_tensor).push_back(ms);
    }
  const Stats a = stats(t_tensor), b = stats(t_fused);
  std::printf("\ndevice step on the CPU backend: GPT-2 shape, %d layers, width %zu: %zu tensors, %zu parameters\n",
              layers, width, segs.size(), n);
  std::printf("%12s %28s %10s\n", "pass", "ms per step", "launches");
  std::printf("%12s %10.1f [%7.1f, %7.1f] %10llu\n", "per-tensor", a.median, a.min, a.max,
              static_cast<unsigned long long>(l_tensor));
  std::printf("%12s %10.1f [%7.1f, %7.1f] %10llu\n", "fused", b.median, b.min, b.max,
              static_cast<unsigned long long>(l_fused));
  std::printf("fused / per-tensor: %.2fx the time\n", b.median / a.median);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU AdamW bandwidth vs a streaming copy and torch.optim.AdamW(foreach=True).", "bench_optimizer"};
  stp::tools::init_cli(app);
  std::vector<std::size_t> counts = {10'000'000, 100'000'000};
  int reps = 9;
  std::string torch = "tools/bench/bench_optimizer_torch.py";
  bool no_torch = false;
  int step_layers = 12;
  std::size_t step_width = 768;
  app.add_option("--params", counts, "parameter counts")->delimiter(',')->capture_default_str();
  app.add_option("--reps", reps, "timed repeats per count")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--torch", torch, "the torch script (run by /usr/bin/python3)")->capture_default_str();
  app.add_flag("--no-torch", no_torch, "skip the torch column");
  app.add_option("--step-layers", step_layers, "layers of the GPT-2 shape of the device step (0: skip)")
      ->capture_default_str();
  app.add_option("--step-width", step_width, "width of the GPT-2 shape of the device step")->capture_default_str();
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    for (std::size_t n : counts) STP_CHECK(n > 0, "--params: counts must be positive");
    const int status = bench(counts, reps, no_torch ? std::string() : torch);
    return status != 0 ? status : bench_step(step_layers, step_width, reps);
  });
}
