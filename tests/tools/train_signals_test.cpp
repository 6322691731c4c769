// `stp train` stopped politely (docs/design.md, Signals and exit statuses): SIGTERM, SIGHUP and
// SIGINT finish the step in progress, write a checkpoint (output.checkpoint_every: 0 here) and exit
// with 128 + the signal's number; a second signal exits at once.
//   * one process driving 4 ranks (tp 2, pp 2): a signal at a random step, then a resume, gives
//     bitwise the losses, parameters and moments of the run that was never interrupted;
//   * the same under mpirun with 4 processes, the signal sent to one process (any: the processes
//     agree on it after every step) or to all (as Slurm does);
//   * a second signal while the checkpoint is being written ends the process at once and leaves
//     the earlier checkpoint as it was, with no checkpoint folder half written.
// The random step is printed with its seed; STP_TEST_SEED=N repeats a run.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "formats/checkpoint.h"
#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

const std::string kMpiexec = STP_MPIEXEC;

std::string config_yaml(const fs::path& out, int n_embd) {
  std::ostringstream f;
  f << "model: {arch: gpt2, n_layer: 4, n_head: 4, n_embd: " << n_embd << ", vocab_size: 256, seq_len: 16}\n"
    << "data: {path: " << stp::testing::tiny_text_file()
    << ", format: text}\n"
    // A constant learning rate: the interrupted run (train.steps = 100000) and the runs to S + 3
    // train with the same rate at every step.
    << "train: {steps: 100000, micro_batch_size: 2, microbatches: 4, lr_schedule: constant, warmup_steps: 2}\n"
    << "parallel: {backend: cpu, tp: 2, pp: 2, schedule: stp, cpu_threads: 1}\n"
    << "output: {dir: " << out.string() << "}\n";
  return f.str();
}

// A fresh folder (one per test: ctest runs them in parallel) with config.yaml; output.dir is out/.
struct Job {
  fs::path dir, config, out;
  explicit Job(const std::string& name, int n_embd = 32) {
    dir = fs::path(STP_BINARY_DIR) / "tests" / ("signals_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    config = dir / "config.yaml";
    out = dir / "out";
    std::ofstream(config) << config_yaml(out, n_embd);
  }
  fs::path checkpoint(std::int64_t step) const { return stp::checkpoint_path(out.string(), step); }
};

// The per-step losses of output.dir/metrics.jsonl, by step (a resumed run appends its steps).
std::map<std::int64_t, double> losses(const Job& job) {
  std::map<std::int64_t, double> out;
  std::ifstream f(job.out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;  // a line being written
    out[j.at("step").get<std::int64_t>()] = j.at("loss").get<double>();
  }
  return out;
}

std::int64_t last_logged_step(const Job& job) {
  auto l = losses(job);
  return l.empty() ? 0 : l.rbegin()->first;
}

// The seed of this test's random choices: STP_TEST_SEED, or a fresh one (printed).
std::mt19937 seeded_rng(const char* what) {
  unsigned seed = std::random_device{}();
  if (const char* s = std::getenv("STP_TEST_SEED")) seed = static_cast<unsigned>(std::strtoul(s, nullptr, 10));
  std::printf("%s: seed %u (STP_TEST_SEED=%u repeats it)\n", what, seed, seed);
  return std::mt19937(seed);
}

// The pids of the processes below `root` whose argv[0] is `program` (mpirun starts the ranks as its
// children; stp re-executes itself once, keeping its pid and argv).
std::vector<pid_t> descendants_running(pid_t root, const std::string& program) {
  std::map<pid_t, std::pair<pid_t, std::string>> procs;  // pid -> (parent, argv[0])
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string n = e.path().filename();
    if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = stp::testing::slurp((e.path() / "stat").string());
    auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 > stat.size()) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t parent = 0;
    rest >> state >> parent;
    std::string cmdline = stp::testing::slurp((e.path() / "cmdline").string());
    procs[static_cast<pid_t>(std::stol(n))] = {parent, cmdline.substr(0, cmdline.find('\0'))};
  }
  std::vector<pid_t> out;
  for (const auto& [pid, info] : procs) {
    if (info.second != program) continue;
    for (pid_t up = info.first; up > 1 && procs.count(up); up = procs[up].first)
      if (up == root) {
        out.push_back(pid);
        break;
      }
  }
  return out;
}

const std::string kStp = std::string(STP_BINARY_DIR) + "/stp";

