// Test helper: runs the built `stp` executable with arguments and captures its exit status,
// stdout and stderr. Each call uses its own temporary folder, so tests may run in parallel
// (ctest -j) without sharing output files.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace stp::testing {

struct CommandResult {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return text;
}

inline bool have_stp() { return std::filesystem::exists(std::string(STP_BINARY_DIR) + "/stp"); }

// Runs a shell command line as is (quote it yourself), stdin from /dev/null.
inline CommandResult run_command(const std::string& command) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "stp_cmd_XXXXXX").string();
  std::string dir = mkdtemp(tmpl.data()) ? tmpl : std::string("/tmp");
  std::string cmd = command + " >" + dir + "/out 2>" + dir + "/err </dev/null";
  int rc = std::system(cmd.c_str());
  CommandResult r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(dir + "/out"), slurp(dir + "/err")};
  std::filesystem::remove_all(dir);
  return r;
}

// `args` is appended to the stp command line as is (quote it yourself).
inline CommandResult run_stp(const std::string& args) {
  return run_command(std::string(STP_BINARY_DIR) + "/stp " + args);
}

}  // namespace stp::testing
