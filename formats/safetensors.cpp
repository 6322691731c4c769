// safetensors reader/writer. The header goes through nlohmann-json; a garbled or hostile file is
// an error message, never a crash or a runaway allocation: the header length and every tensor's
// byte range are checked against the file size *before* anything is allocated for them.
#include "formats/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "base/json_fields.h"
#include "formats/safetensors_reader.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace stp {
namespace {

using nlohmann::json;

// Our headers nest three deep; the limit keeps a header of 100 MiB of "[" from building a
// hundred million nested values.
constexpr int kMaxDepth = 16;

// ---- Header entries --------------------------------------------------------------------------

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

const char* type_name(const json& v) { return v.type_name(); }

// A JSON number that must be a non-negative integer written as one: -1, 1.5 and 1e3 are errors
// (the reference implementation reads them as u64, which takes no sign, fraction or exponent).
std::uint64_t as_u64(const json& v, const std::string& where, const char* what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer())
    throw Error(str(where, ": ", what, " must be a non-negative integer, not ", v.get<std::int64_t>()));
  if (v.is_number_float())
    throw Error(str(where, ": ", what, " must be a non-negative integer, not ", v.dump(),
                    " (a fraction, an exponent or a number above 2^64)"));
  throw Error(str(where, ": ", what, " must be a non-negative integer, not a ", type_name(v)));
}

const json* member(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v) {
  std::string where = str(path, ": tensor ", quoted_text(name));
  STP_CHECK(v.is_object(), where, ": header entry is not an object but a ", type_name(v));
  const json* dtype = member(v, "dtype");
  const json* shape = member(v, "shape");
  const json* offs = member(v, "data_offsets");
  STP_CHECK(dtype && shape && offs, where, ": header entry needs dtype, shape and data_offsets");
  STP_CHECK(dtype->is_string(), where, ": dtype is not a string but a ", type_name(*dtype));
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype->get<std::string>();
  STP_CHECK(dtype_size(e.dtype) != 0, where, ": unsupported dtype ", quoted_text(e.dtype),
            " (supported: F32, BF16, F16)");
  STP_CHECK(shape->is_array(), where, ": shape is not a list but a ", type_name(*shape));
  std::uint64_t count = 1;
  for (const json& d : *shape) {
    std::uint64_t x = as_u64(d, where, "shape dimension");
    STP_CHECK(x <= (1ull << 62) && !__builtin_mul_overflow(count, x, &count), where, ": shape is too large",
              " (its element count overflows 64 bits)");
    e.shape.push_back(static_cast<std::int64_t>(x));
  }
  STP_CHECK(offs->is_array() && offs->size() == 2, where, ": data_offsets must be [begin, end]");
  e.begin = as_u64((*offs)[0], where, "data_offsets begin");
  e.end = as_u64((*offs)[1], where, "data_offsets end");
  STP_CHECK(e.begin <= e.end, where, ": data_offsets [", e.begin, ", ", e.end, "] are reversed");
  std::uint64_t expected = 0;
  STP_CHECK(!__builtin_mul_overflow(count, dtype_size(e.dtype), &expected), where, ": shape is too large",
            " (its byte size overflows 64 bits)");
  STP_CHECK(e.end - e.begin == expected, where, ": data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin,
            " bytes but ", e.dtype, " x ", to_string(e.shape), " needs ", expected);
  return e;
}

// Checks every range lies in the data section and no two overlap.
void check_ranges(const std::string& path, std::vector<SafetensorsEntry>& entries, std::uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const SafetensorsEntry* furthest = nullptr;  // the non-empty range seen so far that ends last
  for (const SafetensorsEntry& e : entries) {
    STP_CHECK(e.end <= data_bytes, path, ": tensor ", quoted_text(e.name), " data_offsets [", e.begin, ", ", e.end,
              "] exceed the data section (", data_bytes, " bytes): the file is truncated or corrupt");
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    if (furthest && e.begin < furthest->end)
      throw Error(str(path, ": tensors ", quoted_text(furthest->name), " and ", quoted_text(e.name),
                      " overlap in the data section"));
    if (!furthest || e.end > furthest->end) furthest = &e;
  }
}

// Parses the header text. A parser callback rejects what nlohmann would accept silently: a
// duplicate key (it keeps the last) and deep nesting.
json parse_json(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object
  auto guard = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        STP_CHECK(depth < kMaxDepth, path, ": bad safetensors header: JSON nested deeper than ", kMaxDepth, " levels");
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end: keys.pop_back(); break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(k).second)
          throw Error(str(path, ": bad safetensors header: ", depth == 1 ? "duplicate tensor name " : "duplicate key ",
                          quoted_text(k)));
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), guard);
  } catch (const json::exception& e) {
    throw Error(str(path, ": bad safetensors header: not valid JSON: ", json_error_text(e)));
  }
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