bool running(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

// A process started with fork/exec (stdout and stdin /dev/null, stderr into a file), so a test can
// signal it while it runs. One that still runs when the test ends (a failed assertion) is killed,
// with the stp processes below it (mpirun's ranks).
struct Child {
  pid_t pid = -1;
  fs::path err;
  std::string stderr_text() const { return stp::testing::slurp(err.string()); }
  Child(pid_t p, fs::path e) : pid(p), err(std::move(e)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid <= 0 || !running(pid)) return;
    for (pid_t p : descendants_running(pid, kStp)) ::kill(p, SIGKILL);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

Child spawn(const std::vector<std::string>& args, const fs::path& err, const std::vector<std::string>& env = {}) {
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings(env);
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string err_path = err.string();
  pid_t pid = fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_RDWR);
    int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null < 0 || fd < 0) _exit(126);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return {pid, err};
}

Child spawn_stp(const Job& job, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> args = {kStp, "train", job.config.string()};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  return spawn(args, job.dir / "stderr.txt");
}

// The wait status of the child; after `timeout_s` it is killed and -1 returned.
int wait_exit(pid_t pid, double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

// Waits until metrics.jsonl shows `step` (true) or the process ended or 60 s passed (false).
bool wait_for_step(const Job& job, pid_t pid, std::int64_t step) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && running(pid)) {
    if (last_logged_step(job) >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

std::string describe(int status) {
  if (status == -1) return "timed out (killed)";
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string sig_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGINT"; }

// Two checkpoints hold the same step, parameters and moments, bit for bit.
void expect_identical_checkpoints(const fs::path& a, const fs::path& b) {
  stp::Checkpoint x = stp::read_checkpoint(a.string()), y = stp::read_checkpoint(b.string());
  EXPECT_EQ(x.state.step, y.state.step);
  EXPECT_EQ(x.optimizer_step, y.optimizer_step);
  for (auto [mx, my, what] :
       {std::tuple{&x.model, &y.model, "parameter"}, std::tuple{&x.exp_avg, &y.exp_avg, "exp_avg"},
        std::tuple{&x.exp_avg_sq, &y.exp_avg_sq, "exp_avg_sq"}}) {
    ASSERT_EQ(mx->size(), my->size()) << what;
    for (const auto& [name, t] : *mx) {
      const stp::HostTensor& u = my->at(name);
      ASSERT_EQ(t.data.size(), u.data.size()) << name;
      EXPECT_EQ(std::memcmp(t.data.data(), u.data.data(), t.data.size() * sizeof(float)), 0)
          << what << " " << name << " differs between " << a << " and " << b;
    }
  }
}

// The interrupted job (stopped after step `stopped`, resumed to stopped + 3 into the same
// output.dir) against `straight`, which ran to stopped + 3 without a stop: the same loss at every
// step, and the same final checkpoint, bitwise.
void expect_same_as_uninterrupted(const Job& interrupted, const Job& straight, std::int64_t stopped) {
  auto a = losses(interrupted), b = losses(straight);
  ASSERT_EQ(b.size(), static_cast<std::size_t>(stopped + 3));
  ASSERT_EQ(a.size(), b.size()) << "steps 1.." << stopped << " before the stop, the rest after the resume";
  for (const auto& [step, loss] : b)
    EXPECT_EQ(a.at(step), loss) << "step " << step << " (stopped after " << stopped << ")";
  expect_identical_checkpoints(interrupted.checkpoint(stopped + 3), straight.checkpoint(stopped + 3));
}

// One process, 4 ranks: `sig` after a random step of 1..6, then a resume to S + 3.
void signal_and_resume(int sig, const std::string& name) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  auto rng = seeded_rng(name.c_str());
  const std::int64_t after = std::uniform_int_distribution<int>(1, 6)(rng);
  Job job(name);
  Child c = spawn_stp(job);
  ASSERT_TRUE(wait_for_step(job, c.pid, after)) << c.stderr_text();
  ::kill(c.pid, sig);
  const int status = wait_exit(c.pid, 60);
  const std::string err = c.stderr_text();
  ASSERT_TRUE(WIFEXITED(status)) << describe(status) << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << err;
  const std::int64_t stopped = last_logged_step(job);
  std::printf("%s after step %lld: stopped after step %lld\n", sig_name(sig).c_str(), static_cast<long long>(after),
              static_cast<long long>(stopped));
  EXPECT_GE(stopped, after);
  EXPECT_NE(err.find(sig_name(sig) + ": stopped after step " + std::to_string(stopped) + "; checkpoint " +
                     job.checkpoint(stopped).string()),
            std::string::npos)
      << err;
  ASSERT_EQ(stp::find_latest_checkpoint(job.out.string()), job.checkpoint(stopped).string()) << err;

  const std::string until = "train.steps=" + std::to_string(stopped + 3);
  auto resumed = stp::testing::run_stp("train " + job.config.string() +
                                       " --set train.resume=" + job.checkpoint(stopped).string() + " --set " + until);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  Job straight(name + "_straight");
  auto r = stp::testing::run_stp("train " + straight.config.string() + " --set " + until);
  ASSERT_EQ(r.status, 0) << r.err;
  expect_same_as_uninterrupted(job, straight, stopped);
}

TEST(TrainSignals, SigtermAtARandomStepResumesBitwise) { signal_and_resume(SIGTERM, "sigterm"); }
TEST(TrainSignals, SighupAtARandomStepResumesBitwise) { signal_and_resume(SIGHUP, "sighup"); }

// A second SIGTERM while the checkpoint of the first is being written: the process is frozen
// (SIGSTOP) as soon as the checkpoint's temporary folder appears, signalled, and let go. It exits
// at once with 143; the earlier checkpoint (the one it resumed from) is byte for byte what it was
// and still the latest complete one, and no checkpoint of the interrupted write carries a
// checkpoint name. The write is what the test must catch: a model of 0.83 M parameters (9.5 MiB of
// checkpoint files, each synced) keeps it open for milliseconds, and a run where the write still
// wins the race is tried again (up to 3 times).
TEST(TrainSignals, SecondSignalDuringTheCheckpointWriteExitsAtOnce) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  Job job("second_signal", 128);
  auto first = stp::testing::run_stp("train " + job.config.string() + " --set train.steps=2");
  ASSERT_EQ(first.status, 0) << first.err;
  const fs::path earlier = job.checkpoint(2);
  std::map<std::string, std::string> before;
  for (const auto& e : fs::directory_iterator(earlier)) before[e.path().filename()] = stp::testing::slurp(e.path());
  const std::string metrics = stp::testing::slurp((job.out / "metrics.jsonl").string());

  bool caught = false;
  for (int attempt = 1; attempt <= 3 && !caught; ++attempt) {
    // Steps 1 and 2 only: the wait below is for this attempt's step 3.
    std::ofstream(job.out / "metrics.jsonl") << metrics;
    Child c = spawn_stp(job, {"train.resume=" + earlier.string()});
    ASSERT_TRUE(wait_for_step(job, c.pid, 3)) << c.stderr_text();
    ::kill(c.pid, SIGTERM);
    fs::path tmp;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (tmp.empty() && running(c.pid) && Clock::now() < deadline) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(job.out, ec)) {
        const std::string n = e.path().filename();
        if (n.rfind(".checkpoint-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) tmp = e.path();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_FALSE(tmp.empty()) << "no checkpoint write seen; " << c.stderr_text();
    ::kill(c.pid, SIGSTOP);
    int stopped = 0;
    ASSERT_EQ(::waitpid(c.pid, &stopped, WUNTRACED), c.pid);  // stopped for sure before looking
    ASSERT_TRUE(WIFSTOPPED(stopped)) << describe(stopped) << "\n" << c.stderr_text();
    const std::string step = tmp.filename().string().substr(12, tmp.filename().string().size() - 16);
    const fs::path named = job.out / ("checkpoint-" + step);
    if (fs::exists(named)) {  // the write finished before the process stopped: try again
      ::kill(c.pid, SIGCONT);
      const int status = wait_exit(c.pid, 60);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << describe(status);
      std::printf("attempt %d: the write of %s finished first\n", attempt, named.c_str());
      fs::remove_all(named);
      continue;
    }
    caught = true;
    ::kill(c.pid, SIGTERM);
    const auto sent = Clock::now();
    ::kill(c.pid, SIGCONT);
    const int status = wait_exit(c.pid, 60);
    const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
    const std::string err = c.stderr_text();
    std::printf("second SIGTERM during the write of %s: exited after %.3f s, %s\n", named.c_str(), seconds,
                describe(status).c_str());
    ASSERT_TRUE(WIFEXITED(status)) << describe(status) << "\n" << err;
    EXPECT_EQ(WEXITSTATUS(status), 143) << err;
    EXPECT_LT(seconds, 2.0) << "not at once";
    EXPECT_NE(err.find("stp train: SIGTERM again: exiting at once"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(named)) << "a checkpoint name on an interrupted write";
  }
  ASSERT_TRUE(caught) << "the checkpoint write always finished before the test could stop the process";
  EXPECT_EQ(stp::find_latest_checkpoint(job.out.string()), earlier.string());
  for (const auto& [file, bytes] : before)
    EXPECT_TRUE(stp::testing::slurp((earlier / file).string()) == bytes) << file << " of " << earlier << " changed";
  EXPECT_NO_THROW(stp::read_checkpoint(earlier.string()));
}

// --- mpirun: 4 processes, one rank each -------------------------------------------------------

bool have_mpi() { return !kMpiexec.empty() && stp::testing::have_stp(); }

Child spawn_mpirun(const Job& job, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> args = {kMpiexec};
  std::istringstream flags(STP_MPIEXEC_FLAGS);
  for (std::string f; flags >> f;) args.push_back(f);
  args.insert(args.end(), {"-np", "4", kStp, "train", job.config.string()});
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  // A session folder of its own (tests/tools/mpirun_test.cpp says why).
  fs::create_directories(job.dir / "ompi");
  return spawn(args, job.dir / "stderr.txt",
               {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                "OMPI_MCA_orte_tmpdir_base=" + (job.dir / "ompi").string()});
}

// Runs an mpirun job to its end (at most 120 s); its wait status.
int run_mpirun(const Job& job, const std::vector<std::string>& sets) {
  Child c = spawn_mpirun(job, sets);
  int status = wait_exit(c.pid, 120);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe(status) << "\n" << c.stderr_text();
  return status;
}

// SIGTERM after a random step to one process (a random one) or to all four; every process stops
// after the same step, the job exits 143 within seconds, and the resumed job is bitwise the job
// that was never stopped.
void mpirun_signal(bool all, const std::string& name) {
  if (!have_mpi()) GTEST_SKIP() << "built without MPI";
  auto rng = seeded_rng(name.c_str());
  const std::int64_t after = std::uniform_int_distribution<int>(1, 6)(rng);
  Job job(name);
  Child c = spawn_mpirun(job);
  ASSERT_TRUE(wait_for_step(job, c.pid, after)) << c.stderr_text();
  std::vector<pid_t> ranks = descendants_running(c.pid, kStp);
  ASSERT_EQ(ranks.size(), 4u) << c.stderr_text();
  if (all) {
    for (pid_t p : ranks) ::kill(p, SIGTERM);
  } else {
    pid_t target = ranks[std::uniform_int_distribution<std::size_t>(0, 3)(rng)];
    std::printf("SIGTERM to process pid %d only\n", static_cast<int>(target));
    ::kill(target, SIGTERM);
  }
  const auto sent = Clock::now();
  const int status = wait_exit(c.pid, 60);
  const double seconds = std::chrono::duration<double>(Clock::now() - sent).count();
  const std::string err = c.stderr_text();
  const std::int64_t stopped = last_logged_step(job);
  std::printf("SIGTERM after step %lld: the job stopped after step %lld, %.2f s after the signal, %s\n",
              static_cast<long long>(after), static_cast<long long>(stopped), seconds, describe(status).c_str());
  ASSERT_TRUE(WIFEXITED(status)) << describe(status) << "\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 143) << err;
  EXPECT_LT(seconds, 30.0);
  EXPECT_GE(stopped, after);
  EXPECT_NE(err.find("SIGTERM: stopped after step " + std::to_string(stopped)), std::string::npos) << err;
  ASSERT_EQ(stp::find_latest_checkpoint(job.out.string()), job.checkpoint(stopped).string()) << err;

  const std::string until = "train.steps=" + std::to_string(stopped + 3);
  run_mpirun(job, {"train.resume=" + job.checkpoint(stopped).string(), until});
  Job straight(name + "_straight");
  run_mpirun(straight, {until});
  expect_same_as_uninterrupted(job, straight, stopped);
}

TEST(TrainSignals, MpirunSigtermToOneProcessStopsEveryProcess) { mpirun_signal(false, "mpirun_one"); }
TEST(TrainSignals, MpirunSigtermToEveryProcess) { mpirun_signal(true, "mpirun_all"); }

}  // namespace
