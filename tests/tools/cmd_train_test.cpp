// `stp train` end to end: bad input exits non-zero with a message naming the problem and leaves
// an earlier run's output untouched; Ctrl-C finishes the step, checkpoints and exits with 130
// (the other signals: train_signals_test.cpp); a resume with nothing left to train is an error; the
// end-of-run line reports skipped steps in words.
#include <gtest/gtest.h>

#include <algorithm>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "formats/checkpoint.h"
#include "tests/support/run_command.h"
#include "tests/train/guard_overflow.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

struct RunDir {
  fs::path dir, config;
  explicit RunDir(const std::string& name, const std::string& extra_yaml = "") {
    dir = fs::path(STP_BINARY_DIR) / "tests" / name;
    fs::remove_all(dir);
    fs::create_directories(dir / "out");
    std::ofstream(dir / "out" / "metrics.jsonl") << "{\"step\":1,\"loss\":9.0} earlier run\n";
    config = dir / "config.yaml";
    std::ofstream f(config);
    f << "model: {arch: gpt2, n_layer: 4, n_head: 4, n_embd: 32, vocab_size: 256, seq_len: 16}\n"
      << "data: {path: " << stp::testing::tiny_text_file() << ", format: text}\n"
      << "train: {steps: 3, micro_batch_size: 2, microbatches: 4}\n"
      << "parallel: {backend: cpu, tp: 2, pp: 2, schedule: stp, cpu_threads: 1}\n"
      << "output: {dir: " << (dir / "out").string() << "}\n"
      << extra_yaml;
  }
  std::string earlier_metrics() const { return stp::testing::slurp((dir / "out" / "metrics.jsonl").string()); }
};

void expect_clean_failure(const std::string& name, const std::string& sets, const std::string& needle,
                          const std::string& extra_yaml = "") {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run(name, extra_yaml);
  auto r = stp::testing::run_stp("train " + run.config.string() + " " + sets);
  EXPECT_NE(r.status, 0) << name;
  EXPECT_NE(r.err.find(needle), std::string::npos) << name << ": stderr was: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  EXPECT_EQ(run.earlier_metrics(), "{\"step\":1,\"loss\":9.0} earlier run\n") << name << ": earlier output changed";
  EXPECT_FALSE(fs::exists(run.dir / "out" / "earlier-run-1")) << name << ": output dir was touched";
}

TEST(CmdTrain, UnknownKeyInTheFile) {
  expect_clean_failure("bad_key_file", "", "optim.betta1", "optim: {betta1: 0.9}\n");
}
TEST(CmdTrain, UnknownKeyInSet) { expect_clean_failure("bad_key_set", "--set train.stepz=4", "train.stepz"); }
TEST(CmdTrain, TpNotDividingHeads) { expect_clean_failure("bad_tp", "--set parallel.tp=3", "n_head"); }
TEST(CmdTrain, LayersTheScheduleCannotPlace) {
  expect_clean_failure("bad_layers", "--set model.n_layer=6", "model.n_layer = 6 cannot be split evenly into 4");
}
TEST(CmdTrain, TooFewMicrobatchesForTheSchedule) {
  expect_clean_failure("bad_m", "--set train.microbatches=3", "needs at least 4 microbatches");
}
TEST(CmdTrain, MissingDataFile) {
  expect_clean_failure("bad_data", "--set data.path=/nonexistent/corpus.txt", "/nonexistent/corpus.txt");
}
TEST(CmdTrain, CudaBackendWithoutAGpu) {
  std::string why;
  if (stp::cuda_usable(4, &why)) GTEST_SKIP() << "GPUs are usable here";
  // One line naming what was found (this build without CUDA, no driver, too few GPUs) and what to do.
  expect_clean_failure("bad_cuda", "--set parallel.backend=cuda",
                       "parallel.backend is cuda but " + why + "; use parallel.backend: cpu");
}

// A failure of the device runtime or a device library (here injected as one) is a DeviceError:
// `stp` says "device error" and exits with status 4, not 1 (the user's input) or 3 (a bug).
TEST(CmdTrain, DeviceErrorExitsWithStatus4) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("device_error");
  ::setenv("STP_FAULT_RANK", "1", 1);
  ::setenv("STP_FAULT_KIND", "device", 1);
  auto r = stp::testing::run_stp("train " + run.config.string() + " --set train.steps=1");
  ::unsetenv("STP_FAULT_RANK");
  ::unsetenv("STP_FAULT_KIND");
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("stp train: device error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("injected failure of rank 1 in step 1"), std::string::npos) << r.err;
}

