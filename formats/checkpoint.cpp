// Checkpoint folders: write into a hidden temporary folder, fsync, rename (see the header).
#include "formats/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/fs_error.h"
#include "base/json_fields.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kFormat = "stp-checkpoint-1";
constexpr const char* kPrefix = "transformer.";

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  STP_CHECK(fd >= 0, "checkpoint: cannot open '", p.string(), "' to sync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  STP_CHECK(rc == 0, "checkpoint: fsync of '", p.string(), "' failed: ", std::strerror(errno));
}

// state.json, indented by two, keys in this order. The rng numbers are decimal strings: JSON
// readers in other languages lose integers above 2^53.
std::string state_json(const CheckpointState& s) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["step"] = s.step;
  j["data_position"] = s.data_position;
  if (s.shuffle)
    j["shuffle"] = {{"tokens", s.shuffle->tokens},
                    {"seq_len", s.shuffle->seq_len},
                    {"windows", s.shuffle->windows},
                    {"epoch", s.shuffle->epoch},
                    {"index", s.shuffle->index}};
  j["rng"] = {{"seed", std::to_string(s.rng_seed)}, {"offset", std::to_string(s.rng_offset)}};
  j["config_fingerprint"] = s.config_fingerprint;
  if (!s.note.empty()) j["note"] = s.note;
  return j.dump(2) + "\n";
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  STP_CHECK(f, "checkpoint: cannot create '", path.string(), "': ", std::strerror(errno));
  bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  STP_CHECK(ok, "checkpoint: writing '", path.string(), "' failed: ", std::strerror(errno));
}

using nlohmann::json;

std::uint64_t parse_u64_string(const json& obj, const char* key, const std::string& what, const std::string& file) {
  const std::string& v = json_string(obj, key);
  STP_CHECK(!v.empty() && v.find_first_not_of("0123456789") == std::string::npos, "checkpoint: ", file, ": ", what,
            " must be a decimal string");
  errno = 0;
  std::uint64_t x = std::strtoull(v.c_str(), nullptr, 10);
  STP_CHECK(errno == 0, "checkpoint: ", file, ": ", what, " is out of range");
  return x;
}

CheckpointState read_state(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CheckpointState s;
  try {
    json j = json::parse(text);
    const std::string& format = json_string(j, "format");
    STP_CHECK(format == kFormat, "unknown format \"", format, "\" (expected ", kFormat, ")");
    s.step = json_int(j, "step");
    STP_CHECK(s.step >= 0, "negative step ", s.step);
    std::int64_t pos = json_int(j, "data_position");
    STP_CHECK(pos >= 0, "negative data_position ", pos);
    s.data_position = static_cast<std::uint64_t>(pos);
    if (j.contains("shuffle")) {
      const json& sh = json_field(j, "shuffle");
      auto count = [&](const char* key) {
        const std::int64_t v = json_int(sh, key);
        STP_CHECK(v >= 0, "negative shuffle.", key, " ", v);
        return static_cast<std::uint64_t>(v);
      };
      s.shuffle = ShufflePosition{count("tokens"), count("seq_len"), count("windows"), count("epoch"), count("index")};
    }
    const json& rng = json_field(j, "rng");
    s.rng_seed = parse_u64_string(rng, "seed", "rng.seed", path.string());
    s.rng_offset = parse_u64_string(rng, "offset", "rng.offset", path.string());
    s.config_fingerprint = json_string(j, "config_fingerprint");
    if (j.contains("note")) s.note = json_string(j, "note");
  } catch (const Error& e) {
    throw Error(str("checkpoint: ", path.string(), " is invalid or truncated: ", e.what()));
  } catch (const json::exception& e) {
    throw Error(str("checkpoint: ", path.string(), " is invalid or truncated: ", json_error_text(e)));
  }
  return s;
}

std::string strip_prefix(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
}

