// Training throughput of one stage on the CPU backend, single rank, against PyTorch: a GPT-2 row
// and a Llama row (grouped-query attention, SwiGLU, untied head), each measured against the same
// model in PyTorch in this run.
//
//   build-models/bench_model [--arch both|gpt2|llama] [--repeats R] [--steps N] [--layers L]
//                            [--heads H] [--embd C] [--seq T] [--batch B] [--vocab V]
//                            [--kv-heads K] [--inter I] [--llama-vocab V]
//                            [--attention naive|fused] [--gemm-shapes]
//                            [--torch tools/bench/bench_model_torch.py | --no-torch]
//   (--help lists the defaults: GPT-2 6 x 384, 6 heads, vocab 50257; Llama the same with 2
//   kv-heads, intermediate 1024, vocab 32000; T 256, B 8)
//
// One step = zero_grads, F of every unit, B and W fused in reverse unit order, AdamW on every
// parameter (the optimizer kernel of core/kernels/optim_kernels.h). stp and PyTorch
// (torch.set_num_threads(2)) alternate R times, N steps each after one warm-up; each row prints
// tokens/s as the median and [min, max] of the repeats, the GEMM share of stp's step, and the
// median of the per-repeat ratios stp/torch with their range (alternating keeps a change of load
// on the machine from favouring one side). Two lines bound what stp's side can gain: the rate of
// its GEMMs against the CPU's measured FMA peak (tools/bench/fma_peak.h, printed first), and the ratio
// stp would reach if its step were nothing but its GEMMs (torch's step over stp's GEMM time).
//
// GEMM time: this executable defines cblas_sgemm itself, so the CPU backend's calls land here
// (the executable's symbol takes precedence); it times the call and forwards to OpenBLAS's
// definition found with dlsym(RTLD_NEXT). Nothing in the library is instrumented. --gemm-shapes
// breaks that time down by shape (calls and milliseconds per step, GFLOP/s).
#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/trace_names.h"
#include "core/cpu/cpu_device.h"
#include "core/kernels/optim_kernels.h"
#include "memory/block_arena.h"
#include "models/registry.h"
#include "tools/cli/blas_env.h"
#include "tools/cli/cli.h"
#include "tools/bench/fma_peak.h"

namespace {

std::atomic<std::int64_t> g_gemm_ns{0};
std::atomic<double> g_gemm_flops{0};

// --gemm-shapes: time per GEMM shape (m, n, k, transposes) over the measured steps of a row.
struct GemmShapeTime {
  std::int64_t ns = 0, calls = 0;
};
std::atomic<bool> g_by_shape{false};
std::mutex g_shapes_mu;
std::map<std::tuple<int, int, int, bool, bool>, GemmShapeTime> g_shapes;

using SgemmFn = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float, const float*,
                         blasint, const float*, blasint, float, float*, blasint);

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k,
                            float alpha, const float* a, blasint lda, const float* b, blasint ldb, float beta, float* c,
                            blasint ldc) {
  static SgemmFn real = reinterpret_cast<SgemmFn>(dlsym(RTLD_NEXT, "cblas_sgemm"));
  auto t0 = std::chrono::steady_clock::now();
  real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const std::int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  g_gemm_ns += ns;
  g_gemm_flops = g_gemm_flops + 2.0 * m * n * k;
  if (g_by_shape.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_shapes_mu);
    GemmShapeTime& e = g_shapes[{m, n, k, ta == CblasTrans, tb == CblasTrans}];
    e.ns += ns;
    ++e.calls;
  }
}