float bf16_to_f32(std::uint16_t bits) {
  std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float f16_to_f32(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F;
  std::uint32_t mant = h & 0x3FF;
  std::uint32_t u;
  if (exp == 0x1F) {  // inf / nan
    u = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    u = sign;
  } else {  // subnormal: normalize the mantissa
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    u = sign | (std::uint32_t(112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

SafetensorsHeader parse_safetensors_header(std::string_view text, std::uint64_t data_bytes, const std::string& path) {
  json root = parse_json(text, path);
  STP_CHECK(root.is_object(), path, ": the JSON header is not an object but a ", type_name(root));
  SafetensorsHeader out;
  for (const auto& [name, v] : root.items()) {
    if (name != "__metadata__") {
      out.tensors.push_back(parse_entry(path, name, v));
      continue;
    }
    STP_CHECK(v.is_object() || v.is_null(), path, ": __metadata__ is not an object but a ", type_name(v));
    if (v.is_null()) continue;
    for (const auto& [k, mv] : v.items()) {
      STP_CHECK(mv.is_string(), path, ": __metadata__ value of ", quoted_text(k), " is not a string but a ",
                type_name(mv));
      out.metadata[k] = mv.get<std::string>();
    }
  }
  check_ranges(path, out.tensors, data_bytes);
  return out;
}

SafetensorsFile read_safetensors_file(const std::string& path) {
  const SafetensorsReader reader(path);
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (const SafetensorsEntry& e : reader.tensors()) out.tensors.emplace(e.name, reader.read(e));
  return out;
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  return read_safetensors_file(path).tensors;
}

std::string safetensors_header(const std::vector<std::pair<std::string, Shape>>& tensors,
                               const std::map<std::string, std::string>& metadata, const std::string& path) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    STP_CHECK(!name.empty() && name != "__metadata__", path, ": invalid tensor name ", quoted_text(name));
    for (auto d : shape)
      STP_CHECK(d >= 0, path, ": tensor ", quoted_text(name), " has negative shape ", to_string(shape));
    STP_CHECK(!h.contains(name), path, ": duplicate tensor name ", quoted_text(name));
    std::uint64_t end = offset + static_cast<std::uint64_t>(numel(shape)) * 4;
    h[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not UTF-8
    throw Error(str(path, ": cannot write the header: ", json_error_text(e)));
  }
  while ((8 + text.size()) % 8 != 0) text += ' ';  // align the data section to 8 bytes
  return text;
}

namespace {

// The names and shapes of `tensors`, checked in the order the header checks them, with each
// tensor's values: numel(shape) of them.
std::vector<std::pair<std::string, Shape>> shapes_of(
    const std::vector<std::pair<std::string, const HostTensor*>>& tensors, const std::string& path) {
  std::vector<std::pair<std::string, Shape>> out;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    STP_CHECK(!name.empty() && name != "__metadata__", path, ": invalid tensor name ", quoted_text(name));
    STP_CHECK(t != nullptr, path, ": tensor ", quoted_text(name), " is null");
    for (auto d : t->shape)
      STP_CHECK(d >= 0, path, ": tensor ", quoted_text(name), " has negative shape ", to_string(t->shape));
    STP_CHECK(static_cast<std::int64_t>(t->data.size()) == numel(t->shape), path, ": tensor ", quoted_text(name),
              " has ", t->data.size(), " values but shape ", to_string(t->shape));
    STP_CHECK(names.insert(name).second, path, ": duplicate tensor name ", quoted_text(name));
    out.emplace_back(name, t->shape);
  }
  return out;
}

void write_all(std::FILE* f, const void* data, std::size_t bytes, const std::string& path) {
  if (bytes == 0) return;
  STP_CHECK(std::fwrite(data, 1, bytes, f) == bytes, path, ": write failed: ", std::strerror(errno));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = safetensors_header(shapes_of(tensors, path), metadata, path);
  std::string tmp = path + ".tmp";
  try {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    STP_CHECK(f, tmp, ": cannot create file: ", std::strerror(errno));
    std::uint64_t n = header.size();
    write_all(f.get(), &n, 8, tmp);
    write_all(f.get(), header.data(), header.size(), tmp);
    for (const auto& [name, t] : tensors) write_all(f.get(), t->data.data(), t->data.size() * 4, tmp);
    STP_CHECK(std::fflush(f.get()) == 0 && ::fsync(fileno(f.get())) == 0, tmp,
              ": flush failed: ", std::strerror(errno));
    STP_CHECK(std::fclose(f.release()) == 0, tmp, ": close failed: ", std::strerror(errno));
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    STP_CHECK(!ec, "cannot rename ", tmp, " to ", path, ": ", ec.message());
  } catch (...) {
    std::error_code ignore;
    std::filesystem::remove(tmp, ignore);
    throw;
  }
}

}  // namespace stp
