// A safetensors file (formats/safetensors.h) read one tensor at a time, so that the reader never
// holds more than the tensor it returns:
//
//   SafetensorsReader r("m.safetensors");          // the header, checked; nothing else is read
//   const SafetensorsEntry* e = r.find("a");       // name, dtype, shape, byte range
//   HostTensor a = r.read(*e);                     // that tensor's bytes, as f32
//
// The constructor opens the file, reads its header and checks it exactly as read_safetensors_file
// does (the same stp::Errors for a missing, short, truncated or hostile file), so every tensor it
// lists lies inside the file. read() takes the tensor's bytes with a positioned read into the f32
// buffer it returns and converts BF16 and F16 in place: no buffer of the file's bytes besides it.
// The file stays open for the reader's life; reads of different tensors may run concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace stp {

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& tensors() const { return header_.tensors; }  // sorted by begin
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const SafetensorsEntry* find(const std::string& name) const;  // nullptr: not in the file
  HostTensor read(const SafetensorsEntry& e) const;             // e: one of tensors()

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t> index_;  // name -> position in header_.tensors
};

}  // namespace stp
