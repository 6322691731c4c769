// pci_numa_node (core/device.h): a GPU's NUMA node from sysfs, as the CUDA backend reads it for
// cudaDeviceGetPCIBusId's answer (docs/gpu-readiness.md, Memory). Checked against a fake sysfs tree.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/device.h"

namespace fs = std::filesystem;

namespace {

struct FakeSysfs : ::testing::Test {
  fs::path root = fs::temp_directory_path() / ("stp_sysfs_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void SetUp() override { fs::create_directories(root); }
  void TearDown() override { fs::remove_all(root); }
  void device(const std::string& id, const std::string& numa_node) {
    fs::create_directories(root / id);
    std::ofstream(root / id / "numa_node") << numa_node;
  }
};

TEST_F(FakeSysfs, ReadsTheNodeOfTheBusIdInLowerCase) {
  device("0000:3b:00.0", "1\n");
  EXPECT_EQ(stp::pci_numa_node("0000:3B:00.0", root.string()), 1) << "CUDA writes hex digits in upper case";
  EXPECT_EQ(stp::pci_numa_node("0000:3b:00.0", root.string()), 1);
}

TEST_F(FakeSysfs, NoAffinityMissingOrGarbageIsUnknown) {
  device("0000:01:00.0", "-1\n");  // one-node machines
  device("0000:02:00.0", "x\n");
  EXPECT_EQ(stp::pci_numa_node("0000:01:00.0", root.string()), -1);
  EXPECT_EQ(stp::pci_numa_node("0000:02:00.0", root.string()), -1);
  EXPECT_EQ(stp::pci_numa_node("0000:99:00.0", root.string()), -1);
  EXPECT_EQ(stp::pci_numa_node("", root.string()), -1);
  EXPECT_EQ(stp::pci_numa_node("../0000:01:00.0", root.string()), -1);
}

}  // namespace
