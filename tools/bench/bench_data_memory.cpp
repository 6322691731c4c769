// Benchmark: resident memory of a training run against the size of its token data (data/data.h,
// Reading). Writes two sets of llm.c token shards into a scratch folder (--dir, on a disk with room
// for both; never committed, removed afterwards unless --keep): --small-mb and --big-mb MB of
// uint16 tokens below 256 in shards of --shard-mb MB; then runs `stp train CONFIG` for --steps
// steps on each (data.path a glob of its shards, data.format llmc; the config's model must take
// vocab 256, as configs/tiny.yaml does), alternating small and big --pairs times, and reads each
// run's peak resident set from wait4(2) (ru_maxrss: the child's high-water mark, file pages it
// mapped included). Prints the peaks, the median difference big - small and the target: within
// 64 MiB. The run also reads every token once (the vocabulary check), so its wall time says what
// that pass costs at this size.
// Options: --stp PATH (default: the stp beside this executable), --config PATH (default
// configs/tiny.yaml), --dir PATH (default: a new folder in the system's temp folder), --small-mb,
// --big-mb, --shard-mb, --steps, --pairs, --keep.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/data.h"
#include "tools/cli/cli.h"

extern char** environ;

namespace fs = std::filesystem;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// One set of llm.c shards of `mb` MB in total (the last shard shorter), tokens < 256.
std::uint64_t write_shards(const fs::path& folder, double mb, double shard_mb, std::uint64_t seed) {
  fs::create_directories(folder);
  const std::uint64_t total = static_cast<std::uint64_t>(mb * 1e6 / 2);
  const std::uint64_t per_shard = static_cast<std::uint64_t>(shard_mb * 1e6 / 2);
  std::vector<std::uint16_t> buf(std::size_t(1) << 22);
  std::uint64_t z = seed, written = 0;
  for (int k = 0; written < total; ++k) {
    const std::uint64_t n = std::min(per_shard, total - written);
    char name[64];
    std::snprintf(name, sizeof name, "bench_train_%06d.bin", k);
    std::ofstream f(folder / name, std::ios::binary | std::ios::trunc);
    std::int32_t header[256] = {20240520, 1, static_cast<std::int32_t>(n)};
    f.write(reinterpret_cast<const char*>(header), sizeof header);
    for (std::uint64_t done = 0; done < n;) {
      const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), n - done));
      for (std::size_t j = 0; j < m; ++j) buf[j] = static_cast<std::uint16_t>(stp::splitmix64(z++) & 0xFF);
      f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(2 * m));
      done += m;
    }
    STP_CHECK(f.good(), "bench_data_memory: cannot write '", (folder / name).string(), "'");
    written += n;
  }
  return written;
}

struct Run {
  double max_rss_mib = 0;
  double wall_s = 0;
};

// `argv` run as a child, its output into `log`; its peak resident set from wait4.
Run run_child(const std::vector<std::string>& argv, const fs::path& log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  STP_CHECK(rc == 0, "bench_data_memory: cannot start '", argv[0], "'");
  int status = 0;
  rusage ru{};
  STP_CHECK(::wait4(pid, &status, 0, &ru) == pid, "bench_data_memory: wait4 failed");
  Run r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.max_rss_mib = double(ru.ru_maxrss) * 1024.0 / kMiB;  // ru_maxrss is in KiB on Linux
  STP_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench_data_memory: '", argv[0], "' failed (status ", status,
            "); its output is in '", log.string(), "'");
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Peak resident memory of stp train on a small and a big set of token shards.", "bench_data_memory"};
  stp::tools::init_cli(app);
  std::string stp_path = (fs::read_symlink("/proc/self/exe").parent_path() / "stp").string();
  std::string config = "configs/tiny.yaml", dir;
  double small_mb = 40, big_mb = 4000, shard_mb = 256;
  int steps = 5, pairs = 1;
  bool keep = false;
  app.add_option("--stp", stp_path, "the stp executable")->capture_default_str();
  app.add_option("--config", config, "the training config (vocab 256)")->capture_default_str();
  app.add_option("--dir", dir, "scratch folder for the shards and the runs (default: a new temp folder)");
  app.add_option("--small-mb", small_mb, "MB of tokens in the small set")->capture_default_str();
  app.add_option("--big-mb", big_mb, "MB of tokens in the big set")->capture_default_str();
  app.add_option("--shard-mb", shard_mb, "MB per shard")->capture_default_str();
  app.add_option("--steps", steps, "training steps per run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--pairs", pairs, "small/big run pairs")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag("--keep", keep, "keep the scratch folder");
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    const fs::path root =
        dir.empty() ? fs::temp_directory_path() / ("bench_data_memory_" + std::to_string(::getpid())) : fs::path(dir);
    fs::create_directories(root);
    const double need = (small_mb + big_mb) * 1e6 + 512 * kMiB;
    const double free_bytes = double(fs::space(root).available);
    STP_CHECK(free_bytes >= need, "bench_data_memory: '", root.string(), "' has ", free_bytes / 1e9,
              " GB free; the shards need ", need / 1e9, " GB: use --dir on a larger disk or a smaller --big-mb");
    struct Set {
      const char* name;
      double mb;
      std::uint64_t tokens = 0;
      std::vector<double> rss, wall;
    };
    std::vector<Set> sets = {{"small", small_mb, 0, {}, {}}, {"big", big_mb, 0, {}, {}}};
    try {
      for (std::size_t s = 0; s < sets.size(); ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        sets[s].tokens = write_shards(root / sets[s].name, sets[s].mb, shard_mb, 1 + s);
        std::printf("wrote %s: %.1f MB, %llu tokens in %.1f s\n", sets[s].name, sets[s].mb,
                    static_cast<unsigned long long>(sets[s].tokens),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        std::fflush(stdout);
      }
      for (int p = 0; p < pairs; ++p)
        for (Set& set : sets) {
          const fs::path out = root / (std::string("run_") + set.name);
          fs::remove_all(out);
          const Run r =
              run_child({stp_path, "train", config, "--set",
                         "data.path=" + (root / set.name / "bench_train_*.bin").string(), "--set", "data.format=llmc",
                         "--set", "data.val_path=null", "--set", "train.steps=" + std::to_string(steps), "--set",
                         "output.dir=" + out.string(), "--set", "output.checkpoint_every=0"},
                        root / (std::string("log_") + set.name + ".txt"));
          set.rss.push_back(r.max_rss_mib);
          set.wall.push_back(r.wall_s);
          std::printf("run %d %-5s: max RSS %8.1f MiB, %.1f s\n", p + 1, set.name, r.max_rss_mib, r.wall_s);
          std::fflush(stdout);
        }
    } catch (...) {
      if (!keep) fs::remove_all(root);
      throw;
    }
    if (!keep) fs::remove_all(root);
    const double small = median(sets[0].rss), big = median(sets[1].rss), diff = big - small;
    std::printf(
        "%s: %d steps; small %.1f MB (%llu tokens): median max RSS %.1f MiB; big %.1f MB (%llu tokens): "
        "%.1f MiB\n",
        config.c_str(), steps, small_mb, static_cast<unsigned long long>(sets[0].tokens), small, big_mb,
        static_cast<unsigned long long>(sets[1].tokens), big);
    std::printf("difference big - small: %+.1f MiB (data %.0fx larger); target within 64 MiB: %s\n", diff,
                big_mb / small_mb, diff <= 64 ? "ok" : "MISSED");
    return 0;
  });
}
