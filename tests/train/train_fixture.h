// Shared helpers of the trainer tests: a tiny GPT-2 config over a small generated text file.
#pragma once

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config/config.h"
#include "formats/safetensors.h"
#include "tests/support/run_command.h"
#include "train/trainer.h"

namespace stp::testing {

// GoogleTest name of a parameterised layout case (any param with dp, pp, tp and schedule):
// "dp2_pp2_tp1_zb_v".
template <class Param>
std::string layout_case_name(const ::testing::TestParamInfo<Param>& p) {
  std::string s = p.param.schedule;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return "dp" + std::to_string(p.param.dp) + "_pp" + std::to_string(p.param.pp) + "_tp" + std::to_string(p.param.tp) +
         "_" + s;
}

// Sanitizer builds (tests/CMakeLists.txt defines STP_TEST_SANITIZED there) look for races and
// memory errors, not numerics, and run ~10x slower: the long sweeps (schedule x lever x budget)
// run a subset there that still reaches every lever and schedule somewhere in the suite; the
// release build runs every sweep whole.
#ifdef STP_TEST_SANITIZED
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// The cases of a sweep: `full` in the release build, `sanitized` (a subset) under a sanitizer.
template <class T>
std::vector<T> sweep(std::vector<T> full, std::vector<T> sanitized) {
  return kSanitizerBuild ? sanitized : full;
}

// A deterministic English-ish text of ~20 KB, written once per test process. ctest runs tests as
// parallel processes, so each writes a private file and renames it into place: a reader never
// sees a half-written file.
inline std::string tiny_text_file() {
  static const std::string path = [] {
    std::string p = std::string(STP_BINARY_DIR) + "/tests/tiny_text.txt";
    std::string tmp = p + ".tmp." + std::to_string(::getpid());
    std::ofstream f(tmp, std::ios::binary);
    const char* words[] = {"the ", "pipeline ",  "braids ",        "forward ", "and ",  "backward ",   "units ",
                           "of ",  "different ", "microbatches, ", "so ",      "each ", "all-reduce ", "hides. "};
    unsigned x = 12345;
    for (int i = 0; i < 3000; ++i) {
      x = x * 1103515245u + 12345u;
      f << words[(x >> 16) % 14];
    }
    f.close();
    std::filesystem::rename(tmp, p);
    return p;
  }();
  return path;
}

// A fresh folder `dir` holding config.yaml for `stp train`: one step of a one-layer byte-level
// GPT-2 on tiny_text_file() at tp 1, pp 1, writing into dir/out. Returns the config's path.
inline std::filesystem::path fresh_tiny_run_config(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.yaml")
      << "model: {arch: gpt2, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, seq_len: 16}\n"
      << "data: {path: " << tiny_text_file() << ", format: text}\n"
      << "train: {steps: 1, micro_batch_size: 1, microbatches: 1}\n"
      << "parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}\n"
      << "output: {dir: " << (dir / "out").string() << "}\n";
  return dir / "config.yaml";
}

// A u16 token file of 4000 tokens, token i = (i * 37 + 11) mod 64 (the reference models' vocab
// of 64). Written under a temporary name and renamed, so test processes running in parallel never
// read it half written.
inline std::string tokens64_file() {
  static const std::string path = [] {
    std::string p = std::string(STP_BINARY_DIR) + "/tests/tokens64.u16";
    std::string tmp = p + ".tmp." + std::to_string(::getpid());
    std::ofstream f(tmp, std::ios::binary);
    for (std::uint16_t i = 0; i < 4000; ++i) {
      std::uint16_t t = static_cast<std::uint16_t>((i * 37 + 11) % 64);
      f.write(reinterpret_cast<const char*>(&t), 2);
    }
    f.close();
    std::filesystem::rename(tmp, p);
    return p;
  }();
  return path;
}

// An empty output folder under the build tree for `name` in the current test instance: ctest runs
// the instances of a parameterized test as parallel processes, which must not write each other's
// checkpoints.
inline std::string fresh_dir(const std::string& name) {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string unique = name + "_" + t->test_suite_name() + "_" + t->name();
  for (char& ch : unique)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  auto d = std::filesystem::path(STP_BINARY_DIR) / "tests" / unique;
  std::filesystem::remove_all(d);
  return d.string();
}

// Overrides `base` followed by `more` (later assignments win).
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// tiny_config's model as a small Llama: grouped-query attention (2 kv heads), MLP width 64.
inline const std::vector<std::string> kLlama = {"model.arch=llama", "model.intermediate_size=64", "model.n_kv_head=2"};

// n_layer 8 splits into 8 stages (pp 4 with two chunks); m = 8 is STP's minimum for pp 4.
inline Config tiny_config(const std::vector<std::string>& overrides) {
  std::string yaml = R"(
model: {arch: gpt2, n_layer: 8, n_head: 4, n_embd: 32, vocab_size: 256, seq_len: 16}
data: {format: text, sampling: sequential}
train: {steps: 3, micro_batch_size: 2, microbatches: 8, lr: 1.0e-3, lr_schedule: constant, warmup_steps: 0,
        grad_clip: 1.0, seed: 7}
optim: {name: adamw, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}
parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}
memory: {offload: none, recompute: none}
output: {dir: unused, log_every: 1}
)";
  std::vector<std::string> all = {"data.path=" + tiny_text_file()};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return load_config_from_string(yaml, "tiny test config", all);
}