// The tensors of a file in name order, each under its stripped name.
void strip_all(const SafetensorsReader& file, FileTensorSource& out) {
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : file.tensors()) by_name.emplace(e.name, &e);
  std::map<std::string, std::string> original;  // stripped name -> name in the file
  for (const auto& [name, e] : by_name) {
    std::string n = strip_prefix(name);
    auto [it, fresh] = original.emplace(n, name);
    STP_CHECK(fresh, file.path(), ": tensors \"", it->second, "\" and \"", name,
              "\" are the same tensor once the \"transformer.\" prefix is dropped");
    out.add(n, file, *e);
  }
}

// Splits optimizer.safetensors' tensors (`opt`, prefixes stripped) into exp_avg / exp_avg_sq by
// model tensor name and checks them against the model's.
void split_moments(const FileTensorSource& opt, const SafetensorsReader& file, const FileTensorSource& model,
                   FileTensorSource& exp_avg, FileTensorSource& exp_avg_sq, const std::string& path) {
  static const std::string avg = ".exp_avg", sq = ".exp_avg_sq";
  std::map<std::string, const SafetensorsEntry*> stripped;  // the file's entries by stripped name
  for (const SafetensorsEntry& e : file.tensors()) stripped.emplace(strip_prefix(e.name), &e);
  for (const std::string& name : opt.names()) {
    auto ends = [&](const std::string& suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const SafetensorsEntry& e = *stripped.at(name);
    if (ends(sq)) exp_avg_sq.add(name.substr(0, name.size() - sq.size()), file, e);
    else if (ends(avg)) exp_avg.add(name.substr(0, name.size() - avg.size()), file, e);
    else
      throw Error(
          str("checkpoint: ", path, ": unexpected tensor \"", name, "\" (expected NAME.exp_avg / NAME.exp_avg_sq)"));
  }
  for (const std::string& name : model.names()) {
    for (const FileTensorSource* m : {&exp_avg, &exp_avg_sq}) {
      const Shape* shape = m->shape(name);
      const char* which = m == &exp_avg ? "exp_avg" : "exp_avg_sq";
      STP_CHECK(shape != nullptr, "checkpoint: ", path, " lacks \"", name, ".", which, "\"");
      STP_CHECK(*shape == *model.shape(name), "checkpoint: ", path, ": \"", name, ".", which, "\" has shape ",
                to_string(*shape), " but the model tensor has ", to_string(*model.shape(name)));
    }
  }
  STP_CHECK(exp_avg.size() == model.size() && exp_avg_sq.size() == model.size(), "checkpoint: ", path,
            " holds optimizer state for tensors the model file lacks");
}

}  // namespace

std::string checkpoint_path(const std::string& output_dir, std::int64_t step) {
  return (fs::path(output_dir) / ("checkpoint-" + std::to_string(step))).string();
}

