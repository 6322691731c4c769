// `mpirun -np 4 stp train` end to end (CPU backend, MPI communicators, one rank per process),
// against the single-process run of the same global batch (the Trainer in this test process):
//   * (dp, pp, tp) in {(4,1,1), (2,2,1), (1,2,2), (2,1,2)}: per-step losses (metrics.jsonl of
//     process 0) to 1e-5 relative, and the final checkpoint — gathered from every process and
//     written once — to 1e-5 normwise;
//   * mpirun -np 1 with dp = 2 is the single-process job (ranks as threads);
//   * a rank forced to fail mid-step (STP_FAULT_RANK) ends the job within 10 s, non-zero, with its
//     message;
//   * dp × pp × tp ≠ processes: every process reports the layout error, the job exits non-zero;
//   * a dp = 2 checkpoint (written under mpirun) resumes at dp = 1 in one process: the next
//     step's loss is identical and the parameters agree to 1e-5;
//   * a state that overflowed (tests/train/guard_overflow.h) is written by no process: every
//     process stops after the same step with status 5, and process 0 names the last good checkpoint.
// Skipped when the build has no MPI (tests/CMakeLists.txt passes the launcher and its flags).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <ostream>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "tests/support/run_command.h"
#include "tests/train/guard_overflow.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace {

const std::string kMpiexec = STP_MPIEXEC;

struct Launch {
  stp::testing::CommandResult result;
  double seconds = 0;
};