// Worst per-tensor normwise relative error ||a - b||_2 / ||b||_2 over all tensors (b = reference).
// Normwise, not elementwise: after AdamW steps, entries whose gradient is near eps (or exactly zero
// in exact arithmetic, like GPT-2's key bias, to which softmax is invariant) carry Adam-normalised
// rounding noise of order lr * g / eps, so an elementwise relative test would compare noise.
//
// The key bias (the middle third of c_attn.bias) is left out here and checked by
// key_bias_max_abs_diff: its gradient is exactly zero in exact arithmetic, so its values are
// pure Adam-amplified noise with no reference value to be relative to.
inline bool is_key_bias(const std::string& name, std::size_t i, std::size_t n) {
  return name.size() > 16 && name.compare(name.size() - 16, 16, "attn.c_attn.bias") == 0 && i >= n / 3 && i < 2 * n / 3;
}

inline double max_rel_diff(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b,
                           std::string* where = nullptr) {
  double worst = 0;
  for (const auto& [name, tb] : b) {
    const HostTensor& ta = a.at(name);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < tb.data.size(); ++i) {
      if (is_key_bias(name, i, tb.data.size())) continue;
      double d = static_cast<double>(ta.data[i]) - tb.data[i];
      num += d * d;
      den += static_cast<double>(tb.data[i]) * tb.data[i];
    }
    double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (rel > worst) {
      worst = rel;
      if (where) *where = name;
    }
  }
  return worst;
}

inline double key_bias_max_abs_diff(const std::map<std::string, HostTensor>& a,
                                    const std::map<std::string, HostTensor>& b) {
  double worst = 0;
  for (const auto& [name, tb] : b)
    for (std::size_t i = 0; i < tb.data.size(); ++i)
      if (is_key_bias(name, i, tb.data.size()))
        worst = std::max(worst, std::fabs(static_cast<double>(a.at(name).data[i]) - tb.data[i]));
  return worst;
}

inline bool bitwise_equal(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b) {
  for (const auto& [name, tb] : b)
    if (a.at(name).data != tb.data) return false;
  return a.size() == b.size();
}

// What a short training run shows: per-step losses, the final parameters, and the memory of the
// last step (per device, global rank order) next to the plan it ran.
struct TrainRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // StepResult::grad_norm of each step
  std::map<std::string, HostTensor> params;
  std::vector<std::uint64_t> peaks;      // StepResult::peak_device_bytes (live bytes; what the planner predicts)
  std::vector<std::uint64_t> reserved;   // StepResult::peak_device_reserved_bytes (taken from the device)
  std::uint64_t pinned = 0;              // StepResult::peak_host_pinned_bytes
  std::vector<std::uint64_t> offloaded;  // D2H bytes of the last step per device (empty: nothing offloads)
  MemoryPlan plan;
};

