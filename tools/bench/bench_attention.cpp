// bench_attention: fused causal attention (core/kernels/attention_kernels.h) against the naive
// kernels (core/kernels/nn_kernels.h), forward + backward, on the CPU backend, as GPT-2's attention
// unit runs them (packed qkv rows, f32).
//
//   ninja -C build bench_attention && build/bench_attention [--reps 5] [--batch 1] [--heads 8] [--head-dim 64]
//                                                        [--seq 256,1024,4096]   (or --help)
//
// Per sequence length T, in one run:
//   * time: forward + backward, enqueue to synchronize, median and spread (min .. max) of --reps
//     runs after one warm-up; the two kernels alternate run by run, so load from other processes
//     hits both alike; speed ratio = naive time / fused time (> 1: fused is faster).
//   * records: what the attention op keeps between F and B besides its input qkv: naive, the
//     probabilities att (B, H, T, T) and y; fused, the log-sum-exp (B, H, T) f32 and y.
//   * peak: the device's high-water mark over forward + backward, every buffer included (qkv, y,
//     the records, dy, dqkv and the backward's workspace: naive datt (B, H, T, T), fused
//     (B, H, T, 1 + D) f32: do . o and the CPU's dq accumulators).
// Targets: records at T = 1024 at least 8x smaller; fused at least 1.0x naive speed at T >= 1024
// and 0.8x at T = 256. oneTBB and OpenBLAS use every core of the machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/trace_names.h"
#include "core/cpu/cpu_device.h"
#include "core/kernels/attention_kernels.h"
#include "core/kernels/nn_kernels.h"
#include "tools/cli/cli.h"

namespace {

using Clock = std::chrono::steady_clock;
using i64 = std::int64_t;

struct Args {
  int reps = 5;
  i64 batch = 1, heads = 8, head_dim = 64;
  std::vector<i64> seq = {256, 1024, 4096};
};

struct Result {
  std::vector<double> ms;
  std::size_t records = 0, peak = 0;
};

// One kernel at one T: buffers allocated as the attention unit allocates them, then --reps timed
// forward + backward passes. The first pass (untimed) measures the peak.
class Case {
 public:
  Case(stp::Device& dev, stp::Stream& s, const Args& a, i64 T, bool fused)
      : dev_(dev), s_(s), B_(a.batch), T_(T), H_(a.heads), D_(a.head_dim), fused_(fused) {}
  ~Case() {
    s_.synchronize();
    for (void* p : owned_) dev_.deallocate(p);
  }

  void init(unsigned seed) {
    const i64 W = H_ * D_;
    qkv_ = fill(B_ * T_ * 3 * W, seed);
    dy_ = fill(B_ * T_ * W, seed + 1);
  }

  // Forward then backward, allocating records and outputs like the unit (and freeing them).
  double pass(std::size_t* peak, std::size_t* records) {
    const i64 W = H_ * D_, rows = B_ * H_ * T_;
    s_.synchronize();
    dev_.reset_peak();
    const auto t0 = Clock::now();
    float* core = alloc(fused_ ? rows : rows * T_);  // lse or att
    float* y = alloc(B_ * T_ * W);
    if (fused_) {
      fused_attention_forward<float>(s_, layout(), y, core, qkv_, qkv_ + W, qkv_ + 2 * W);
    } else {
      stp::attention_forward<float>(s_, y, core, qkv_, B_, T_, H_, D_);
    }
    s_.synchronize();
    fwd_ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    float* dqkv = alloc(B_ * T_ * 3 * W);
    float* ws = alloc(fused_ ? fused_attention_backward_workspace(layout()) : rows * T_);  // datt
    if (fused_) {
      fused_attention_backward<float>(s_, layout(), dqkv, dqkv + W, dqkv + 2 * W, ws, dy_, qkv_, qkv_ + W, qkv_ + 2 * W,
                                      y, core);
    } else {
      stp::attention_backward<float>(s_, dqkv, ws, dy_, qkv_, core, B_, T_, H_, D_);
    }
    s_.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (peak) *peak = dev_.memory_stats().peak;
    if (records) *records = static_cast<std::size_t>((fused_ ? rows : rows * T_) + B_ * T_ * W) * sizeof(float);
    for (float* p : {core, y, dqkv, ws}) free(p);
    return ms;
  }

