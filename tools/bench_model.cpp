// Training throughput of the GPT-2 stage on the CPU backend, single rank, against PyTorch.
//
//   build-models/bench_model [--steps N] [--layers L] [--heads H] [--embd C] [--seq T] [--batch B]
//                            [--vocab V] [--torch tools/bench_model_torch.py | --no-torch]
//   (--help lists the defaults)
//
// One step = zero_grads, F of every unit, B and W fused in reverse unit order, AdamW on every
// parameter (the optimizer kernel of core/kernels/optim_kernels.h). Prints tokens/s, the GEMM
// share of the step time and, when the torch script is found (run from the repo root), the same
// model's tokens/s in PyTorch (torch.set_num_threads(2)) and the ratio, measured in this run.
//
// GEMM time: this executable defines cblas_sgemm itself, so the CPU backend's calls land here
// (the executable's symbol takes precedence); it times the call and forwards to OpenBLAS's
// definition found with dlsym(RTLD_NEXT). Nothing in the library is instrumented.
#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/kernels/optim_kernels.h"
#include "memory/block_arena.h"
#include "models/gpt2_stage.h"
#include "tools/cli.h"

namespace {

std::atomic<std::int64_t> g_gemm_ns{0};

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
  g_gemm_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

namespace stp {
namespace {

struct Options {
  GPT2Config cfg{6, 6, 384, 50257, 256, 0};
  int batch = 8, steps = 3;
  std::string torch = "tools/bench_model_torch.py";
};

struct Optimizer {
  std::vector<Tensor> m, v;
  int step = 0;
};

void train_step(GPT2Stage& st, Optimizer& opt, Stream& s, const std::vector<std::int32_t>& ids) {
  st.zero_grads(s);
  std::memcpy(st.tokens(0).raw(), ids.data(), 4 * static_cast<std::size_t>(st.dims().N()));
  std::memcpy(st.targets(0).raw(), ids.data() + 1, 4 * static_cast<std::size_t>(st.dims().N()));
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

double run_torch(const Options& o) {
  if (o.torch.empty()) return 0;
  if (std::FILE* f = std::fopen(o.torch.c_str(), "r")) {
    std::fclose(f);
  } else {
    std::printf("torch: %s not found (run from the repo root or pass --torch PATH)\n", o.torch.c_str());
    return 0;
  }
  std::string cmd = "/usr/bin/python3 " + o.torch + " --layers " + std::to_string(o.cfg.n_layer) + " --heads " +
                    std::to_string(o.cfg.n_head) + " --embd " + std::to_string(o.cfg.n_embd) + " --seq " +
                    std::to_string(o.cfg.seq_len) + " --batch " + std::to_string(o.batch) + " --vocab " +
                    std::to_string(o.cfg.vocab_size) + " --steps " + std::to_string(o.steps);
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  double tps = 0;
  while (std::fgets(line, sizeof line, p)) {
    std::fputs(line, stdout);
    std::sscanf(line, "torch step %*f s tokens_per_s %lf", &tps);
  }
  pclose(p);
  return tps;
}

int bench(const Options& o) {
  openblas_set_num_threads(2);
  auto devices = make_cpu_devices(1);
  auto s = devices[0]->create_stream("compute");
  BlockArena alloc(*devices[0], *s, device_arena_options(*devices[0]));  // the trainer's caching allocator
  GPT2Stage st(o.cfg, GPT2StageSpec{0, o.cfg.n_layer, 0, 1, o.batch}, alloc);
  st.param_store().init_random(1234, *s);
  Optimizer opt;
  for (ParamInfo& p : st.params()) {
    opt.m.push_back(Tensor::empty(alloc, p.param.shape()));
    opt.v.push_back(Tensor::empty(alloc, p.param.shape()));
    s->zero(opt.m.back().raw(), opt.m.back().bytes());
    s->zero(opt.v.back().raw(), opt.v.back().bytes());
  }
  std::mt19937 rng(7);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(o.batch * o.cfg.seq_len + 1));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<unsigned>(o.cfg.vocab_size));

  train_step(st, opt, *s, ids);  // warm-up
  g_gemm_ns = 0;
  double t0 = now_s();
  for (int i = 0; i < o.steps; ++i) train_step(st, opt, *s, ids);
  double dt = (now_s() - t0) / o.steps;
  double gemm_share = static_cast<double>(g_gemm_ns.load()) * 1e-9 / o.steps / dt;
  double tokens = static_cast<double>(o.batch) * o.cfg.seq_len;
  std::printf("model: n_layer %d n_head %d n_embd %d seq_len %d micro_batch %d vocab %d; %d steps after 1 warm-up\n",
              o.cfg.n_layer, o.cfg.n_head, o.cfg.n_embd, o.cfg.seq_len, o.batch, o.cfg.vocab_size, o.steps);
  std::printf("stp   step %.3f s  tokens_per_s %.1f  gemm_share %.1f%%  peak_device %.1f MiB\n", dt, tokens / dt,
              100.0 * gemm_share, static_cast<double>(devices[0]->memory_stats().peak) / (1 << 20));
  double torch_tps = run_torch(o);
  if (torch_tps > 0) std::printf("ratio stp/torch %.3f\n", tokens / dt / torch_tps);
  return 0;
}

}  // namespace
}  // namespace stp

int main(int argc, char** argv) {
  stp::Options o;
  CLI::App app{
      "Training throughput of the GPT-2 stage on the CPU backend, single rank: tokens/s, GEMM share of "
      "the step and, with the torch script, the same model in PyTorch and the ratio.",
      "bench_model"};
  stp::tools::init_cli(app);
  app.add_option("--steps", o.steps, "measured steps, after one warm-up step")->type_name("N")->capture_default_str();
  app.add_option("--layers", o.cfg.n_layer, "n_layer")->type_name("L")->capture_default_str();
  app.add_option("--heads", o.cfg.n_head, "n_head")->type_name("H")->capture_default_str();
  app.add_option("--embd", o.cfg.n_embd, "n_embd")->type_name("C")->capture_default_str();
  app.add_option("--seq", o.cfg.seq_len, "seq_len")->type_name("T")->capture_default_str();
  app.add_option("--batch", o.batch, "micro-batch size")->type_name("B")->capture_default_str();
  app.add_option("--vocab", o.cfg.vocab_size, "vocab_size")->type_name("V")->capture_default_str();
  auto* torch = app.add_option("--torch", o.torch, "the PyTorch script to compare with (run from the repository root)")
                    ->type_name("PATH")
                    ->capture_default_str();
  app.add_flag_callback(
         "--no-torch", [&] { o.torch.clear(); }, "skip the PyTorch comparison")
      ->excludes(torch);
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] { return stp::bench(o); });
}