// A sticky device error poisons the process's GPU state (core/gpu_logic.h): the teardown that
// follows releases nothing and throws nothing, and the first error is what `stp` reports.
TEST(CmdTrain, StickyDeviceErrorExitsWithStatus4AndTheFirstMessage) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("sticky_error");
  ::setenv("STP_FAULT_RANK", "0", 1);
  ::setenv("STP_FAULT_KIND", "sticky", 1);
  auto r = stp::testing::run_stp("train " + run.config.string() + " --set train.steps=1");
  ::unsetenv("STP_FAULT_RANK");
  ::unsetenv("STP_FAULT_KIND");
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_EQ(r.err.rfind("stp train: device error: STP_FAULT_RANK: injected failure of rank 0 in step 1", 0), 0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

TEST(CmdTrain, TruncatedCheckpoint) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir good("truncated_ckpt_source");
  auto r = stp::testing::run_stp("train " + good.config.string() + " --set train.steps=1");
  ASSERT_EQ(r.status, 0) << r.err;
  fs::path model = good.dir / "out" / "checkpoint-1" / "model.safetensors";
  ASSERT_TRUE(fs::exists(model)) << r.err;
  fs::resize_file(model, fs::file_size(model) - 100);
  expect_clean_failure("truncated_ckpt", "--set train.resume=" + (good.dir / "out" / "checkpoint-1").string(),
                       "model.safetensors");
}

// Outputs never overwrite inputs: an output.dir that is an input, lies inside an input folder or
// holds an input (data.path, data.val_path, their loss masks, data.tokenizer, model.init_from,
// the config file) is refused before anything is written: no config.yaml, no earlier run moved
// aside, the input as it was.
TEST(CmdTrain, OutputDirHoldingAnInputIsRefused) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  struct Case {
    const char* name;
    std::string input;  // written under out/ before the run, a copy of the tiny text
    std::string sets;   // with OUT for the output folder
    const char* key;    // the input the message names
  };
  const std::vector<Case> cases = {
      {"out_holds_data", "corpus.txt", "--set data.path=OUT/corpus.txt", "data.path"},
      {"out_is_data", "corpus.txt", "--set data.path=OUT", "data.path"},
      {"out_in_data", "corpus.txt", "--set data.path=OUT --set output.dir=OUT/run", "data.path"},
      {"out_holds_val", "val.txt", "--set data.val_path=OUT/val.txt --set train.eval_every=1", "data.val_path"},
      {"out_holds_init", "init.safetensors", "--set model.init_from=OUT/init.safetensors", "model.init_from"},
      {"out_holds_tokenizer", "tokenizer.json", "--set data.format=u16 --set data.tokenizer=OUT/tokenizer.json",
       "data.tokenizer"},
      {"out_holds_mask", "corpus.mask", "--set data.mask_path=OUT/corpus.mask", "data.mask_path"},
      {"out_holds_val_mask", "val.mask",
       "--set data.val_path=" + stp::testing::tiny_text_file() + " --set data.val_mask_path=OUT/val.mask",
       "data.val_mask_path"},
  };
  for (const Case& c : cases) {
    RunDir run(c.name);
    const fs::path out = run.dir / "out", input = out / c.input;
    fs::copy_file(stp::testing::tiny_text_file(), input);
    const std::string before = stp::testing::slurp(input.string());
    std::string sets = c.sets;
    for (std::size_t at; (at = sets.find("OUT")) != std::string::npos;) sets.replace(at, 3, out.string());
    auto r = stp::testing::run_stp("train " + run.config.string() + " " + sets);
    EXPECT_EQ(r.status, 1) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find("output.dir"), std::string::npos) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.key), std::string::npos) << c.name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.name << ": one line: " << r.err;
    EXPECT_EQ(stp::testing::slurp(input.string()), before) << c.name << ": the input changed";
    EXPECT_EQ(run.earlier_metrics(), "{\"step\":1,\"loss\":9.0} earlier run\n") << c.name;
    EXPECT_FALSE(fs::exists(out / "earlier-run-1")) << c.name << ": an earlier run was moved";
    EXPECT_FALSE(fs::exists(out / "config.yaml")) << c.name << ": config.yaml was written";
    EXPECT_FALSE(fs::exists(out / "run")) << c.name << ": the output folder was created";
  }
  // The config file itself inside output.dir (here where the run would write its config.yaml).
  RunDir run("out_holds_config");
  const fs::path config = run.dir / "out" / "config.yaml";
  fs::copy_file(run.config, config);
  const std::string before = stp::testing::slurp(config.string());
  auto r = stp::testing::run_stp("train " + config.string());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("config"), std::string::npos) << r.err;
  EXPECT_EQ(stp::testing::slurp(config.string()), before) << "the config file was replaced";
  EXPECT_FALSE(fs::exists(run.dir / "out" / "earlier-run-1"));
}