// `env` (VAR=value ...) prefixes the launcher; `np` = 0 runs stp without a launcher.
Launch run(int np, const std::string& args, const std::string& env = "") {
  std::string tmpl = (fs::temp_directory_path() / "stp_mpirun_XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data()) ? tmpl : std::string("/tmp");
  std::string launcher = np > 0 ? kMpiexec + " " + STP_MPIEXEC_FLAGS + " -np " + std::to_string(np) + " " : "";
  // Open MPI 4 keeps its session directory under ompi.<host>.<uid> in the temporary folder, and two
  // launchers creating it at once can both fail with "File exists" (ctest runs these tests in
  // parallel): each launch gets a session base of its own, removed with `dir`.
  std::string cmd = "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_tmpdir_base=" + dir +
                    " " + env + " timeout 120 " + launcher + STP_BINARY_DIR + "/stp " + args + " >" + dir + "/out 2>" +
                    dir + "/err </dev/null";
  auto start = std::chrono::steady_clock::now();
  int rc = std::system(cmd.c_str());
  Launch l;
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  l.result = {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, stp::testing::slurp(dir + "/out"),
              stp::testing::slurp(dir + "/err")};
  fs::remove_all(dir);
  return l;
}

bool have_mpi() { return !kMpiexec.empty() && stp::testing::have_stp(); }

// The tiny model of the trainer tests, one replica of 8 microbatches, writing to out_dir.
std::string config_yaml(const std::string& out_dir) {
  std::ostringstream f;
  f << "model: {arch: gpt2, n_layer: 8, n_head: 4, n_embd: 32, vocab_size: 256, seq_len: 16}\n"
    << "data: {path: " << stp::testing::tiny_text_file() << ", format: text, sampling: sequential}\n"
    << "train: {steps: 3, micro_batch_size: 2, microbatches: 8, lr: 1.0e-3, lr_schedule: constant, warmup_steps: 0,"
    << " grad_clip: 1.0, seed: 7}\n"
    << "parallel: {backend: cpu, dp: 1, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}\n"
    << "memory: {offload: none, recompute: none}\n"
    << "output: {dir: " << out_dir << "}\n";
  return f.str();
}

// A fresh run folder (one per test: ctest runs tests in parallel) with config.yaml; returns its path.
std::string prepare(const std::string& name) {
  fs::path dir = fs::path(STP_BINARY_DIR) / "tests" / ("mpirun_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.yaml") << config_yaml((dir / "out").string());
  return (dir / "config.yaml").string();
}

std::vector<double> losses_of(const std::string& config) {
  std::vector<double> out;
  std::ifstream f(fs::path(config).parent_path() / "out" / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, stp::HostTensor> params;
};

// The single-process run of the global batch: one replica, 8 microbatches.
const Reference& reference() {
  static const Reference r = [] {
    stp::Config cfg = stp::load_config_from_string(config_yaml("unused"), "reference config");
    stp::Trainer t(cfg);
    Reference out;
    for (int i = 0; i < 3; ++i) out.losses.push_back(t.step().loss);
    out.params = t.full_parameters();
    return out;
  }();
  return r;
}

struct Layout {
  int dp, pp, tp;
  const char* schedule;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << "dp " << l.dp << " pp " << l.pp << " tp " << l.tp << " " << l.schedule;
}

std::string sets(const Layout& l) {
  return "--set parallel.dp=" + std::to_string(l.dp) + " --set parallel.pp=" + std::to_string(l.pp) +
         " --set parallel.tp=" + std::to_string(l.tp) + " --set parallel.schedule=" + l.schedule +
         " --set train.microbatches=" + std::to_string(8 / l.dp);
}

class Mpirun : public ::testing::TestWithParam<Layout> {};

TEST_P(Mpirun, FourProcessesMatchTheSingleProcessRun) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  const Layout l = GetParam();
  const std::string name = "dp" + std::to_string(l.dp) + "pp" + std::to_string(l.pp) + "tp" + std::to_string(l.tp);
  std::string config = prepare(name);
  Launch launch = run(4, "train " + config + " " + sets(l));
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  EXPECT_NE(launch.result.err.find(std::to_string(4) + " ranks in 4 processes"), std::string::npos)
      << launch.result.err;
  std::vector<double> losses = losses_of(config);
  const Reference& ref = reference();
  ASSERT_EQ(losses.size(), ref.losses.size()) << "metrics.jsonl written once, by process 0";
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], ref.losses[i], 1e-5 * ref.losses[i]) << "step " << i + 1;
  auto params =
      stp::read_model_tensors((fs::path(config).parent_path() / "out" / "checkpoint-3" / "model.safetensors").string());
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(params, ref.params, &where), 1e-5) << "worst at " << where;
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& p) {
  return "dp" + std::to_string(p.param.dp) + "_pp" + std::to_string(p.param.pp) + "_tp" + std::to_string(p.param.tp);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Mpirun,
                         ::testing::Values(Layout{4, 1, 1, "gpipe"}, Layout{2, 2, 1, "1f1b"}, Layout{1, 2, 2, "stp"},
                                           Layout{2, 1, 2, "gpipe"}),
                         layout_name);

// The job of the distributed-optimizer tests: dp 2, pp 2, 1f1b, small gradient buckets.
const Layout kDistOpt{2, 2, 1, "1f1b"};
const std::string kDistOptSets = " --set parallel.distributed_optimizer=true --set parallel.dp_bucket=1000";

// The per-step losses of the job at `config` are the single-process reference's within 1e-6.
void expect_reference_losses(const std::string& config) {
  std::vector<double> losses = losses_of(config);
  const Reference& ref = reference();
  ASSERT_EQ(losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], ref.losses[i], 1e-6 * ref.losses[i]) << "step " << i + 1;
}

// The same job in one process (HostComm), three steps, optimizer on the device: its checkpoint.
// `extra`: further overrides both runs share (e.g. the precision).
stp::Checkpoint in_process_checkpoint(const std::string& config, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"parallel.dp=2",
                                "parallel.pp=2",
                                "parallel.schedule=1f1b",
                                "train.microbatches=4",
                                "parallel.distributed_optimizer=true",
                                "parallel.dp_bucket=1000",
                                "memory.optimizer_offload=none"};
  o.insert(o.end(), extra.begin(), extra.end());
  stp::Config cfg = stp::load_config_from_string(config_yaml((fs::path(config).parent_path() / "inproc").string()),
                                                 "in-process config", o);
  stp::Trainer t(cfg);
  for (int i = 0; i < 3; ++i) t.step();
  return stp::read_checkpoint(t.save_checkpoint());
}

