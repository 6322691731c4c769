// `stp` entry point: parses the command line with the subcommands registered by tools/stp/cmd_*.cpp
// (tools/cli/cli.h: --help, --version, usage errors as one line and status 1), runs the chosen one and
// turns exceptions into one clear line and a non-zero exit status. The only place that exits. Each
// subcommand answers --version too ("stp train 0.1.0 (git ...)"). A std::filesystem or JSON
// library exception that a layer did not translate is still printed in stp's words (the system's
// reason and the path; the JSON reason without the library's exception id).
//
// Under an MPI launcher main() starts MPI before the command runs (process/process.h). An error on one process of a
// multi-process job is printed (prefixed with the process) and ends the whole job at once
// (ProcessGroup::terminate, MPI_Abort), so no process waits for ever on the failed one; an error
// every process raised together (JobError) ends each process normally. The command line is parsed
// before MPI starts: a usage error is the same on every process, and each reports it and exits 1.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <string>

#include "base/error.h"
#include "base/fs_error.h"
#include "base/json_fields.h"
#include "process/process.h"
#include "tools/cli/blas_env.h"
#include "tools/cli/cli.h"
#include "tools/stp/command.h"

namespace stp::tools {

static std::vector<const Command*>& registry() {
  static std::vector<const Command*> r;
  return r;
}

Command::Command(const char* n, const char* s, Run (*d)(CLI::App&)) : name(n), summary(s), define(d) {
  registry().push_back(this);
}

const std::vector<const Command*>& commands() { return registry(); }

static std::unique_ptr<ProcessGroup>& process_group() {
  static std::unique_ptr<ProcessGroup> p;
  return p;
}

ProcessGroup* processes() { return process_group().get(); }

}  // namespace stp::tools

// "stp NAME: " or, on a process of a multi-process job, "stp NAME [process R/N]: ".
static std::string prefix(const char* name) {
  auto* p = stp::tools::processes();
  if (!p || p->size() <= 1) return stp::str("stp ", name, ": ");
  return stp::str("stp ", name, " [process ", p->rank(), "/", p->size(), "]: ");
}

// Exit status after a reported error: a lone failing process of a multi-process job ends the job.
static int fail(int status, bool together) {
  auto& p = stp::tools::process_group();
  std::fflush(stderr);
  if (p && p->size() > 1 && !together) p->terminate(status);
  p.reset();
  return status;
}

int main(int argc, char** argv) {
  stp::tools::reexec_with_blas_tuning(argv);  // OpenBLAS reads its settings when it loads
  CLI::App app{
      "stp: a training runtime for GPT-2 and Llama-family models with tensor and pipeline parallelism (README.md).",
      "stp"};
  stp::tools::init_cli(app);
  app.require_subcommand(1);
  auto cmds = stp::tools::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto* a, auto* b) { return std::strcmp(a->name, b->name) < 0; });
  std::string names;
  std::vector<std::pair<const CLI::App*, stp::tools::Run>> runs;
  for (const auto* c : cmds) {
    CLI::App* sub = app.add_subcommand(c->name, c->summary);
    sub->set_version_flag("--version", stp::str("stp ", c->name, " ", stp::tools::version()));
    runs.emplace_back(sub, c->define(*sub));
    names += stp::str(names.empty() ? "" : ", ", c->name);
  }
  // CLI11 would only say "A subcommand is required" for these two.
  if (argc < 2) return stp::tools::usage_error("stp", "a command is required (" + names + ")");
  auto named = [&](const auto* c) { return std::strcmp(c->name, argv[1]) == 0; };
  if (argv[1][0] != '-' && std::none_of(cmds.begin(), cmds.end(), named))
    return stp::tools::usage_error("stp", stp::str("unknown command '", argv[1], "' (", names, ")"));
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;

  const CLI::App* chosen = app.get_subcommands().front();
  const char* name = chosen->get_name().c_str();
  const stp::tools::Run& run =
      std::find_if(runs.begin(), runs.end(), [&](auto& r) { return r.first == chosen; })->second;
  try {
    stp::tools::process_group() = stp::start_processes();
    int status = run();
    stp::tools::process_group().reset();  // MPI_Finalize after a clean run
    return status;
  } catch (const stp::JobError& e) {
    std::fprintf(stderr, "%serror: %s\n", prefix(name).c_str(), e.what());
    return fail(1, true);
  } catch (const stp::DeviceError& e) {
    std::fprintf(stderr, "%sdevice error: %s\n", prefix(name).c_str(), e.what());
    return fail(4, false);
  } catch (const stp::Error& e) {
    std::fprintf(stderr, "%serror: %s\n", prefix(name).c_str(), e.what());
    return fail(1, false);
  } catch (const stp::InternalError& e) {
    std::fprintf(stderr, "%s%s\n(this is a bug in stp; please report it)\n", prefix(name).c_str(), e.what());
    return fail(3, false);
  } catch (const std::filesystem::filesystem_error& e) {
    // Layers that know the config key or file translate these themselves; this is the last
    // resort, still without the library's own text.
    std::fprintf(stderr, "%serror: %s\n", prefix(name).c_str(), stp::filesystem_reason(e).c_str());
    return fail(1, false);
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "%serror: JSON: %s\n", prefix(name).c_str(), stp::json_error_text(e).c_str());
    return fail(1, false);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%serror: out of host memory\n", prefix(name).c_str());
    return fail(1, false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%serror: %s\n", prefix(name).c_str(), e.what());
    return fail(1, false);
  }
}