 private:
  stp::AttentionLayout layout() const { return {B_, T_, H_, H_, D_, 3 * H_ * D_, 3 * H_ * D_, H_ * D_}; }
  float* alloc(i64 n) { return static_cast<float*>(dev_.allocate(static_cast<std::size_t>(n) * sizeof(float))); }
  void free(float* p) { dev_.deallocate(p); }
  float* fill(i64 n, unsigned seed) {
    float* p = alloc(n);
    owned_.push_back(p);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (i64 i = 0; i < n; ++i) p[i] = u(rng);  // CPU device memory is host memory
    return p;
  }

  stp::Device& dev_;
  stp::Stream& s_;
  i64 B_, T_, H_, D_;
  bool fused_;
  float* qkv_ = nullptr;
  float* dy_ = nullptr;
  std::vector<void*> owned_;

 public:
  std::vector<double> fwd_ms_;  // the forward part of each pass
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mib(std::size_t b) { return static_cast<double>(b) / (1 << 20); }

void run(const Args& a) {
  // One device per kernel, so each peak counts that kernel's buffers only.
  auto devs = stp::make_cpu_devices(2);
  auto s0 = devs[0]->create_stream(stp::trace::stream::kCompute);
  auto s1 = devs[1]->create_stream(stp::trace::stream::kCompute);
  std::printf("bench_attention: B %lld, H %lld, D %lld, causal, f32, CPU backend; forward + backward, %d reps\n",
              static_cast<long long>(a.batch), static_cast<long long>(a.heads), static_cast<long long>(a.head_dim),
              a.reps);
  std::printf("%6s  %-28s %-28s %7s  %12s %12s %7s  %12s %12s %7s\n", "T", "naive ms median (min..max)",
              "fused ms median (min..max)", "speed", "naive rec", "fused rec", "ratio", "naive peak", "fused peak",
              "ratio");
  for (i64 T : a.seq) {
    Result r[2];  // [0] naive, [1] fused
    std::vector<double> naive_fwd, fused_fwd;
    {
      Case naive(*devs[0], *s0, a, T, false), fused(*devs[1], *s1, a, T, true);
      naive.init(1);
      fused.init(1);
      naive.pass(&r[0].peak, &r[0].records);  // warm-up, and the peaks
      fused.pass(&r[1].peak, &r[1].records);
      for (int i = 0; i < a.reps; ++i) {
        r[0].ms.push_back(naive.pass(nullptr, nullptr));
        r[1].ms.push_back(fused.pass(nullptr, nullptr));
      }
      naive_fwd.assign(naive.fwd_ms_.begin() + 1, naive.fwd_ms_.end());
      fused_fwd.assign(fused.fwd_ms_.begin() + 1, fused.fwd_ms_.end());
    }
    std::printf("        forward part: naive %.1f ms, fused %.1f ms (medians)\n", median(naive_fwd), median(fused_fwd));
    char cell[2][64];
    for (int k = 0; k < 2; ++k)
      std::snprintf(cell[k], sizeof cell[k], "%.1f (%.1f..%.1f)", median(r[k].ms),
                    *std::min_element(r[k].ms.begin(), r[k].ms.end()),
                    *std::max_element(r[k].ms.begin(), r[k].ms.end()));
    std::printf("%6lld  %-28s %-28s %6.2fx  %8.2f MiB %8.2f MiB %6.1fx  %8.1f MiB %8.1f MiB %6.1fx\n",
                static_cast<long long>(T), cell[0], cell[1], median(r[0].ms) / median(r[1].ms), mib(r[0].records),
                mib(r[1].records), static_cast<double>(r[0].records) / static_cast<double>(r[1].records),
                mib(r[0].peak), mib(r[1].peak), static_cast<double>(r[0].peak) / static_cast<double>(r[1].peak));
    std::fflush(stdout);
  }
  std::printf(
      "speed = naive median / fused median (targets: >= 1.0x at T >= 1024, >= 0.8x at T = 256); "
      "records target at T = 1024: >= 8x smaller\n");
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "Fused causal attention against the naive kernels: forward + backward time, records and peak bytes "
      "per sequence length, on the CPU backend.",
      "bench_attention"};
  stp::tools::init_cli(app);
  const auto positive = CLI::PositiveNumber;
  app.add_option("--reps", a.reps, "timed runs of each kernel per T (median and spread are printed)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--batch", a.batch, "sequences (B)")->check(positive)->capture_default_str();
  app.add_option("--heads", a.heads, "attention heads (H)")->check(positive)->capture_default_str();
  app.add_option("--head-dim", a.head_dim, "head dimension (D)")->check(positive)->capture_default_str();
  app.add_option("--seq", a.seq, "sequence lengths T, comma-separated")
      ->delimiter(',')
      ->check(positive)
      ->capture_default_str();
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    run(a);
    return 0;
  });
}
