#include "formats/hf_folder.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/json_fields.h"
#include "formats/checkpoint.h"

namespace stp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, std::string> read_weight_map(const fs::path& index) {
  std::ifstream f(index, std::ios::binary);
  STP_CHECK(f.good(), "HF model: cannot read '", index.string(), "'");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str("HF model: ", index.string(), " is not valid JSON: ", json_error_text(e)));
  }
  STP_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "HF model: ", index.string(),
            " lacks a \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    STP_CHECK(shard.is_string(), "HF model: ", index.string(), ": the shard of tensor ", quoted_text(name, '\''),
              " must be a string, not ", shard.dump());
    const std::string s = shard.get<std::string>();
    STP_CHECK(
        !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s != "." && s != "..",
        "HF model: ", index.string(), ": tensor ", quoted_text(name, '\''), " names shard ", quoted_text(s, '\''),
        ", which is not a plain file name in the folder");
    out.emplace(name, s);
  }
  STP_CHECK(!out.empty(), "HF model: ", index.string(), " has an empty weight_map");
  return out;
}

// The shards' readers, and every tensor's file and name in it (weight-map names), checked as the
// index says.
std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> open_sharded(
    const fs::path& dir, std::vector<std::unique_ptr<SafetensorsReader>>& files) {
  const fs::path index = dir / kHfIndexFile;
  const auto weight_map = read_weight_map(index);
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map) shards.insert(shard);
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> out;
  std::map<std::string, std::string> found_in;
  for (const std::string& shard : shards) {
    const fs::path p = dir / shard;
    std::error_code ec;
    STP_CHECK(fs::is_regular_file(p, ec), "HF model: ", index.string(), " names shard ", quoted_text(shard, '\''),
              ", which is missing from ", dir.string());
    files.push_back(std::make_unique<SafetensorsReader>(p.string()));
    std::map<std::string, const SafetensorsEntry*> by_name;  // the file's tensors in name order
    for (const SafetensorsEntry& e : files.back()->tensors()) by_name.emplace(e.name, &e);
    for (const auto& [name, e] : by_name) {
      auto [it, fresh] = found_in.emplace(name, shard);
      STP_CHECK(fresh, "HF model: tensor ", quoted_text(name, '\''), " is in both ", escaped_text(it->second), " and ",
                escaped_text(shard));
      out.emplace(name, std::make_pair(files.back().get(), e));
    }
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = found_in.find(name);
    STP_CHECK(it != found_in.end(), "HF model: ", index.string(), " puts tensor ", quoted_text(name, '\''), " in ",
              escaped_text(shard), ", which does not hold it");
    STP_CHECK(it->second == shard, "HF model: ", index.string(), " puts tensor ", quoted_text(name, '\''), " in ",
              escaped_text(shard), " but it is in ", escaped_text(it->second));
  }
  return out;
}

}  // namespace

bool is_model_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

ModelSource::ModelSource(const std::string& path) {
  if (!is_model_folder(path)) {
    files_.push_back(std::make_unique<SafetensorsReader>(path));
    add_model_tensors(*files_.back(), tensors_);
    return;
  }
  const fs::path dir(path);
  std::error_code ec;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors;
  if (fs::is_regular_file(dir / kHfIndexFile, ec)) {
    tensors = open_sharded(dir, files_);
  } else if (fs::is_regular_file(dir / kHfModelFile, ec)) {
    files_.push_back(std::make_unique<SafetensorsReader>((dir / kHfModelFile).string()));
    for (const SafetensorsEntry& e : files_.back()->tensors())
      tensors.emplace(e.name, std::make_pair(files_.back().get(), &e));
  } else {
    throw Error(str("HF model: folder '", path, "' holds neither ", kHfIndexFile, " nor ", kHfModelFile));
  }
  // The "transformer." prefix, as for single files.
  for (const auto& [name, t] : tensors) {
    static const std::string prefix = "transformer.";
    std::string n = name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
    STP_CHECK(tensors_.add(n, *t.first, *t.second), "HF model: '", path, "': tensors ", quoted_text(name, '\''),
              " and ", quoted_text(n, '\''), " are the same tensor once the \"transformer.\" prefix is dropped");
  }
}

std::map<std::string, HostTensor> read_model_source(const std::string& path) { return read_all(ModelSource(path)); }

}  // namespace stp
