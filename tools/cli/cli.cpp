// Shared command-line setup of tools/ (see cli.h). STP_VERSION and STP_GIT_COMMIT come from
// tools/CMakeLists.txt, on this file only.
#include "tools/cli/cli.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace stp::tools {

std::string version() {
  std::string commit = STP_GIT_COMMIT;
  return commit.empty() ? std::string(STP_VERSION) : std::string(STP_VERSION) + " (git " + commit + ")";
}

void init_cli(CLI::App& app) {
  app.set_version_flag("--version", app.get_name() + " " + version());
  // An option given twice keeps its last value, as the hand-written parsers before CLI11 did;
  // options that collect (--set) say TakeAll themselves. Subcommands inherit this.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

const CLI::Validator kUnsigned64(
    [](std::string& text) -> std::string {
      std::uint64_t v = 0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (!text.empty() && r.ec == std::errc() && r.ptr == text.data() + text.size()) return "";
      return "must be an integer from 0 to 18446744073709551615, not '" + text + "'";
    },
    "UINT64");

int usage_error(const std::string& prog, const std::string& what) {
  std::string line = what;
  for (char& c : line)
    if (c == '\n') c = ' ';  // one line, whatever the message
  std::fprintf(stderr, "%s: error: %s (run '%s --help')\n", prog.c_str(), line.c_str(), prog.c_str());
  return 1;
}

std::optional<int> parse_cli(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help, --version: CLI11 prints them
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // The error belongs to the deepest subcommand selected so far ("stp sim").
    const CLI::App* sub = &app;
    std::string prog = app.get_name();
    while (!sub->get_subcommands().empty()) {
      sub = sub->get_subcommands().front();
      prog += " " + sub->get_name();
    }
    // CLI11 checks required options before arguments it did not expect; name a mistyped option
    // first, since it is usually why a required one looks missing.
    std::vector<std::string> extra = sub->remaining();
    if (!extra.empty())
      return usage_error(prog,
                         (extra[0].rfind('-', 0) == 0 ? "unknown option '" : "unexpected argument '") + extra[0] + "'");
    return usage_error(prog, e.what());
  }
}

}  // namespace stp::tools