inline TrainRun run_training(const Config& config, int steps) {
  Trainer t(config);
  TrainRun out;
  for (int i = 0; i < steps; ++i) {
    StepResult r = t.step();
    out.losses.push_back(r.loss);
    out.grad_norms.push_back(r.grad_norm);
    out.peaks = r.peak_device_bytes;
    out.reserved = r.peak_device_reserved_bytes;
    out.pinned = r.peak_host_pinned_bytes;
    out.offloaded.clear();
    for (const auto& o : r.offload) out.offloaded.push_back(o.d2h_bytes);
  }
  out.params = t.full_parameters();
  out.plan = t.memory_plan();
  return out;
}

// Same losses and parameters, to the bit.
inline void expect_bitwise_equal(const TrainRun& a, const TrainRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  ASSERT_EQ(a.params.size(), b.params.size());
  for (const auto& [name, t] : a.params) {
    const HostTensor& u = b.params.at(name);
    ASSERT_EQ(t.data.size(), u.data.size()) << name;
    EXPECT_EQ(0, std::memcmp(t.data.data(), u.data.data(), sizeof(float) * t.data.size())) << name;
  }
}

// The run's measured memory against its plan, per device: the live-byte peak equals the prediction
// and, like the bytes reserved from the device, stays within `budget`; each device offloads exactly
// the predicted bytes; the pinned pools (activations, the optimizer state under
// memory.optimizer_offload, the streamed weights and gradients under memory.param_offload) are as
// large as predicted.
inline void expect_memory_as_planned(const TrainRun& r, std::uint64_t budget) {
  ASSERT_EQ(r.peaks.size(), r.plan.predicted.size());
  ASSERT_EQ(r.reserved.size(), r.peaks.size());
  std::uint64_t pinned = 0;
  for (std::size_t g = 0; g < r.peaks.size(); ++g) {
    EXPECT_EQ(r.peaks[g], r.plan.predicted[g].peak_device_bytes) << "device " << g;
    EXPECT_LE(r.peaks[g], budget) << "device " << g;
    EXPECT_LE(r.reserved[g], budget) << "device " << g;
    pinned += r.plan.predicted[g].host_pinned_bytes + r.plan.predicted[g].optimizer_host_bytes +
              r.plan.predicted[g].streamed_weight_bytes + r.plan.predicted[g].streamed_grad_bytes;
    std::uint64_t offloaded = r.offloaded.empty() ? 0 : r.offloaded[g];
    EXPECT_EQ(offloaded, r.plan.predicted[g].offload_bytes_per_step) << "device " << g;
  }
  EXPECT_EQ(r.pinned, pinned);
}

// The memory levers against keeping everything, for the job `base` (overrides; train(overrides,
// steps) trains one): offload all, recompute full, recompute selective, and the planner's mix
// (offload and recompute auto) under a budget halfway between the keep-everything peak and the
// plan's minimum (from one step with both on auto). Each lever, `steps` steps like keeping
// everything, must train bitwise like it with a lower peak on device 0; with `as_planned` its
// memory must also be as planned (expect_memory_as_planned, under the mix's budget, or the
// config's default memory.device_budget, 256 MiB, for the forced levers).
template <class Train>
void expect_memory_levers_neutral(Train train, const std::vector<std::string>& base, int steps, bool as_planned) {
  const TrainRun keep = train(base, steps);
  std::vector<std::string> autos = base;
  autos.insert(autos.end(), {"memory.offload=auto", "memory.recompute=auto"});
  const std::size_t minimum = train(autos, 1).plan.min_device_budget;
  const std::uint64_t mix_budget = (keep.peaks[0] + minimum) / 2;
  for (std::vector<std::string> lever : std::vector<std::vector<std::string>>{
           {"memory.offload=all"},
           {"memory.recompute=full"},
           {"memory.recompute=selective"},
           {"memory.offload=auto", "memory.recompute=auto", "memory.device_budget=" + std::to_string(mix_budget)}}) {
    SCOPED_TRACE(lever.back());
    const std::uint64_t budget = lever.size() == 3 ? mix_budget : 256ull << 20;
    lever.insert(lever.end(), base.begin(), base.end());
    const TrainRun r = train(lever, steps);
    expect_bitwise_equal(r, keep);
    EXPECT_LT(r.peaks[0], keep.peaks[0]) << "the lever saved nothing";
    if (as_planned) expect_memory_as_planned(r, budget);
  }
}

