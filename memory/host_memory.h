// What this machine has in host memory for this process, as the kernel states it (one job: the
// query; what a run makes of it is train/memory_settings.h, memory.host_budget: auto).
//
//   * MemTotal: the `MemTotal:` line of /proc/meminfo (kB). Not MemFree or MemAvailable: the
//     answer depends on the machine alone, not on what else runs at the moment, so `stp plan` and
//     `stp train` on one machine agree, and a plan does not change from run to run.
//   * The cgroup limit: the smallest memory limit on the path from this process's cgroup to the
//     root of its hierarchy (a limit binds every cgroup below it). The path is the one
//     /proc/self/cgroup names: cgroup v2 (`0::/path`) reads CGROUP_ROOT/path/memory.max, v1 (the
//     line whose controllers include `memory`) reads CGROUP_ROOT/memory/path/memory.limit_in_bytes.
//     A directory that does not exist under the mount (a container that sees its own cgroup as the
//     root) is skipped, so the walk ends at the mount's root. "max", an empty file and v1's
//     "no limit" (a page-rounded 2^63 - 1) are no limit.
//   * available() is the smaller of the two: the bytes this process can have at all.
//
// The paths are injected (HostMemoryFiles), so tests read fake /proc and cgroup trees.
//
// Errors: a meminfo file that cannot be read or has no MemTotal line is an stp::Error naming the
// file. Missing or unreadable cgroup files are no limit; a cgroup file that holds neither a number
// nor "max" is an stp::Error naming the file and its text.
#pragma once

#include <cstdint>
#include <string>

#include "base/error.h"

namespace stp {

struct HostMemoryFiles {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
};

struct HostMemory {
  std::uint64_t mem_total = 0;     // MemTotal, bytes
  std::uint64_t cgroup_limit = 0;  // the smallest cgroup memory limit, bytes; 0 = none
  std::string cgroup_file;         // the file that limit was read from ("" = none)

  // min(mem_total, cgroup_limit): what this process can have at all.
  std::uint64_t available() const;
  // Where available() comes from, for messages: "MemTotal" or "cgroup limit, FILE".
  std::string source() const;
};

HostMemory read_host_memory(const HostMemoryFiles& files = {});

}  // namespace stp