namespace {

// The temporary folder of a checkpoint being written, and the names it is swapped in under.
struct Folder {
  fs::path final_dir, tmp, old;
};

// A fresh, empty temporary folder for checkpoint-STEP (a stale half-written attempt is removed).
Folder begin_folder(const std::string& output_dir, std::int64_t step) {
  STP_CHECK(step >= 0, "checkpoint: negative step ", step);
  Folder f{checkpoint_path(output_dir, step), fs::path(output_dir) / (".checkpoint-" + std::to_string(step) + ".tmp"),
           fs::path(output_dir) / (".checkpoint-" + std::to_string(step) + ".old")};
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  STP_CHECK(!ec, "checkpoint: cannot create '", output_dir, "': ", ec.message());
  fs::remove_all(f.tmp);
  fs::create_directory(f.tmp);
  return f;
}

// config.json, the extra files and state.json.
void write_small_files(const fs::path& tmp, const CheckpointData& data) {
  if (!data.hf_config.empty()) write_text_file(tmp / "config.json", data.hf_config);
  for (const auto& [name, bytes] : data.files) {
    STP_ASSERT(!name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                   name != kModelFile && name != kOptimizerFile && name != kStateFile && name != "config.json",
               "checkpoint: extra file name '", name, "'");
    write_text_file(tmp / name, bytes);
  }
  write_text_file(tmp / kStateFile, state_json(data.state));
}

// Swap in: the final name only ever points at a complete folder.
std::string swap_in(const Folder& f, const std::string& output_dir) {
  fsync_path(f.tmp, true);
  fs::remove_all(f.old);
  if (fs::exists(f.final_dir)) fs::rename(f.final_dir, f.old);
  fs::rename(f.tmp, f.final_dir);
  fs::remove_all(f.old);
  fsync_path(output_dir, true);
  return f.final_dir.string();
}

std::string write_checkpoint_files(const std::string& output_dir, const CheckpointData& data) {
  const Folder folder = begin_folder(output_dir, data.state.step);
  std::vector<std::pair<std::string, const HostTensor*>> moments;
  for (const auto& [name, m] : data.optimizer) {
    STP_CHECK(m.exp_avg && m.exp_avg_sq, "checkpoint: optimizer state of \"", name, "\" is null");
    moments.emplace_back(name + ".exp_avg", m.exp_avg);
    moments.emplace_back(name + ".exp_avg_sq", m.exp_avg_sq);
  }
  write_safetensors((folder.tmp / kModelFile).string(), data.model, {{"format", "pt"}});
  write_safetensors((folder.tmp / kOptimizerFile).string(), moments, {{"step", std::to_string(data.optimizer_step)}});
  write_small_files(folder.tmp, data);
  return swap_in(folder, output_dir);
}

// Filesystem errors of writing checkpoint-STEP as stp::Errors.
template <typename F>
auto filesystem_guarded(const std::string& output_dir, std::int64_t step, F f) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    throw Error(str("checkpoint: writing step ", step, " into '", output_dir, "' failed: ", filesystem_reason(e)));
  }
}

}  // namespace

std::string write_checkpoint(const std::string& output_dir, const CheckpointData& data) {
  return filesystem_guarded(output_dir, data.state.step, [&] { return write_checkpoint_files(output_dir, data); });
}

CheckpointWriter::CheckpointWriter(const std::string& output_dir, const CheckpointData& data,
                                   const std::vector<std::pair<std::string, Shape>>& tensors)
    : output_dir_(output_dir), step_(data.state.step) {
  STP_ASSERT(data.model.empty() && data.optimizer.empty(), "checkpoint: CheckpointWriter takes the tensors one by one");
  filesystem_guarded(output_dir, step_, [&] {
    const Folder folder = begin_folder(output_dir, step_);
    tmp_ = folder.tmp.string();  // from here on the destructor removes it
    final_ = folder.final_dir.string();
    std::vector<std::pair<std::string, Shape>> moments;
    for (const auto& [name, shape] : tensors) {
      moments.emplace_back(name + ".exp_avg", shape);
      moments.emplace_back(name + ".exp_avg_sq", shape);
    }
    model_ = std::make_unique<SafetensorsWriter>((folder.tmp / kModelFile).string(), tensors,
                                                 std::map<std::string, std::string>{{"format", "pt"}});
    optimizer_ = std::make_unique<SafetensorsWriter>(
        (folder.tmp / kOptimizerFile).string(), moments,
        std::map<std::string, std::string>{{"step", std::to_string(data.optimizer_step)}});
    write_small_files(folder.tmp, data);
    return 0;
  });
}

CheckpointWriter::~CheckpointWriter() {
  model_.reset();
  optimizer_.reset();
  if (tmp_.empty()) return;  // committed, or never begun
  std::error_code ignore;
  fs::remove_all(tmp_, ignore);
}

void CheckpointWriter::write(CheckpointTensor which, const std::string& name, const float* values, std::size_t count) {
  STP_ASSERT(model_ && optimizer_, "checkpoint: write after commit");
  switch (which) {
    case CheckpointTensor::Model: return model_->write(name, values, count);
    case CheckpointTensor::ExpAvg: return optimizer_->write(name + ".exp_avg", values, count);
    case CheckpointTensor::ExpAvgSq: return optimizer_->write(name + ".exp_avg_sq", values, count);
  }
}

