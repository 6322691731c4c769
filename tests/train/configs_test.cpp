// Every shipped config loads and validates; the CPU ones also pass the trainer's placement checks
// (built with one step, not trained).
#include <gtest/gtest.h>

#include <filesystem>

#include "config/config.h"
#include "train/trainer.h"

namespace {

TEST(ShippedConfigs, AllLoadAndTheCpuOnesBuild) {
  int count = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(STP_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    SCOPED_TRACE(e.path().string());
    stp::Config cfg = stp::load_config(e.path().string());
    if (cfg.parallel.backend != "cpu") continue;
    cfg.output.dir = std::string(STP_BINARY_DIR) + "/tests/shipped_config_run";
    EXPECT_NO_THROW(stp::Trainer t(cfg));
  }
  EXPECT_GE(count, 8);
}

}  // namespace
