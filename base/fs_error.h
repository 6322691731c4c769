// A std::filesystem::filesystem_error in stp's words, for a message that says itself what was
// being done and under which config key or file: the system's reason and the paths the error
// names, without the library's "filesystem error: cannot ...:" text.
//
// A path the message names already (`named`) is not repeated.
//
// Example:
//   catch (const std::filesystem::filesystem_error& e) {
//     throw Error(str("output.dir '", dir, "': ", filesystem_reason(e, dir)));
//   }   // "output.dir 'a/b': Not a directory"; "output.dir 'a': Permission denied ('a/metrics.jsonl')"
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace stp {

inline std::string filesystem_reason(const std::filesystem::filesystem_error& e,
                                     const std::filesystem::path& named = {}) {
  std::vector<std::string> paths;
  for (const std::filesystem::path& p : {e.path1(), e.path2()})
    if (!p.empty() && p != named) paths.push_back("'" + p.string() + "'");
  std::string out = e.code().message();
  if (!paths.empty()) out += " (" + paths[0] + (paths.size() > 1 ? ", " + paths[1] : std::string()) + ")";
  return out;
}

}  // namespace stp