namespace stp {
namespace {

struct Options {
  std::string arch = "both";
  int layers = 6, heads = 6, embd = 384, seq = 256, batch = 8, vocab = 50257;
  int kv_heads = 2, inter = 1024, llama_vocab = 32000;
  int steps = 3, repeats = 3;
  std::string attention = "naive";
  bool gemm_shapes = false;
  std::string torch = "tools/bench/bench_model_torch.py";
};

ModelSpec model_of(const Options& o, const std::string& arch) {
  ModelSpec m;
  m.arch = arch;
  m.n_layer = o.layers;
  m.n_head = o.heads;
  m.n_embd = o.embd;
  m.seq_len = o.seq;
  m.attention = o.attention == "fused" ? AttentionKernel::Fused : AttentionKernel::Naive;
  m.precision = DType::F32;
  if (arch == "llama") {
    m.n_kv_head = o.kv_heads;
    m.intermediate_size = o.inter;
    m.vocab_size = o.llama_vocab;
    m.tie_embeddings = false;
  } else {
    m.n_kv_head = o.heads;
    m.vocab_size = o.vocab;
    m.tie_embeddings = true;
  }
  return m;
}

struct Optimizer {
  std::vector<Tensor> m, v;
  int step = 0;
};

void train_step(Stage& st, Optimizer& opt, Stream& s, const std::vector<std::int32_t>& ids, std::size_t n) {
  st.zero_grads(s);
  std::memcpy(st.tokens(0).raw(), ids.data(), 4 * n);
  std::memcpy(st.targets(0).raw(), ids.data() + 1, 4 * n);
  const int U = st.num_units();
  for (int u = 0; u < U; ++u) st.forward(u, 0, s);
  for (int u = U - 1; u >= 0; --u) {
    st.backward_input(u, 0, s);
    st.backward_weight(u, 0, s);
  }
  ++opt.step;
  AdamWHyper h{0.9f, 0.95f, 1e-8f, 0.1f};
  for (std::size_t i = 0; i < st.params().size(); ++i) {
    ParamInfo& p = st.params()[i];
    adamw_step(s, p.param.f32(), p.grad.f32(), opt.m[i].f32(), opt.v[i].f32(),
               static_cast<std::size_t>(p.param.numel()), 3e-4f, h, opt.step, p.decay);
  }
  s.synchronize();
}

// tokens/s of the torch script for `m` (0 when it is not run).
double run_torch(const Options& o, const ModelSpec& m) {
  if (o.torch.empty()) return 0;
  if (std::FILE* f = std::fopen(o.torch.c_str(), "r")) {
    std::fclose(f);
  } else {
    std::printf("torch: %s not found (run from the repo root or pass --torch PATH)\n", o.torch.c_str());
    return 0;
  }
  std::string cmd = "/usr/bin/python3 " + o.torch + " --arch " + m.arch + " --layers " + std::to_string(m.n_layer) +
                    " --heads " + std::to_string(m.n_head) + " --kv-heads " + std::to_string(m.n_kv_head) +
                    " --inter " + std::to_string(m.intermediate_size) + " --embd " + std::to_string(m.n_embd) +
                    " --seq " + std::to_string(m.seq_len) + " --batch " + std::to_string(o.batch) + " --vocab " +
                    std::to_string(m.vocab_size) + " --steps " + std::to_string(o.steps);
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  double tps = 0;
  while (std::fgets(line, sizeof line, p)) std::sscanf(line, "torch step %*f s tokens_per_s %lf", &tps);
  pclose(p);
  return tps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string spread(const std::vector<double>& v, const char* fmt) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  auto text = [fmt](double x) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, x);
    return std::string(b);
  };
  return text(median(v)) + " [" + text(*lo) + ", " + text(*hi) + "]";
}

void bench_row(const Options& o, const std::string& arch, double fma_peak) {
  const ModelSpec m = model_of(o, arch);
  auto devices = make_cpu_devices(1);
  auto s = devices[0]->create_stream(stp::trace::stream::kCompute);
  BlockArena alloc(*devices[0], *s, device_arena_options(*devices[0]));  // the trainer's caching allocator
  StageSpec spec;
  spec.layer_begin = 0;
  spec.layer_end = m.n_layer;
  spec.micro_batch_size = o.batch;
  std::unique_ptr<Stage> st = make_stage(m, spec, alloc);
  st->init_random(1234, *s);
  Optimizer opt;
  for (ParamInfo& p : st->params()) {
    opt.m.push_back(Tensor::empty(alloc, p.param.shape()));
    opt.v.push_back(Tensor::empty(alloc, p.param.shape()));
    s->zero(opt.m.back().raw(), opt.m.back().bytes());
    s->zero(opt.v.back().raw(), opt.v.back().bytes());
  }
  const std::size_t n = static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(m.seq_len);
  std::mt19937 rng(7);
  std::vector<std::int32_t> ids(n + 1);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<unsigned>(m.vocab_size));

  train_step(*st, opt, *s, ids, n);  // warm-up
  const std::uint64_t warm_segments = alloc.stats().segment_allocs;
  g_shapes.clear();
  g_by_shape = o.gemm_shapes;
  std::vector<double> stp_tps, torch_tps, ratios, gemm, gemm_rate, bounds;
  for (int r = 0; r < o.repeats; ++r) {
    g_gemm_ns = 0;
    g_gemm_flops = 0;
    const double t0 = now_s();
    for (int i = 0; i < o.steps; ++i) train_step(*st, opt, *s, ids, n);
    const double dt = (now_s() - t0) / o.steps;
    stp_tps.push_back(static_cast<double>(n) / dt);
    const double gemm_s = static_cast<double>(g_gemm_ns.load()) * 1e-9 / o.steps;
    gemm.push_back(100.0 * gemm_s / dt);
    gemm_rate.push_back(g_gemm_flops.load() / o.steps / gemm_s * 1e-9);
    const double t = run_torch(o, m);
    if (t > 0) {
      torch_tps.push_back(t);
      ratios.push_back(stp_tps.back() / t);
      // The ratio stp would reach if its step were its GEMMs alone: torch's step over stp's GEMM time.
      bounds.push_back(static_cast<double>(n) / gemm_s / t);
    }
  }
  g_by_shape = false;
  std::printf(
      "%s: n_layer %d n_head %d n_kv_head %d n_embd %d%s seq_len %d micro_batch %d vocab %d, %s attention; "
      "%d x %d steps\n",
      arch.c_str(), m.n_layer, m.n_head, m.n_kv_head, m.n_embd,
      arch == "llama" ? (" intermediate " + std::to_string(m.intermediate_size)).c_str() : "", m.seq_len, o.batch,
      m.vocab_size, o.attention.c_str(), o.repeats, o.steps);
  // Segments taken from the device after the warm-up step: 0 when the caching allocator serves
  // every later step from what it holds (no fresh pages to fault in).
  std::printf("  stp   tokens_per_s %s  gemm_share %s%%  peak_device %.1f MiB  new_segments %llu\n",
              spread(stp_tps, "%.1f").c_str(), spread(gemm, "%.1f").c_str(),
              static_cast<double>(devices[0]->memory_stats().peak) / (1 << 20),
              static_cast<unsigned long long>(alloc.stats().segment_allocs - warm_segments));
  std::printf("  stp   gemm_rate %s GFLOP/s", spread(gemm_rate, "%.1f").c_str());
  if (fma_peak > 0) std::printf(" = %.0f%% of the FMA peak", 100.0 * median(gemm_rate) / fma_peak);
  std::printf("\n");
  if (o.gemm_shapes) {
    std::printf("  stp GEMM time per step by shape (m n k, op(a) op(b)), over all repeats:\n");
    const double measured_steps = static_cast<double>(o.repeats) * o.steps;
    for (const auto& [shape, t] : g_shapes) {
      const auto [sm, sn, sk, sta, stb] = shape;
      std::printf("    %6d %6d %6d  %c%c  %5.0f calls  %7.1f ms  %6.1f GFLOP/s\n", sm, sn, sk, sta ? 'T' : 'N',
                  stb ? 'T' : 'N', static_cast<double>(t.calls) / measured_steps,
                  static_cast<double>(t.ns) * 1e-6 / measured_steps,
                  2.0 * sm * sn * sk * static_cast<double>(t.calls) / static_cast<double>(t.ns));
    }
  }
  if (!torch_tps.empty()) {
    std::printf("  torch tokens_per_s %s\n", spread(torch_tps, "%.1f").c_str());
    std::printf("  ratio stp/torch %s\n", spread(ratios, "%.3f").c_str());
    std::printf("  ratio bound (stp's step = its GEMM time) %s\n", spread(bounds, "%.3f").c_str());
  }
}

