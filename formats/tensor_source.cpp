#include "formats/tensor_source.h"

#include "base/error.h"

namespace stp {

const Shape* TensorMapSource::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.shape;
}

HostTensor TensorMapSource::read(const std::string& name) const {
  auto it = tensors_.find(name);
  STP_ASSERT(it != tensors_.end(), "TensorMapSource: no tensor '", name, "'");
  return it->second;
}

std::vector<std::string> TensorMapSource::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

bool FileTensorSource::add(const std::string& name, const SafetensorsReader& file, const SafetensorsEntry& entry) {
  return tensors_.emplace(name, std::make_pair(&file, &entry)).second;
}

const Shape* FileTensorSource::shape(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.second->shape;
}

HostTensor FileTensorSource::read(const std::string& name) const {
  auto it = tensors_.find(name);
  STP_ASSERT(it != tensors_.end(), "FileTensorSource: no tensor '", name, "'");
  return it->second.first->read(*it->second.second);
}

std::vector<std::string> FileTensorSource::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

std::map<std::string, HostTensor> read_all(const TensorSource& source) {
  std::map<std::string, HostTensor> out;
  for (const std::string& name : source.names()) out.emplace(name, source.read(name));
  return out;
}

}  // namespace stp
