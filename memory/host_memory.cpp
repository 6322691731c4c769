#include "memory/host_memory.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace stp {

namespace {

namespace fs = std::filesystem;

// v1 writes "no limit" as LONG_MAX rounded down to a page (9223372036854771712); anything from
// 2^62 on is no limit on any machine that exists.
constexpr std::uint64_t kNoLimitFrom = std::uint64_t{1} << 62;

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trimmed(std::string s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

std::uint64_t mem_total_of(const std::string& path) {
  std::optional<std::string> text = read_text(path);
  STP_CHECK(text, "cannot read ", path,
            " (the machine's memory, for memory.host_budget: auto); set memory.host_budget "
            "to a size instead");
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    std::uint64_t kb = 0;
    std::string unit;
    if (fields >> kb >> unit && unit == "kB" && kb > 0) return kb * 1024;
    break;
  }
  throw Error(str(path,
                  " has no 'MemTotal: N kB' line (the machine's memory, for memory.host_budget: auto); set "
                  "memory.host_budget to a size instead"));
}

// The limit in one cgroup file: nullopt = none (missing, "max", empty, or v1's huge value).
std::optional<std::uint64_t> limit_in(const fs::path& file) {
  std::optional<std::string> text = read_text(file.string());
  if (!text) return std::nullopt;
  const std::string t = trimmed(*text);
  if (t.empty() || t == "max") return std::nullopt;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  STP_CHECK(ec == std::errc() && end == t.data() + t.size(), file.string(), " holds '", t,
            "', neither a byte count nor 'max'");
  if (v >= kNoLimitFrom) return std::nullopt;
  return v;
}

// The cgroup directories of `path` (relative to `mount`) from the process's own up to the mount's
// root, those that exist.
std::vector<fs::path> cgroup_dirs(const fs::path& mount, const std::string& path) {
  std::vector<fs::path> dirs;
  fs::path rel = fs::path(path).relative_path();
  for (;;) {
    std::error_code ec;
    const fs::path dir = rel.empty() ? mount : mount / rel;
    if (fs::is_directory(dir, ec)) dirs.push_back(dir);
    if (rel.empty()) break;
    rel = rel.has_parent_path() ? rel.parent_path() : fs::path();
  }
  return dirs;
}

struct Limit {
  std::uint64_t bytes = 0;  // 0 = none
  std::string file;
};

void take_smaller(Limit& best, const fs::path& file) {
  std::optional<std::uint64_t> v = limit_in(file);
  if (v && (best.bytes == 0 || *v < best.bytes)) best = {*v, file.string()};
}

Limit cgroup_limit_of(const HostMemoryFiles& files) {
  Limit best;
  std::optional<std::string> text = read_text(files.self_cgroup);
  if (!text) return best;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    // hierarchy-ID:controller-list:cgroup-path
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {  // cgroup v2
      for (const fs::path& dir : cgroup_dirs(files.cgroup_root, path)) take_smaller(best, dir / "memory.max");
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory")  // cgroup v1's memory controller
        for (const fs::path& dir : cgroup_dirs(fs::path(files.cgroup_root) / "memory", path))
          take_smaller(best, dir / "memory.limit_in_bytes");
  }
  return best;
}

}  // namespace

std::uint64_t HostMemory::available() const { return cgroup_limit ? std::min(mem_total, cgroup_limit) : mem_total; }

std::string HostMemory::source() const {
  return cgroup_limit && cgroup_limit < mem_total ? str("cgroup limit, ", cgroup_file) : std::string("MemTotal");
}

HostMemory read_host_memory(const HostMemoryFiles& files) {
  HostMemory m;
  m.mem_total = mem_total_of(files.meminfo);
  const Limit limit = cgroup_limit_of(files);
  m.cgroup_limit = limit.bytes;
  m.cgroup_file = limit.file;
  return m;
}

}  // namespace stp
