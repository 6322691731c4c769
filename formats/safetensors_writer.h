// A safetensors file (formats/safetensors.h) written one tensor at a time, so that the writer never
// holds more than the tensor it is given: every tensor's name and shape is known before any value,
// so the header goes first (safetensors_header) and each tensor's values then go straight to
// their offset, in any order.
//
//   SafetensorsWriter w("m.safetensors", {{"b", {2}}, {"a", {3}}}, {{"format", "pt"}});
//   w.write("a", a_values, 3);   // any order, each tensor once
//   w.write("b", b_values, 2);
//   w.commit();                  // m.safetensors now holds both, header order b, a
//
// The file's bytes are those write_safetensors writes for the same tensors in the constructor's
// order, whatever the order of the writes. Like it, the writer is atomic: the bytes go to
// PATH.tmp, and commit() (every tensor written, else an stp::Error naming the first missing one)
// syncs it to the disk and renames it onto PATH. A writer destroyed without a commit (an error,
// or a caller that decided not to keep the file) removes PATH.tmp and leaves PATH as it was.
// I/O errors are stp::Errors naming PATH.tmp and the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace stp {

class SafetensorsWriter {
 public:
  SafetensorsWriter(std::string path, const std::vector<std::pair<std::string, Shape>>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The f32 values of tensor `name`: `count` must be its numel; a name not in the header or one
  // written before is an invariant violation (STP_ASSERT).
  void write(const std::string& name, const float* values, std::size_t count);
  void commit();

 private:
  struct Place {
    std::uint64_t offset = 0;  // in the file
    std::size_t count = 0;     // values
    bool written = false;
  };
  std::string path_, tmp_;
  int fd_ = -1;
  std::map<std::string, Place> places_;
  std::vector<std::string> order_;  // the header's order, for the message naming a missing tensor
};

}  // namespace stp
