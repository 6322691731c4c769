// The tensors of a model source: a single .safetensors file, or a Hugging Face model folder.
//
// A folder holds either
//   model.safetensors.index.json   {"metadata": {...}, "weight_map": {"TENSOR": "SHARD", ...}}
//                                  and every SHARD it names (plain file names in the folder), or
//   model.safetensors              every tensor in one file.
// The index wins when both exist. Every tensor of the weight map must be in the shard it names,
// and no tensor may appear in two shards. Each shard goes through the hardened safetensors
// reader (formats/safetensors.h): F32, BF16 and F16, converted to f32 exactly.
//
// Names with a "transformer." prefix are stripped as read_model_tensors() does. Errors
// (stp::Error) name the folder, the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "formats/tensor_source.h"

namespace stp {

constexpr const char* kHfIndexFile = "model.safetensors.index.json";
constexpr const char* kHfModelFile = "model.safetensors";
constexpr const char* kHfConfigFile = "config.json";

// True when `path` is a folder (an HF model folder or a checkpoint).
bool is_model_folder(const std::string& path);

// The tensors of `path` (a .safetensors file or a folder as above), read one at a time: the
// constructor opens every file and checks every header, the weight map and the names (the errors
// read_model_source gives), reading no value; read() then reads one tensor (prefix stripped).
class ModelSource : public TensorSource {
 public:
  explicit ModelSource(const std::string& path);
  const Shape* shape(const std::string& name) const override { return tensors_.shape(name); }
  HostTensor read(const std::string& name) const override { return tensors_.read(name); }
  std::vector<std::string> names() const override { return tensors_.names(); }

 private:
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  FileTensorSource tensors_;
};

// Every tensor of `path` (a .safetensors file or a folder as above).
std::map<std::string, HostTensor> read_model_source(const std::string& path);

}  // namespace stp