std::string CheckpointWriter::commit() {
  STP_ASSERT(model_ && optimizer_, "checkpoint: committed twice");
  return filesystem_guarded(output_dir_, step_, [&] {
    model_->commit();
    optimizer_->commit();
    model_.reset();
    optimizer_.reset();
    const fs::path old = fs::path(output_dir_) / (".checkpoint-" + std::to_string(step_) + ".old");
    std::string path = swap_in(Folder{final_, tmp_, old}, output_dir_);
    tmp_.clear();
    return path;
  });
}

CheckpointState read_checkpoint_state(const std::string& dir) {
  std::error_code ec;
  STP_CHECK(fs::is_directory(dir, ec), "checkpoint: '", dir, "' is not a folder");
  STP_CHECK(fs::is_regular_file(fs::path(dir) / kStateFile, ec), "checkpoint: '", dir, "' is incomplete: ", kStateFile,
            " is missing");
  return read_state(fs::path(dir) / kStateFile);
}

CheckpointReader::CheckpointReader(const std::string& dir) {
  std::error_code ec;
  STP_CHECK(fs::is_directory(dir, ec), "checkpoint: '", dir, "' is not a folder");
  for (const char* f : {kModelFile, kOptimizerFile, kStateFile})
    STP_CHECK(fs::is_regular_file(fs::path(dir) / f, ec), "checkpoint: '", dir, "' is incomplete: ", f, " is missing");
  state_ = read_state(fs::path(dir) / kStateFile);
  const std::string model_path = (fs::path(dir) / kModelFile).string();
  const std::string opt_path = (fs::path(dir) / kOptimizerFile).string();
  model_file_ = std::make_unique<SafetensorsReader>(model_path);
  strip_all(*model_file_, tensors_[0]);
  optimizer_file_ = std::make_unique<SafetensorsReader>(opt_path);
  auto step = optimizer_file_->metadata().find("step");
  STP_CHECK(step != optimizer_file_->metadata().end() && !step->second.empty() &&
                step->second.find_first_not_of("0123456789") == std::string::npos,
            "checkpoint: ", opt_path, " lacks a numeric \"step\" in its metadata");
  const std::string& digits = step->second;
  const auto read = std::from_chars(digits.data(), digits.data() + digits.size(), optimizer_step_);
  STP_CHECK(read.ec == std::errc(), "checkpoint: ", opt_path, ": the \"step\" of its metadata, ", digits,
            ", is out of range (at most ", INT64_MAX, ")");
  FileTensorSource opt;
  strip_all(*optimizer_file_, opt);
  split_moments(opt, *optimizer_file_, tensors_[0], tensors_[1], tensors_[2], opt_path);
}

CheckpointReader::~CheckpointReader() = default;

Checkpoint read_checkpoint(const std::string& dir) {
  const CheckpointReader reader(dir);
  Checkpoint ck;
  ck.state = reader.state();
  ck.optimizer_step = reader.optimizer_step();
  ck.model = read_all(reader.tensors(CheckpointTensor::Model));
  ck.exp_avg = read_all(reader.tensors(CheckpointTensor::ExpAvg));
  ck.exp_avg_sq = read_all(reader.tensors(CheckpointTensor::ExpAvgSq));
  return ck;
}

std::string find_latest_checkpoint(const std::string& output_dir) {
  std::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return "";
  std::int64_t best = -1;
  std::string best_path;
  for (const auto& e : fs::directory_iterator(output_dir)) {
    const std::string name = e.path().filename().string();
    const std::string digits = name.rfind("checkpoint-", 0) == 0 ? name.substr(11) : "";
    if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!e.is_directory()) continue;
    bool complete = true;
    for (const char* f : {kModelFile, kOptimizerFile, kStateFile})
      complete = complete && fs::is_regular_file(e.path() / f, ec);
    std::int64_t step = std::stoll(digits);
    if (complete && step > best) {
      best = step;
      best_path = e.path().string();
    }
  }
  return best_path;
}

void add_model_tensors(const SafetensorsReader& file, FileTensorSource& out) { strip_all(file, out); }

std::map<std::string, HostTensor> read_model_tensors(const std::string& path) {
  const SafetensorsReader file(path);
  FileTensorSource tensors;
  strip_all(file, tensors);
  return read_all(tensors);
}

}  // namespace stp
