// Named f32 tensors that are read one at a time: a safetensors file, an HF model folder
// (formats/hf_folder.h), one state of a checkpoint (formats/checkpoint.h), or a map in memory.
// shape() tells what is there without reading any value; read() reads one tensor whole, so a
// caller that takes the tensors in turn holds one at a time.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "formats/safetensors_reader.h"

namespace stp {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const Shape* shape(const std::string& name) const = 0;  // nullptr: no such tensor
  virtual HostTensor read(const std::string& name) const = 0;     // a name shape() knows
  virtual std::vector<std::string> names() const = 0;             // sorted
};

// The tensors of a map already in memory (read() copies one).
class TensorMapSource : public TensorSource {
 public:
  explicit TensorMapSource(const std::map<std::string, HostTensor>& tensors) : tensors_(tensors) {}
  const Shape* shape(const std::string& name) const override;
  HostTensor read(const std::string& name) const override;
  std::vector<std::string> names() const override;

 private:
  const std::map<std::string, HostTensor>& tensors_;
};

// Tensors of open safetensors files under names of the caller's choosing (a prefix dropped, a
// suffix split off). The readers must outlive the source.
class FileTensorSource : public TensorSource {
 public:
  // False (and nothing added) when `name` is already taken.
  bool add(const std::string& name, const SafetensorsReader& file, const SafetensorsEntry& entry);
  const Shape* shape(const std::string& name) const override;
  HostTensor read(const std::string& name) const override;
  std::vector<std::string> names() const override;
  std::size_t size() const { return tensors_.size(); }

 private:
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors_;
};

// Every tensor of `source`, read in turn.
std::map<std::string, HostTensor> read_all(const TensorSource& source);

}  // namespace stp
