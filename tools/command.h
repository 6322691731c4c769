// Subcommand registry of the `stp` executable. Each tools/cmd_NAME.cpp defines
//   static const stp::tools::Command kCmd{"name", "one-line usage", &run};
// and is picked up by the build; main() dispatches on argv[1].
//
// A command returns the process exit status; it throws stp::Error for user errors (main prints
// "stp NAME: error: …" and exits 1) and never calls exit() itself.
#pragma once

#include <string>
#include <vector>

namespace stp {
class ProcessGroup;
}

namespace stp::tools {

using Args = std::vector<std::string>;  // argv after the subcommand name

struct Command {
  Command(const char* name, const char* usage, int (*run)(const Args&));
  const char* name;
  const char* usage;
  int (*run)(const Args&);
};

const std::vector<const Command*>& commands();

// The job's processes when an MPI launcher started stp (main() starts MPI before the command
// runs, process/process.h), else nullptr. A command that fails on one process of a multi-process job
// just throws: main() reports it and ends every process.
ProcessGroup* processes();

}  // namespace stp::tools
