// The machine's memory as memory/host_memory.h reads it, from fake /proc and cgroup trees: MemTotal,
// the smallest cgroup limit on the path to the root (v2 memory.max, v1 memory.limit_in_bytes),
// "no limit" spellings, a container that sees its cgroup as the root, and the errors.
#include "memory/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "base/error.h"
#include "tests/support/files.h"

namespace {

namespace fs = std::filesystem;
constexpr std::uint64_t GiB = std::uint64_t{1} << 30;

// A fake machine under a scratch folder: meminfo with MemTotal = `total_kb`, /proc/self/cgroup
// with `cgroup_lines`, and the cgroup mount at root/cg.
struct FakeMachine {
  stp::testing::ScratchDir dir;
  stp::HostMemoryFiles files;

  FakeMachine(std::uint64_t total_kb, const std::string& cgroup_lines) {
    files.meminfo = dir.file("meminfo");
    files.self_cgroup = dir.file("cgroup");
    files.cgroup_root = dir.file("cg");
    stp::testing::write_bytes(files.meminfo, "MemFree:         1000 kB\nMemTotal:       " + std::to_string(total_kb) +
                                                 " kB\nMemAvailable:    900 kB\n");
    stp::testing::write_bytes(files.self_cgroup, cgroup_lines);
    fs::create_directories(files.cgroup_root);
  }
  // Writes `text` to cg/REL (creating its folders).
  void limit(const std::string& rel, const std::string& text) {
    const fs::path p = fs::path(files.cgroup_root) / rel;
    fs::create_directories(p.parent_path());
    stp::testing::write_bytes(p.string(), text + "\n");
  }
};

TEST(HostMemory, MemTotalWithoutACgroupLimit) {
  FakeMachine m(16 * 1024 * 1024, "0::/\n");  // v2 root: no memory.max there
  const stp::HostMemory h = stp::read_host_memory(m.files);
  EXPECT_EQ(h.mem_total, 16 * GiB);
  EXPECT_EQ(h.cgroup_limit, 0u);
  EXPECT_EQ(h.available(), 16 * GiB);
  EXPECT_EQ(h.source(), "MemTotal");
}

// The smallest limit on the path binds: the process's cgroup says max, its parent 8 GiB.
TEST(HostMemory, CgroupV2TakesTheSmallestLimitOnThePathToTheRoot) {
  FakeMachine m(16 * 1024 * 1024, "0::/job/step\n");
  m.limit("job/step/memory.max", "max");
  m.limit("job/memory.max", std::to_string(8 * GiB));
  m.limit("memory.max", std::to_string(12 * GiB));
  const stp::HostMemory h = stp::read_host_memory(m.files);
  EXPECT_EQ(h.cgroup_limit, 8 * GiB);
  EXPECT_EQ(h.available(), 8 * GiB);
  EXPECT_NE(h.source().find("cgroup limit"), std::string::npos) << h.source();
  EXPECT_NE(h.source().find("job/memory.max"), std::string::npos) << h.source();
}

// v1: the memory controller's line among others; its "no limit" (LONG_MAX rounded to a page) is
// none, and the root's limit binds.
TEST(HostMemory, CgroupV1ReadsTheMemoryControllersLine) {
  FakeMachine m(16 * 1024 * 1024, "9:name=systemd:/\n4:memory:/process_api/x\n3:cpuset:/\n0::/\n");
  m.limit("memory/process_api/x/memory.limit_in_bytes", "9223372036854771712");
  m.limit("memory/memory.limit_in_bytes", std::to_string(2 * GiB));
  m.limit("cpuset/memory.limit_in_bytes", "1024");  // another controller's folder: not read
  const stp::HostMemory h = stp::read_host_memory(m.files);
  EXPECT_EQ(h.cgroup_limit, 2 * GiB);
  EXPECT_EQ(h.available(), 2 * GiB);
}

// A container sees its own cgroup as the mount's root while /proc/self/cgroup names the host's
// path: the folders that do not exist are skipped and the mount's root binds.
TEST(HostMemory, APathMissingUnderTheMountEndsAtTheMountsRoot) {
  FakeMachine m(16 * 1024 * 1024, "0::/docker/abc123\n");
  m.limit("memory.max", std::to_string(GiB));
  EXPECT_EQ(stp::read_host_memory(m.files).available(), GiB);
}

// A limit above MemTotal does not raise what the process can have.
TEST(HostMemory, ALimitAboveMemTotalLeavesMemTotal) {
  FakeMachine m(4 * 1024 * 1024, "0::/a\n");
  m.limit("a/memory.max", std::to_string(64 * GiB));
  const stp::HostMemory h = stp::read_host_memory(m.files);
  EXPECT_EQ(h.cgroup_limit, 64 * GiB);
  EXPECT_EQ(h.available(), 4 * GiB);
  EXPECT_EQ(h.source(), "MemTotal");
}

TEST(HostMemory, NoCgroupFileIsNoLimit) {
  FakeMachine m(8 * 1024 * 1024, "");
  m.files.self_cgroup = m.dir.file("missing");
  EXPECT_EQ(stp::read_host_memory(m.files).available(), 8 * GiB);
}

TEST(HostMemory, UnreadableFilesAreErrorsNamingThem) {
  FakeMachine m(8 * 1024 * 1024, "0::/a\n");
  m.limit("a/memory.max", "lots");
  try {
    stp::read_host_memory(m.files);
    FAIL() << "a cgroup limit of 'lots' was read";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a/memory.max holds 'lots'"), std::string::npos) << e.what();
  }
  stp::testing::write_bytes(m.files.meminfo, "MemFree: 12 kB\n");
  try {
    stp::read_host_memory(m.files);
    FAIL() << "a meminfo without MemTotal was read";
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(m.files.meminfo), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MemTotal"), std::string::npos) << e.what();
  }
  m.files.meminfo = m.dir.file("no-such-file");
  EXPECT_THROW(stp::read_host_memory(m.files), stp::Error);
}

// This machine (Linux): a MemTotal is there.
TEST(HostMemory, ThisMachineHasMemory) { EXPECT_GT(stp::read_host_memory().available(), 0u); }

}  // namespace
