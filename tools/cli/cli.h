// Command lines of `stp` and the benchmarks, on CLI11 (<CLI/CLI.hpp>), so that every executable
// answers --help and --version and reports a usage error the same way: one line on stderr,
//   PROG: error: WHAT (run 'PROG --help')
// and exit status 1, the status of every user error (docs/architecture.md, "Error model"). PROG
// is the executable and the subcommand, e.g. "stp sim" or "bench_model".
//
// A benchmark's main():
//   CLI::App app{"What it measures.", "bench_x"};
//   stp::tools::init_cli(app);
//   app.add_option("--steps", steps, "measured steps")->capture_default_str();
//   if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
//   return stp::tools::run_main(app, [&] { ...; return 0; });
#pragma once

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace stp::tools {

// "0.1.0 (git 1a2b3c4)": the project version of the top-level CMakeLists.txt and the commit it was
// configured at (just the version outside a git checkout).
std::string version();

// Adds --version to `app` (help is CLI11's -h/--help); a repeated option keeps its last value.
// Call before adding options and subcommands.
void init_cli(CLI::App& app);

// Parses argv into app's options. Returns nothing when the program should go on; otherwise the
// status to exit with, after printing: 0 after --help or --version (stdout), 1 after a usage error.
std::optional<int> parse_cli(CLI::App& app, int argc, const char* const* argv);

// For an option read into a std::uint64_t: decimal digits, 0 to 2^64 - 1. CLI11 reads unsigned
// options with strtoull, which takes "-1" as 2^64 - 1, "010" as octal and clamps an overflow to
// 2^64 - 1, silently; this check refuses each with a usage error naming the option.
extern const CLI::Validator kUnsigned64;

// Prints the usage error line for `prog` ("stp sim", "bench_x") and returns 1.
int usage_error(const std::string& prog, const std::string& what);

// Runs a benchmark's body (which returns the exit status) and reports an exception that escapes
// it as "PROG: error: WHAT" with status 1.
template <class Body>
int run_main(const CLI::App& app, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", app.get_name().c_str(), e.what());
    return 1;
  }
}

}  // namespace stp::tools