int bench(const Options& o) {
  openblas_set_num_threads(2);
  const double fma_peak = tools::measured_fma_peak_gflops(2);
  if (fma_peak > 0) std::printf("cpu: f32 FMA peak %.1f GFLOP/s on 2 threads (measured)\n", fma_peak);
  if (o.arch == "both" || o.arch == "gpt2") bench_row(o, "gpt2", fma_peak);
  if (o.arch == "both" || o.arch == "llama") bench_row(o, "llama", fma_peak);
  return 0;
}

}  // namespace
}  // namespace stp

int main(int argc, char** argv) {
  stp::tools::reexec_with_blas_tuning(argv);  // OpenBLAS reads its settings when it loads
  stp::Options o;
  CLI::App app{
      "Training throughput of a GPT-2 and a Llama stage on the CPU backend, single rank: tokens/s, GEMM "
      "share of the step, GEMM rate against the CPU's measured f32 FMA peak and, with the torch script, the "
      "same models in PyTorch, the ratios and the ratio bound if stp's step were its GEMMs alone.",
      "bench_model"};
  stp::tools::init_cli(app);
  app.add_option("--arch", o.arch, "rows to run")
      ->check(CLI::IsMember({"both", "gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--repeats", o.repeats, "alternating stp / torch measurements")->type_name("R")->capture_default_str();
  app.add_option("--steps", o.steps, "measured steps per repeat, after one warm-up step")
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "n_layer")->type_name("L")->capture_default_str();
  app.add_option("--heads", o.heads, "n_head")->type_name("H")->capture_default_str();
  app.add_option("--embd", o.embd, "n_embd")->type_name("C")->capture_default_str();
  app.add_option("--seq", o.seq, "seq_len")->type_name("T")->capture_default_str();
  app.add_option("--batch", o.batch, "micro-batch size")->type_name("B")->capture_default_str();
  app.add_option("--vocab", o.vocab, "GPT-2 vocab_size")->type_name("V")->capture_default_str();
  app.add_option("--kv-heads", o.kv_heads, "Llama n_kv_head")->type_name("K")->capture_default_str();
  app.add_option("--inter", o.inter, "Llama intermediate_size")->type_name("I")->capture_default_str();
  app.add_option("--llama-vocab", o.llama_vocab, "Llama vocab_size")->type_name("V")->capture_default_str();
  app.add_option("--attention", o.attention, "stp's attention kernel (the torch script's is the naive one)")
      ->check(CLI::IsMember({"naive", "fused"}))
      ->capture_default_str();
  app.add_flag("--gemm-shapes", o.gemm_shapes, "print stp's GEMM time per step by shape, with its GFLOP/s");
  auto* torch = app.add_option("--torch", o.torch, "the PyTorch script to compare with (run from the repository root)")
                    ->type_name("PATH")
                    ->capture_default_str();
  app.add_flag_callback(
         "--no-torch", [&] { o.torch.clear(); }, "skip the PyTorch comparison")
      ->excludes(torch);
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] { return stp::bench(o); });
}
