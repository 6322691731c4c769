#include "tools/cli/output_guard.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>

#include "base/error.h"

namespace stp::tools {
namespace {

namespace fs = std::filesystem;

// The path absolute, with symlinks resolved as far as it exists (weakly_canonical) and no
// trailing separator.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec).lexically_normal();
  if (!r.has_filename() && r.has_relative_path()) r = r.parent_path();
  return r;
}

// Whether `inner` is `outer` or lies below it, component by component (resolved paths).
bool within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec) && !ec) return true;
  return resolved(a) == resolved(b);
}

bool is_folder(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// What an existing file is, when stp reads files of its kind as input (output_guard.h); "" if not.
std::string read_by_stp(const fs::path& file) {
  static constexpr std::array<std::string_view, 5> kTokenizer = {"tokenizer.json", "vocab.json", "merges.txt",
                                                                 "encoder.json", "vocab.bpe"};
  static constexpr std::array<std::string_view, 3> kRun = {"metrics.jsonl", "config.yaml", "trace.json"};
  const std::string name = file.filename().string();
  std::error_code ec;
  if (fs::exists(file.parent_path() / "state.json", ec))
    return "a file of the checkpoint '" + file.parent_path().string() + "'";
  if (std::find(kTokenizer.begin(), kTokenizer.end(), name) != kTokenizer.end()) return "a tokenizer file";
  if (std::find(kRun.begin(), kRun.end(), name) != kRun.end()) return "a run's " + name;
  if (file.extension() == ".safetensors") return "a tensor file";
  return "";
}

}  // namespace

void check_output_file(const std::string& output, const std::string& name, const std::vector<Input>& inputs) {
  STP_CHECK(!is_folder(output), name, " '", output, "' is a folder; name the file to write");
  const fs::path out = resolved(output);
  for (const Input& in : inputs) {
    if (in.path.empty()) continue;
    STP_CHECK(!same_file(output, in.path), name, " '", output, "' is the same file as ", in.name, " '", in.path,
              "', which the command reads; name another file to write");
    STP_CHECK(!is_folder(in.path) || !within(out, resolved(in.path)), name, " '", output, "' is inside the folder ",
              in.name, " '", in.path, "', which the command reads; write it outside that folder");
  }
  std::error_code ec;
  const fs::path folder = fs::path(output).parent_path();
  STP_CHECK(folder.empty() || is_folder(folder.string()), name, " '", output, "': the folder '", folder.string(),
            "' does not exist; create it first");
  if (!fs::is_regular_file(output, ec)) return;  // nothing to replace, or a device written into
  const std::string kind = read_by_stp(out);
  STP_CHECK(kind.empty(), name, " '", output, "' exists and is ", kind,
            ", which stp reads as input; name another file");
}

void check_output_dir(const std::string& dir, const std::string& name, const std::vector<Input>& inputs) {
  std::error_code ec;
  STP_CHECK(!fs::exists(dir, ec) || is_folder(dir), name, " '", dir, "' exists and is not a folder");
  const fs::path out = resolved(dir);
  for (const Input& in : inputs) {
    if (in.path.empty()) continue;
    const fs::path p = resolved(in.path);
    STP_CHECK(!within(out, p), name, " '", dir, "' is ", out == p ? "" : "inside ", in.name, " '", in.path,
              "': the run writes its files there; choose another ", name);
    STP_CHECK(in.may_be_inside_output || !within(p, out), name, " '", dir, "' holds ", in.name, " '", in.path,
              "': the run writes into ", name,
              " (metrics.jsonl, config.yaml, checkpoints) and moves an earlier run's files aside; keep ", in.name,
              " outside it or choose another ", name);
  }
}

}  // namespace stp::tools
