#include "data/shard_paths.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> glob_paths(const std::string& pattern, const std::string& what) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> paths(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
  ::globfree(&g);
  STP_CHECK(rc != GLOB_NOMATCH, what, " '", pattern, "' matches no files (a glob: check the folder and the pattern)");
  STP_CHECK(rc == 0, what, " '", pattern, "': cannot list the files it matches (",
            rc == GLOB_ABORTED ? "a folder could not be read" : "out of memory", ")");
  std::sort(paths.begin(), paths.end());  // byte order, whatever the locale
  for (const std::string& p : paths) check_regular_file(p, what + " " + pattern + ":");
  return paths;
}

}  // namespace

std::vector<std::string> shard_paths(const std::string& path, const std::string& what, const std::string& kept,
                                     const std::function<bool(const std::string& file_name)>& keep) {
  std::error_code ec;
  if (!fs::exists(path, ec) && path.find_first_of("*?[") != std::string::npos) return glob_paths(path, what);
  STP_CHECK(fs::exists(path, ec), what, " '", path, "' does not exist");
  if (!fs::is_directory(path, ec)) {
    check_regular_file(path, what);
    return {path};
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.symlink_status().type() == fs::file_type::regular && (!keep || keep(e.path().filename().string())))
      files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  STP_CHECK(!files.empty(), what, " '", path, "' is a folder that holds no ", kept);
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(f.string());
  return out;
}

}  // namespace stp
