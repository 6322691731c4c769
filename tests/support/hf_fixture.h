// Writing small Hugging Face model folders in tests: safetensors shards in BF16 (or F32) built
// byte by byte (independent of formats/safetensors.cpp's writer, which writes F32 only), and an
// index.json naming them.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace stp::testing {

// f32 -> the bf16 bits of its upper half (truncation): the value bf16_to_f32 gives back exactly
// when the f32 already is a bf16 value.
inline std::uint16_t bf16_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

// `v` truncated to bf16, as f32.
inline float bf16_round(float v) { return bf16_to_f32(bf16_bits(v)); }

// One safetensors file holding `tensors` as `dtype` ("BF16" or "F32").
inline void write_raw_safetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors,
                                  const std::string& dtype) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const std::size_t begin = data.size();
    for (float v : t.data) {
      if (dtype == "BF16") {
        std::uint16_t b = bf16_bits(v);
        data.append(reinterpret_cast<const char*>(&b), 2);
      } else {
        data.append(reinterpret_cast<const char*>(&v), 4);
      }
    }
    header[name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::uint64_t n = h.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h << data;
}

// `tensors` split over `shards` files model-0000i-of-0000N.safetensors (round robin by name) in
// `dir`, with model.safetensors.index.json.
inline void write_sharded_folder(const std::string& dir, const std::map<std::string, HostTensor>& tensors, int shards,
                                 const std::string& dtype) {
  std::filesystem::create_directories(dir);
  std::vector<std::map<std::string, HostTensor>> parts(static_cast<std::size_t>(shards));
  nlohmann::json weight_map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, t] : tensors) {
    const int s = i++ % shards;
    parts[static_cast<std::size_t>(s)].emplace(name, t);
    weight_map[name] = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
  }
  for (int s = 0; s < shards; ++s)
    write_raw_safetensors(
        dir + "/model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors",
        parts[static_cast<std::size_t>(s)], dtype);
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {}}, {"weight_map", weight_map}}.dump(2);
}

}  // namespace stp::testing