// Sets the fault hook (train/fault_hook.h) to plant a NaN gradient on `rank` at `step` for one
// scope: a Trainer reads it when it is built.
struct NanGradHook {
  NanGradHook(int rank, int step) {
    ::setenv("STP_FAULT_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("STP_FAULT_STEP", std::to_string(step).c_str(), 1);
    ::setenv("STP_FAULT_KIND", "nan_grad", 1);
  }
  ~NanGradHook() {
    ::unsetenv("STP_FAULT_RANK");
    ::unsetenv("STP_FAULT_STEP");
    ::unsetenv("STP_FAULT_KIND");
  }
  NanGradHook(const NanGradHook&) = delete;
  NanGradHook& operator=(const NanGradHook&) = delete;
};

// A run that ends in a checkpoint: the losses, the final parameters and the checkpoint's files.
struct CheckpointedRun {
  std::vector<double> losses;
  std::map<std::string, HostTensor> params;
  std::string model_file, optimizer_file;  // the final checkpoint's bytes
};

// `steps` steps of tiny_config(overrides) in fresh_dir(dir), then a checkpoint.
inline CheckpointedRun train_and_checkpoint(const std::vector<std::string>& overrides, const std::string& dir,
                                            int steps) {
  Config cfg = tiny_config(overrides);
  cfg.output.dir = fresh_dir(dir);
  Trainer t(cfg);
  CheckpointedRun out;
  for (int i = 0; i < steps; ++i) out.losses.push_back(t.step().loss);
  out.params = t.full_parameters();
  std::filesystem::path ck = t.save_checkpoint();
  out.model_file = slurp((ck / "model.safetensors").string());
  out.optimizer_file = slurp((ck / "optimizer.safetensors").string());
  return out;
}

// Losses, parameters and the optimizer file equal, to the bit.
inline void expect_bitwise_equal(const CheckpointedRun& a, const CheckpointedRun& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
  EXPECT_TRUE(bitwise_equal(a.params, b.params));
  EXPECT_TRUE(a.optimizer_file == b.optimizer_file);
}

// Resume across a setting: `with(on)` are the overrides with the setting on or off. 2 steps with
// it on (off), a checkpoint, 2 more with it off (on) equal the uninterrupted 4 steps with it off,
// bitwise: losses, parameters and the optimizer file of a final checkpoint. `dir` names the folders.
template <class With>
void expect_resume_crosses_the_setting(const With& with, const std::string& dir) {
  const CheckpointedRun whole = train_and_checkpoint(with(false), dir + "_whole", 4);
  for (bool first_on : {true, false}) {
    SCOPED_TRACE(first_on ? "on, then off" : "off, then on");
    std::string ckpt;
    {
      Config cfg = tiny_config(with(first_on));
      cfg.output.dir = fresh_dir(dir + (first_on ? "_a" : "_b"));
      Trainer t(cfg);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(t.step().loss, whole.losses[static_cast<std::size_t>(i)]);
      ckpt = t.save_checkpoint();
    }
    Config cfg = tiny_config(with(!first_on));
    cfg.output.dir = std::filesystem::path(ckpt).parent_path().string();
    cfg.train.resume = ckpt;
    Trainer t(cfg);
    for (int i = 2; i < 4; ++i) EXPECT_EQ(t.step().loss, whole.losses[static_cast<std::size_t>(i)]) << "step " << i + 1;
    EXPECT_TRUE(bitwise_equal(t.full_parameters(), whole.params));
    std::filesystem::path ck = t.save_checkpoint();
    EXPECT_TRUE(slurp((ck / "optimizer.safetensors").string()) == whole.optimizer_file);
  }
}

}  // namespace stp::testing
