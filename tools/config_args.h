// Command-line arguments of the subcommands that take a config: `CONFIG.yaml [--set KEY=VALUE]...`
// plus the boolean flags a command names (e.g. --json). Unknown options and a missing or second
// config file are stp::Error naming the usage.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/command.h"

namespace stp::tools {

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> overrides;  // KEY=VALUE of each --set
  std::set<std::string> flags;         // the allowed flags that were given
};

inline ConfigArgs parse_config_args(const Args& args, const std::string& usage, const std::set<std::string>& allowed = {}) {
  ConfigArgs out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set") {
      STP_CHECK(i + 1 < args.size(), "--set needs KEY=VALUE");
      out.overrides.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      out.overrides.push_back(a.substr(6));
    } else if (allowed.count(a)) {
      out.flags.insert(a);
    } else if (!a.empty() && a[0] == '-') {
      throw Error(str("unknown option '", a, "' (usage: ", usage, ")"));
    } else {
      STP_CHECK(out.config_path.empty(), "more than one config file given ('", out.config_path, "', '", a, "')");
      out.config_path = a;
    }
  }
  STP_CHECK(!out.config_path.empty(), "usage: ", usage);
  return out;
}

}  // namespace stp::tools
