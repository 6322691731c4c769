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
// Every malformed or hostile input is an stp::Error naming the file and the problem, never a
// crash, an over-read or a runaway allocation: a header length past the file end or above 100 MiB,
// bad JSON, a value of the wrong JSON type, a duplicate tensor name, an unknown dtype, a shape or
// offset that is not a non-negative integer (-1, 1.5 and 1e3 are all rejected), a shape whose
// element count or byte size overflows, offsets past the end of the data section, overlapping
// tensors, or a byte range that does not match dtype x shape. The header is parsed and checked
// against the file size before anything is allocated for the tensors.
//
// Example:
//   HostTensor w{{2, 3}, {1, 2, 3, 4, 5, 6}};
//   write_safetensors("w.safetensors", {{"wte.weight", &w}}, {{"step", "10"}});
//   auto tensors = read_safetensors("w.safetensors");   // tensors["wte.weight"].shape == {2, 3}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
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

// One tensor as a header describes it: [begin, end) is its byte range in the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16" or "F16"
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // sorted by begin
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses and checks the JSON header of a file whose data section holds `data_bytes` bytes: on
// success every tensor lies inside the data section, matches dtype x shape and overlaps no other.
// Errors name `path`.
SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t data_bytes, const std::string& path);

// Reads every tensor (F32, BF16, F16 -> f32) and the metadata of `path`.
SafetensorsFile read_safetensors_file(const std::string& path);

// Reads every tensor of `path` (F32, BF16, F16 -> f32).
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// Writes `tensors` as F32 in the given order, atomically (PATH.tmp + rename). Names must be
// unique and non-empty; each tensor's data size must equal numel(shape).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The header text (JSON, padded with spaces so that the data section starts at a multiple of 8)
// that write_safetensors writes for F32 tensors of these names and shapes in this order, each at
// the offset where the previous one ends. Errors (an empty, reserved or duplicate name, a negative
// dimension, a name that is not UTF-8) name `path`.
std::string safetensors_header(const std::vector<std::pair<std::string, Shape>>& tensors,
                               const std::map<std::string, std::string>& metadata, const std::string& path);

// Conversions used by the reader (exposed for tests and for callers holding raw halves).
float bf16_to_f32(std::uint16_t bits);
float f16_to_f32(std::uint16_t bits);

}  // namespace stp
