// Subcommand registry of the `stp` executable. Each tools/stp/cmd_NAME.cpp defines
//   static const stp::tools::Command kCmd{"name", "one-line summary", &define};
// and is picked up by the build. main() gives every command a CLI11 subcommand (tools/cli/cli.h);
// `define` declares the command's options and positionals on it, bound to the command's own
// argument struct, and returns what runs the command once the command line has been parsed.
//
// A command returns the process exit status; it throws stp::Error for user errors (main prints
// "stp NAME: error: …" and exits 1) and never calls exit() itself.
#pragma once

#include <functional>
#include <vector>

namespace CLI {
class App;
}

namespace stp {
class ProcessGroup;
}

namespace stp::tools {

using Run = std::function<int()>;  // runs the command with the parsed arguments

struct Command {
  Command(const char* name, const char* summary, Run (*define)(CLI::App&));
  const char* name;
  const char* summary;
  Run (*define)(CLI::App&);
};

const std::vector<const Command*>& commands();

// The job's processes when an MPI launcher started stp (main() starts MPI before the command
// runs, process/process.h), else nullptr. A command that fails on one process of a multi-process job
// just throws: main() reports it and ends every process.
ProcessGroup* processes();

}  // namespace stp::tools