// The moments of two checkpoints agree within 1e-5.
void expect_same_moments(const stp::Checkpoint& theirs, const stp::Checkpoint& mine) {
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(theirs.exp_avg, mine.exp_avg, &where), 1e-5) << "exp_avg, worst at " << where;
  EXPECT_LT(stp::testing::max_rel_diff(theirs.exp_avg_sq, mine.exp_avg_sq, &where), 1e-5)
      << "exp_avg_sq, worst at " << where;
}

// The distributed optimizer across processes (MpiComm's reduce-scatter and all-gather, the
// checkpoint's all-gather of the moments): the single-process losses within 1e-6, and the
// checkpoint's optimizer state that of the same run in one process.
TEST(Mpirun, DistributedOptimizerMatchesTheSingleProcessRun) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("distopt");
  Launch launch = run(4, "train " + config + " " + sets(kDistOpt) + kDistOptSets);
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  expect_reference_losses(config);
  const fs::path ckpt = fs::path(config).parent_path() / "out" / "checkpoint-3";
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(stp::read_model_tensors((ckpt / "model.safetensors").string()),
                                       reference().params, &where),
            1e-5)
      << "worst at " << where;
  expect_same_moments(stp::read_checkpoint(ckpt.string()), in_process_checkpoint(config));
}

// Optimizer offload across processes, with the distributed optimizer (each process updates its
// owned shard on the CPU, from pinned host memory): the single-process losses within 1e-6, and
// the checkpoint's parameters and moments those of the same job in one process with the
// optimizer on the device.
TEST(Mpirun, OffloadedDistributedOptimizerMatchesTheDeviceOptimizer) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("optoffload");
  Launch launch =
      run(4, "train " + config + " " + sets(kDistOpt) + kDistOptSets + " --set memory.optimizer_offload=all");
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  expect_reference_losses(config);
  const stp::Checkpoint theirs =
      stp::read_checkpoint((fs::path(config).parent_path() / "out" / "checkpoint-3").string());
  const stp::Checkpoint mine = in_process_checkpoint(config);
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(theirs.model, mine.model, &where), 1e-5) << "parameters, worst at " << where;
  expect_same_moments(theirs, mine);
}

// bf16 with the distributed optimizer across processes: each process keeps the f32 masters of its
// owned parts only and the bf16 copies travel through MpiComm's bf16 all-gather. The checkpoint's
// parameters (the masters, gathered) and moments are those of the same job in one process.
TEST(Mpirun, Bf16ShardedMastersMatchTheSingleProcessRun) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("distopt_bf16");
  Launch launch = run(4, "train " + config + " " + sets(kDistOpt) + kDistOptSets + " --set train.precision=bf16");
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  const stp::Checkpoint theirs =
      stp::read_checkpoint((fs::path(config).parent_path() / "out" / "checkpoint-3").string());
  const stp::Checkpoint mine = in_process_checkpoint(config, {"train.precision=bf16"});
  std::string where;
  EXPECT_LT(stp::testing::max_rel_diff(theirs.model, mine.model, &where), 1e-5) << "parameters, worst at " << where;
  expect_same_moments(theirs, mine);
}

TEST(Mpirun, OneProcessDrivesEveryRankAsThreads) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("np1");
  Launch launch = run(1, "train " + config + " " + sets({2, 1, 1, "gpipe"}));
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  EXPECT_NE(launch.result.err.find("2 ranks in 1 process\n"), std::string::npos) << launch.result.err;
  std::vector<double> losses = losses_of(config);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_NEAR(losses[2], reference().losses[2], 1e-5 * reference().losses[2]);
}

