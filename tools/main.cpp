// `stp` entry point: dispatches to the subcommands registered by tools/cmd_*.cpp and turns
// exceptions into one clear line and a non-zero exit status. The only place that exits.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>

#include "core/error.h"
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

}  // namespace stp::tools

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
      return c->run(args);
    } catch (const stp::Error& e) {
      std::fprintf(stderr, "stp %s: error: %s\n", c->name, e.what());
      return 1;
    } catch (const stp::InternalError& e) {
      std::fprintf(stderr, "stp %s: %s\n(this is a bug in stp; please report it)\n", c->name, e.what());
      return 3;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "stp %s: error: %s\n", c->name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "stp: unknown command '%s'\n", argv[1]);
  print_usage(stderr);
  return 2;
}