// data.path and data.val_path are regular files (or a folder): /dev/zero never ends, so it is
// refused before it is read, at once, instead of growing memory without a message. (Under an
// address-space limit and a timeout, so that a regression fails here rather than exhausting the
// machine.)
TEST(CmdTrain, DataPathThatNeverEndsIsRefusedPromptly) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  for (const std::string key : {"data.path", "data.val_path"}) {
    RunDir run("dev_zero");
    const auto t0 = std::chrono::steady_clock::now();
    auto r = stp::testing::run_command("ulimit -v 16777216; timeout 60 " + std::string(STP_BINARY_DIR) + "/stp train " +
                                       run.config.string() + " --set " + key + "=/dev/zero" +
                                       (key == "data.val_path" ? " --set train.eval_every=1" : ""));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.status, 1) << key << ": " << r.err;
    EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("'/dev/zero' is a character device"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_LT(s, 30.0) << key;
    EXPECT_EQ(run.earlier_metrics(), "{\"step\":1,\"loss\":9.0} earlier run\n") << key;
  }
}

TEST(CmdTrain, FreshRunKeepsTheEarlierRunAndWritesMetrics) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("fresh_run");
  auto r = stp::testing::run_stp("train " + run.config.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(stp::testing::slurp((run.dir / "out" / "earlier-run-1" / "metrics.jsonl").string()),
            "{\"step\":1,\"loss\":9.0} earlier run\n");
  std::string metrics = run.earlier_metrics();  // now the new run's file
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 3);
  for (const char* key : {"\"step\":3", "\"loss\":", "\"lr\":", "\"step_ms\":", "\"tokens_per_s\":",
                          "\"peak_device_bytes\":[", "\"peak_host_pinned_bytes\":", "\"launches\":[",
                          "\"late_gemm_choices\":[0"})  // every GEMM shape prepared at setup
    EXPECT_NE(metrics.find(key), std::string::npos) << key << " missing in " << metrics;
  EXPECT_TRUE(fs::exists(run.dir / "out" / "checkpoint-3" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(run.dir / "out" / "config.yaml"));
}

