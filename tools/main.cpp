// `stp` entry point: dispatches to the subcommands registered by tools/cmd_*.cpp and turns
// exceptions into one clear line and a non-zero exit status. The only place that exits.
//
// Under an MPI launcher main() starts MPI first (process/process.h). An error on one process of a
// multi-process job is printed (prefixed with the process) and ends the whole job at once
// (ProcessGroup::terminate, MPI_Abort), so no process waits for ever on the failed one; an error
// every process raised together (JobError) ends each process normally.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "base/error.h"
#include "process/process.h"
#include "tools/command.h"

namespace stp::tools {

static std::vector<const Command*>& registry() {
  static std::vector<const Command*> r;
  return r;
}

Command::Command(const char* n, const char* u, int (*r)(const Args&)) : name(n), usage(u), run(r) {
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

static void print_usage(FILE* out) {
  std::fprintf(out, "usage: stp <command> [args]\n\ncommands:\n");
  auto cmds = stp::tools::commands();
  std::sort(cmds.begin(), cmds.end(), [](auto* a, auto* b) { return std::strcmp(a->name, b->name) < 0; });
  for (const auto* c : cmds) std::fprintf(out, "  %s\n", c->usage);
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto* c : stp::tools::commands()) {
    if (std::strcmp(c->name, argv[1]) != 0) continue;
    stp::tools::Args args(argv + 2, argv + argc);
    try {
      stp::tools::process_group() = stp::start_processes();
      int status = c->run(args);
      stp::tools::process_group().reset();  // MPI_Finalize after a clean run
      return status;
    } catch (const stp::JobError& e) {
      std::fprintf(stderr, "%serror: %s\n", prefix(c->name).c_str(), e.what());
      return fail(1, true);
    } catch (const stp::DeviceError& e) {
      std::fprintf(stderr, "%sdevice error: %s\n", prefix(c->name).c_str(), e.what());
      return fail(4, false);
    } catch (const stp::Error& e) {
      std::fprintf(stderr, "%serror: %s\n", prefix(c->name).c_str(), e.what());
      return fail(1, false);
    } catch (const stp::InternalError& e) {
      std::fprintf(stderr, "%s%s\n(this is a bug in stp; please report it)\n", prefix(c->name).c_str(), e.what());
      return fail(3, false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%serror: %s\n", prefix(c->name).c_str(), e.what());
      return fail(1, false);
    }
  }
  std::fprintf(stderr, "stp: unknown command '%s'\n", argv[1]);
  print_usage(stderr);
  return 2;
}
