// Command-line arguments of the subcommands that take a config: `CONFIG.yaml [--set KEY=VALUE]...`
// (--set repeats; `--set=KEY=VALUE` works too). A missing (when required) or second config file
// and an unknown option are usage errors (tools/cli/cli.h).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace stp::tools {

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> overrides;  // KEY=VALUE of each --set, in order
};

inline void add_config_args(CLI::App& app, ConfigArgs& args, bool config_required = true) {
  app.add_option("CONFIG.yaml", args.config_path, "the job's config file (every key: docs/config.md)")
      ->required(config_required)
      ->type_name("");
  // One value per --set: a following argument is the config file, not a second override.
  app.add_option("--set", args.overrides, "override one config key, e.g. --set train.steps=100 (repeatable)")
      ->type_name("KEY=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->allow_extra_args(false);
}

}  // namespace stp::tools