TEST(CmdTrain, CtrlCFinishesTheStepCheckpointsAndExits) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("sigint");
  std::string stp_path = std::string(STP_BINARY_DIR) + "/stp";
  std::string cfg = run.config.string();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    freopen("/dev/null", "w", stderr);
    execl(stp_path.c_str(), "stp", "train", cfg.c_str(), "--set", "train.steps=100000", static_cast<char*>(nullptr));
    _exit(127);
  }
  fs::path metrics = run.dir / "out" / "metrics.jsonl";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {  // wait for the new run's first logged step
    std::string m = stp::testing::slurp(metrics.string());
    if (m.find("earlier run") == std::string::npos && m.find("\"step\":2") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed instead of exiting cleanly";
  EXPECT_EQ(WEXITSTATUS(status), 130);
  std::string m = stp::testing::slurp(metrics.string());
  auto steps = std::count(m.begin(), m.end(), '\n');
  EXPECT_GE(steps, 2);
  EXPECT_TRUE(fs::exists(run.dir / "out" / ("checkpoint-" + std::to_string(steps)) / "model.safetensors"))
      << "no checkpoint of the last finished step " << steps;
}

// train.lr: 1e6 blows up: every non-finite step is skipped with a warning; after
// train.max_skipped_steps in a row the run stops with status 5 and a checkpoint of the last good
// state (all parameters finite) whose state.json says so.
TEST(CmdTrain, DivergingRunStopsWithStatus5AndAFiniteCheckpoint) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("diverged");
  auto r = stp::testing::run_stp("train " + run.config.string() +
                                 " --set train.lr=1e6 --set train.steps=40 --set train.max_skipped_steps=3");
  EXPECT_EQ(r.status, 5) << r.err;
  EXPECT_NE(r.err.find("stp train: error: training diverged: 3 consecutive steps"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("warning: step"), std::string::npos) << r.err;
  std::string metrics = run.earlier_metrics();
  auto lines = std::count(metrics.begin(), metrics.end(), '\n');
  ASSERT_GE(lines, 4) << metrics;
  EXPECT_LT(lines, 40) << "it did not stop";
  EXPECT_NE(metrics.find("\"skipped_steps\":3"), std::string::npos) << metrics;
  fs::path ck = run.dir / "out" / ("checkpoint-" + std::to_string(lines));
  ASSERT_TRUE(fs::exists(ck / "model.safetensors")) << ck;
  std::string state = stp::testing::slurp((ck / "state.json").string());
  EXPECT_NE(state.find("the last good step"), std::string::npos) << state;
  for (const auto& [name, t] : stp::read_model_tensors((ck / "model.safetensors").string()))
    for (float v : t.data) ASSERT_TRUE(std::isfinite(v)) << name;
}

// A learning rate whose AdamW update overflows float32 is refused before anything is written.
TEST(CmdTrain, LearningRateWhoseUpdateOverflowsIsRefused) {
  expect_clean_failure("bad_lr", "--set train.lr=1e38", "train.lr (1e+38) must be at most 1.70141e+37");
}

// Every value of every checkpoint folder under `dir` is finite.
void expect_finite_checkpoints(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("checkpoint-", 0) != 0) continue;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      for (const auto& [name, t] : stp::read_safetensors((e.path() / file).string()))
        for (float v : t.data) ASSERT_TRUE(std::isfinite(v)) << e.path() << " " << file << " " << name;
  }
}

// An update that overflows although train.lr passed validation (tests/train/guard_overflow.h):
// step 2 makes a parameter infinite while its loss stays finite. The checkpoint of step 2 checks
// the state first and finds it: nothing of it is written, the run stops with status 5 and names
// checkpoint-1 as the last good state, and every checkpoint on disk is finite.
TEST(CmdTrain, AStateThatOverflowedStopsTheRunAndNamesTheLastGoodCheckpoint) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("overflow");
  std::string sets = " --set output.checkpoint_every=1 --set model.init_from=" + stp::testing::overflow_init_file();
  for (const std::string& s : stp::testing::overflow_overrides()) sets += " --set " + s;
  auto r = stp::testing::run_stp("train " + run.config.string() + sets);
  EXPECT_EQ(r.status, 5) << r.err;
  const fs::path out = run.dir / "out";
  for (const std::string& needle :
       {std::string("stp train: error: "), std::string("after step 2"), std::string("model.embed_tokens.weight"),
        std::string("not finite"), (out / "checkpoint-1").string() + " (after step 1)"})
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << " in: " << r.err;
  EXPECT_TRUE(fs::exists(out / "checkpoint-1" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2")) << "the state that overflowed was written";
  EXPECT_FALSE(fs::exists(out / "checkpoint-3")) << "the run went on after its state overflowed";
  expect_finite_checkpoints(out);
}

// Validation and health metrics in metrics.jsonl and on the progress line; then `stp plot` and
// `stp generate` on the run.
TEST(CmdTrain, ValidationMetricsPlotAndGenerate) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("val_run");
  auto r = stp::testing::run_stp("train " + run.config.string() +
                                 " --set train.steps=4 --set data.val_path=" + stp::testing::tiny_text_file() +
                                 " --set train.eval_every=2 --set train.eval_batches=1 --set train.peak_flops=1e12");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("| val_loss "), std::string::npos) << r.err;
  std::string metrics = run.earlier_metrics();
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 4);
  auto count = [&](const std::string& key) {
    std::size_t n = 0;
    for (std::size_t at = metrics.find(key); at != std::string::npos; at = metrics.find(key, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"val_loss\":"), 2u) << metrics;  // steps 2 and 4
  for (const char* key : {"\"grad_norm\":", "\"clip_coef\":", "\"skipped_steps\":0", "\"tokens_seen\":", "\"mfu\":"})
    EXPECT_EQ(count(key), 4u) << key << " in " << metrics;
  EXPECT_NE(metrics.find("\"tokens_seen\":512"), std::string::npos) << "4 steps x 4 x 2 x 16 tokens";

  fs::path svg = run.dir / "plot.svg";
  auto p = stp::testing::run_stp("plot " + (run.dir / "out").string() + " --svg " + svg.string());
  ASSERT_EQ(p.status, 0) << p.err;
  std::string doc = stp::testing::slurp(svg.string());
  EXPECT_NE(doc.find("class=\"series val_loss\""), std::string::npos);
  auto bad = stp::testing::run_stp("plot " + run.dir.string() + " --svg " + svg.string());
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("has no metrics.jsonl"), std::string::npos) << bad.err;

  std::string ck = (run.dir / "out" / "checkpoint-4").string();
  auto g1 = stp::testing::run_stp("generate " + ck + " --prompt 'the ' --tokens 10 --seed 3");
  auto g2 = stp::testing::run_stp("generate " + ck + " --prompt 'the ' --tokens 10 --seed 3");
  ASSERT_EQ(g1.status, 0) << g1.err;
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_EQ(g1.out.size(), 4u + 10u + 1u) << "prompt, 10 bytes, newline";
  EXPECT_EQ(g1.out.rfind("the ", 0), 0u);
  auto tok = stp::testing::run_stp("generate " + ck + " --prompt x --tokenizer /tmp/tokenizer.json");
  EXPECT_EQ(tok.status, 1);
  EXPECT_NE(tok.err.find("--tokenizer"), std::string::npos) << tok.err;
}

