// safetensors I/O on the host (https://huggingface.co/docs/safetensors, the format as bytes):
//
//   [8 bytes]  N, little-endian uint64: the header length
//   [N bytes]  JSON: {"NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//                     ..., "__metadata__": {"key": "value", ...}}   (may be padded with spaces)
//   [rest]     the data section; offsets are relative to its start, [begin, end) per tensor
//
// Reading accepts F32, BF16 and F16 and converts everything to f32 (HostTensor). Writing
// produces F32 only, tensors in the given order, header padded to a multiple of 8 bytes, and is
// atomic: the file is written as PATH.tmp and renamed over PATH, so readers never see half a file.
//
// Every malformed input is an stp::Error naming the file and the problem, never a crash: a
// header longer than the file, bad JSON, an unknown dtype, a shape that is not a list of
// non-negative integers, offsets out of the data section, overlapping offsets, or a byte range
// that does not match dtype x shape.
//
// Example:
//   HostTensor w{{2, 3}, {1, 2, 3, 4, 5, 6}};
//   write_safetensors("w.safetensors", {{"wte.weight", &w}}, {{"step", "10"}});
//   auto tensors = read_safetensors("w.safetensors");   // tensors["wte.weight"].shape == {2, 3}
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace stp {

// A tensor in host memory, f32, row-major (contiguous).
struct HostTensor {
  Shape shape;
  std::vector<float> data;  // numel(shape) values
};

struct SafetensorsFile {
  std::map<std::string, HostTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)
};

// Reads every tensor (F32, BF16, F16 -> f32) and the metadata of `path`.
SafetensorsFile read_safetensors_file(const std::string& path);

// Reads every tensor of `path` (F32, BF16, F16 -> f32).
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// Writes `tensors` as F32 in the given order, atomically (PATH.tmp + rename). Names must be
// unique and non-empty; each tensor's data size must equal numel(shape).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Conversions used by the reader (exposed for tests and for callers holding raw halves).
float bf16_to_f32(std::uint16_t bits);
float f16_to_f32(std::uint16_t bits);

}  // namespace stp