TEST(Mpirun, FailingRankEndsTheJobWithItsMessage) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("fault");
  Launch launch = run(4, "train " + config + " " + sets({2, 2, 1, "1f1b"}), "STP_FAULT_RANK=2 STP_FAULT_STEP=2");
  std::printf("failing rank: job ended after %.2f s with status %d\n", launch.seconds, launch.result.status);
  EXPECT_NE(launch.result.status, 0);
  EXPECT_NE(launch.result.status, 124) << "timed out: the job hung";
  EXPECT_LT(launch.seconds, 10.0);
  EXPECT_NE(launch.result.err.find("injected failure of rank 2 in step 2"), std::string::npos) << launch.result.err;
}

TEST(Mpirun, LayoutNotMatchingTheProcessesIsAnErrorOnEveryProcess) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("bad_layout");
  Launch launch = run(4, "train " + config + " --set parallel.dp=2");
  EXPECT_NE(launch.result.status, 0);
  for (int p = 0; p < 4; ++p)
    EXPECT_NE(
        launch.result.err.find("[process " + std::to_string(p) +
                               "/4]: error: parallel.dp x parallel.pp x parallel.tp = 2 x 1 x 1 = 2 ranks, but the "
                               "MPI launcher started 4 processes"),
        std::string::npos)
        << launch.result.err;
  EXPECT_FALSE(fs::exists(fs::path(config).parent_path() / "out")) << "output.dir was touched";
}

TEST(Mpirun, Dp2CheckpointResumesAtDp1WithTheIdenticalNextLoss) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("resume");
  Launch launch = run(4, "train " + config + " " + sets({2, 2, 1, "1f1b"}) + " --set output.checkpoint_every=2");
  ASSERT_EQ(launch.result.status, 0) << launch.result.err;
  std::vector<double> dp2 = losses_of(config);
  ASSERT_EQ(dp2.size(), 3u);
  fs::path out = fs::path(config).parent_path() / "out";
  ASSERT_TRUE(fs::exists(out / "checkpoint-2" / "model.safetensors"));
  auto dp2_final = stp::read_model_tensors((out / "checkpoint-3" / "model.safetensors").string());

  std::string resumed = prepare("resumed");
  Launch again = run(0, "train " + resumed + " --set train.resume=" + (out / "checkpoint-2").string());
  ASSERT_EQ(again.result.status, 0) << again.result.err;
  std::vector<double> dp1 = losses_of(resumed);
  ASSERT_EQ(dp1.size(), 1u) << "only step 3 remains";
  EXPECT_EQ(dp1[0], dp2[2]) << "same parameters and optimizer state, same global batch: the same forward";
  auto dp1_final = stp::read_model_tensors(
      (fs::path(resumed).parent_path() / "out" / "checkpoint-3" / "model.safetensors").string());
  EXPECT_LT(stp::testing::max_rel_diff(dp1_final, dp2_final), 1e-5);
}

TEST(Mpirun, AStateThatOverflowedStopsEveryProcessWithStatus5) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  std::string config = prepare("overflow");
  std::string args = "train " + config + " " + sets({1, 2, 2, "stp"}) +
                     " --set output.checkpoint_every=1 --set model.init_from=" + stp::testing::overflow_init_file();
  for (const std::string& s : stp::testing::overflow_overrides()) args += " --set " + s;
  Launch launch = run(4, args);
  EXPECT_EQ(launch.result.status, 5) << launch.result.err;
  const fs::path out = fs::path(config).parent_path() / "out";
  const std::string good = "The last good state is checkpoint " + (out / "checkpoint-1").string() + " (after step 1)";
  EXPECT_NE(launch.result.err.find(good), std::string::npos) << launch.result.err;
  EXPECT_EQ(launch.result.err.find("model.embed_tokens.weight"), launch.result.err.rfind("model.embed_tokens.weight"))
      << "one message, from process 0: " << launch.result.err;
  EXPECT_TRUE(fs::exists(out / "checkpoint-1" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-3"));
}

}  // namespace