// A resume from a checkpoint at or past train.steps trains nothing: an error naming both steps and
// what to set, before anything is written (the checkpoint is not rewritten, metrics.jsonl not
// appended to).
TEST(CmdTrain, ResumeWithNothingLeftToTrainIsAnErrorThatWritesNothing) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("resume_done");
  auto r = stp::testing::run_stp("train " + run.config.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path ck = run.dir / "out" / "checkpoint-3";
  auto inode = [](const fs::path& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
  };
  const auto model_inode = inode(ck / "model.safetensors");
  ASSERT_NE(model_inode, 0u);
  const std::string metrics = run.earlier_metrics();
  for (int steps : {3, 2}) {
    auto again = stp::testing::run_stp("train " + run.config.string() + " --set train.resume=" + ck.string() +
                                       " --set train.steps=" + std::to_string(steps));
    EXPECT_EQ(again.status, 1) << again.err;
    for (const std::string& needle : std::vector<std::string>{
             "stp train: error: train.resume '" + ck.string() + "' holds the state after step 3",
             "train.steps is " + std::to_string(steps), "nothing is left to train", "set train.steps above 3"})
      EXPECT_NE(again.err.find(needle), std::string::npos) << needle << " missing in: " << again.err;
    EXPECT_EQ(std::count(again.err.begin(), again.err.end(), '\n'), 1) << again.err;
    EXPECT_EQ(inode(ck / "model.safetensors"), model_inode) << "the checkpoint was rewritten";
    EXPECT_EQ(run.earlier_metrics(), metrics) << "metrics.jsonl changed";
  }
}

// The "done" line of a run with skipped steps (a NaN planted in a gradient, train/fault_hook.h):
// the losses of the first and last steps that trained and the count of skipped ones, or "every
// step was skipped"; never a placeholder (-1) or nan.
TEST(CmdTrain, DoneLineReportsSkippedStepsInWords) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  auto done_line = [](const std::string& err) {
    auto at = err.find("stp train: done");
    return at == std::string::npos ? std::string() : err.substr(at, err.find('\n', at) - at);
  };
  auto run_with_nan_at = [](RunDir& run, int steps, int nan_step) {
    ::setenv("STP_FAULT_RANK", "0", 1);
    ::setenv("STP_FAULT_STEP", std::to_string(nan_step).c_str(), 1);
    ::setenv("STP_FAULT_KIND", "nan_grad", 1);
    auto r = stp::testing::run_stp("train " + run.config.string() + " --set train.steps=" + std::to_string(steps));
    ::unsetenv("STP_FAULT_RANK");
    ::unsetenv("STP_FAULT_STEP");
    ::unsetenv("STP_FAULT_KIND");
    return r;
  };
  RunDir all("all_skipped");
  auto r = run_with_nan_at(all, 1, 1);
  EXPECT_EQ(r.status, 0) << r.err;
  std::string line = done_line(r.err);
  EXPECT_NE(line.find("stp train: done, 1 step; every step was skipped (loss or gradient not finite)"),
            std::string::npos)
      << r.err;
  for (const char* bad : {"-1.0", "nan", "->"}) EXPECT_EQ(line.find(bad), std::string::npos) << bad << ": " << line;

  RunDir last("last_skipped");
  r = run_with_nan_at(last, 3, 3);
  EXPECT_EQ(r.status, 0) << r.err;
  line = done_line(r.err);
  std::vector<double> losses;
  std::istringstream metrics(last.earlier_metrics());
  for (std::string l; std::getline(metrics, l);) losses.push_back(std::stod(l.substr(l.find("\"loss\":") + 7)));
  ASSERT_EQ(losses.size(), 3u);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(line, m,
                                std::regex("stp train: done, 3 steps; loss ([0-9.]+) -> ([0-9.]+) \\(step 2\\); 1 step "
                                           "skipped; checkpoint ")))
      << r.err;
  EXPECT_NEAR(std::stod(m[1]), losses[0], 1e-4) << "the first step's loss";
  EXPECT_NEAR(std::stod(m[2]), losses[1], 1e-4) << "the loss of step 2, the last that trained";
  EXPECT_EQ(line.find("nan"), std::string::npos) << line;
}

}  // namespace

// llm.c's layout as it is: train and val shards side by side, read by data.path and data.val_path
// globs. The shards are one token stream: the losses are bitwise those of the same tokens in one
// file (sequences span the shard boundaries).
TEST(CmdTrain, LlmcShardGlobsTrainLikeOneFile) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  RunDir run("llmc_shards");
  auto llmc = [](std::uint64_t from, std::uint64_t n) {
    std::vector<std::int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<std::int32_t>(n);
    std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
    for (std::uint64_t i = from; i < from + n; ++i) {
      const auto t = static_cast<std::uint16_t>((i * 2654435761u >> 7) % 256);
      bytes.append(reinterpret_cast<const char*>(&t), 2);
    }
    return bytes;
  };
  const fs::path data = run.dir / "data";
  fs::create_directories(data);
  std::ofstream(data / "tiny_train_000001.bin", std::ios::binary) << llmc(0, 700);
  std::ofstream(data / "tiny_train_000002.bin", std::ios::binary) << llmc(700, 45);
  std::ofstream(data / "tiny_train_000003.bin", std::ios::binary) << llmc(745, 600);
  std::ofstream(data / "tiny_val_000000.bin", std::ios::binary) << llmc(5000, 400);
  std::ofstream(data / "all.llmc", std::ios::binary) << llmc(0, 1345);
  auto losses = [&](const std::string& path, const std::string& out) {
    auto r = stp::testing::run_stp(
        "train " + run.config.string() + " --set data.format=llmc --set 'data.path=" + path +
        "' --set 'data.val_path=" + (data / "tiny_val_*.bin").string() +
        "' --set train.eval_every=3 --set train.eval_batches=1 --set output.dir=" + (run.dir / out).string());
    EXPECT_EQ(r.status, 0) << r.err;
    const std::string metrics = stp::testing::slurp((run.dir / out / "metrics.jsonl").string());
    std::string found;
    const std::regex loss("\"(val_)?loss\":[^,]*");
    for (auto it = std::sregex_iterator(metrics.begin(), metrics.end(), loss); it != std::sregex_iterator(); ++it)
      found += it->str() + " ";
    return found;
  };
  const std::string sharded = losses((data / "tiny_train_*.bin").string(), "sharded");
  EXPECT_NE(sharded.find("val_loss"), std::string::npos) << sharded;
  EXPECT_EQ(sharded, losses((data / "all.llmc").string(), "one_file"));
}
