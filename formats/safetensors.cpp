// safetensors reader/writer. The header goes through base/json.h; a garbled file is an error
// message, never a crash or a runaway allocation: the header length and every tensor's byte
// range are checked against the file size *before* anything is allocated for them.
#include "formats/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/error.h"
#include "base/json.h"

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace stp {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

// ---- Writing the JSON header ----------------------------------------------------------------

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// ---- Header entries --------------------------------------------------------------------------

enum class FileDType { F32, BF16, F16 };

struct Entry {
  std::string name;
  FileDType dtype;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

std::size_t file_dtype_size(FileDType d) { return d == FileDType::F32 ? 4 : 2; }

// A JSON number that must be a non-negative integer (exact in a double up to 2^53).
std::uint64_t as_u64(const Json& v, const std::string& where, const char* what) {
  bool ok = v.is_number() && v.as_number() >= 0 && v.as_number() < 9.007199254740992e15 &&
            std::trunc(v.as_number()) == v.as_number();
  STP_CHECK(ok, where, ": ", what, " must be a non-negative integer below 2^53");
  return static_cast<std::uint64_t>(v.as_number());
}

const Json* member(const Json& obj, const char* key) { return obj.contains(key) ? &obj[key] : nullptr; }

Entry parse_entry(const std::string& path, const std::string& name, const Json& v) {
  std::string where = str(path, ": tensor \"", name, "\"");
  STP_CHECK(v.is_object(), where, ": header entry is not an object");
  const Json* dtype = member(v, "dtype");
  const Json* shape = member(v, "shape");
  const Json* offs = member(v, "data_offsets");
  STP_CHECK(dtype && shape && offs, where, ": header entry needs dtype, shape and data_offsets");
  STP_CHECK(dtype->is_string(), where, ": dtype is not a string");
  Entry e;
  e.name = name;
  if (dtype->as_string() == "F32") e.dtype = FileDType::F32;
  else if (dtype->as_string() == "BF16") e.dtype = FileDType::BF16;
  else if (dtype->as_string() == "F16") e.dtype = FileDType::F16;
  else throw Error(str(where, ": unsupported dtype \"", dtype->as_string(), "\" (supported: F32, BF16, F16)"));
  STP_CHECK(shape->is_array(), where, ": shape is not a list");
  std::uint64_t count = 1;
  for (const auto& d : shape->as_array()) {
    std::uint64_t x = as_u64(d, where, "shape dimension");
    STP_CHECK(x <= (1ull << 62) && !__builtin_mul_overflow(count, x, &count), where, ": shape is too large");
    e.shape.push_back(static_cast<std::int64_t>(x));
  }
  STP_CHECK(offs->is_array() && offs->as_array().size() == 2, where,
            ": data_offsets must be [begin, end]");
  e.begin = as_u64((*offs)[0], where, "data_offsets begin");
  e.end = as_u64((*offs)[1], where, "data_offsets end");
  STP_CHECK(e.begin <= e.end, where, ": data_offsets [", e.begin, ", ", e.end, "] are reversed");
  std::uint64_t expected = 0;
  STP_CHECK(!__builtin_mul_overflow(count, file_dtype_size(e.dtype), &expected) && e.end - e.begin == expected,
            where, ": data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin, " bytes but ",
            dtype->as_string(), " x ", to_string(e.shape), " needs ", expected);
  return e;
}

// Checks every range lies in the data section and no two overlap.
void check_ranges(const std::string& path, std::vector<Entry>& entries, std::uint64_t data_bytes) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Entry* furthest = nullptr;  // the non-empty range seen so far that ends last
  for (const Entry& e : entries) {
    STP_CHECK(e.end <= data_bytes, path, ": tensor \"", e.name, "\" data_offsets [", e.begin, ", ", e.end,
              "] exceed the data section (", data_bytes, " bytes): the file is truncated or corrupt");
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    if (furthest && e.begin < furthest->end)
      throw Error(str(path, ": tensors \"", furthest->name, "\" and \"", e.name, "\" overlap in the data section"));
    if (!furthest || e.end > furthest->end) furthest = &e;
  }
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

void read_exact(std::FILE* f, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  if (bytes == 0) return;
  STP_CHECK(std::fseek(f, static_cast<long>(offset), SEEK_SET) == 0 && std::fread(dst, 1, bytes, f) == bytes,
            path, ": cannot read ", bytes, " bytes at offset ", offset, " (truncated file?)");
}

HostTensor load_entry(std::FILE* f, const Entry& e, std::uint64_t data_start, const std::string& path) {
  HostTensor t;
  t.shape = e.shape;
  std::size_t n = static_cast<std::size_t>(numel(e.shape));
  t.data.resize(n);
  if (e.dtype == FileDType::F32) {
    read_exact(f, t.data.data(), n * 4, data_start + e.begin, path);
    return t;
  }
  std::vector<std::uint16_t> half(n);
  read_exact(f, half.data(), n * 2, data_start + e.begin, path);
  for (std::size_t i = 0; i < n; ++i) t.data[i] = e.dtype == FileDType::BF16 ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
  return t;
}

// Splits the parsed header into tensor entries and metadata.
std::vector<Entry> parse_header(const std::string& path, const Json& root, std::map<std::string, std::string>& meta) {
  STP_CHECK(root.is_object(), path, ": the JSON header is not an object");
  std::vector<Entry> entries;
  for (const auto& [name, v] : root.as_object()) {
    if (name != "__metadata__") {
      entries.push_back(parse_entry(path, name, v));
      continue;
    }
    STP_CHECK(v.is_object() || v.is_null(), path, ": __metadata__ is not an object");
    if (v.is_null()) continue;
    for (const auto& [k, mv] : v.as_object()) {
      STP_CHECK(mv.is_string(), path, ": __metadata__ value of \"", k, "\" is not a string");
      meta[k] = mv.as_string();
    }
  }
  return entries;
}

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

SafetensorsFile read_safetensors_file(const std::string& path) {
  std::error_code ec;
  std::uint64_t file_bytes = std::filesystem::file_size(path, ec);
  STP_CHECK(!ec, path, ": cannot open safetensors file: ", ec.message());
  FilePtr f(std::fopen(path.c_str(), "rb"));
  STP_CHECK(f, path, ": cannot open safetensors file: ", std::strerror(errno));
  STP_CHECK(file_bytes >= 8, path, ": not a safetensors file (", file_bytes, " bytes, shorter than the 8-byte header length)");
  std::uint64_t header_bytes = 0;
  read_exact(f.get(), &header_bytes, 8, 0, path);
  STP_CHECK(header_bytes <= file_bytes - 8, path, ": header length ", header_bytes, " exceeds the file size ",
            file_bytes, " (truncated or not a safetensors file)");
  STP_CHECK(header_bytes <= kMaxHeaderBytes, path, ": header length ", header_bytes, " exceeds the limit ", kMaxHeaderBytes);
  std::string header(static_cast<std::size_t>(header_bytes), '\0');
  read_exact(f.get(), header.data(), header.size(), 8, path);

  SafetensorsFile out;
  Json root;
  try {
    root = Json::parse(header);
  } catch (const Error& e) {
    throw Error(str(path, ": bad safetensors header: ", e.what()));
  }
  std::vector<Entry> entries = parse_header(path, root, out.metadata);
  std::uint64_t data_start = 8 + header_bytes;
  check_ranges(path, entries, file_bytes - data_start);
  for (const Entry& e : entries) out.tensors.emplace(e.name, load_entry(f.get(), e, data_start, path));
  return out;
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  return read_safetensors_file(path).tensors;
}

namespace {

std::string build_header(const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                         const std::map<std::string, std::string>& metadata, const std::string& path) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      h += (first ? "" : ",") + json_escape(k) + ":" + json_escape(v);
      first = false;
    }
    h += "}";
  }
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    STP_CHECK(!name.empty() && name != "__metadata__", path, ": invalid tensor name \"", name, "\"");
    STP_CHECK(t != nullptr, path, ": tensor \"", name, "\" is null");
    for (auto d : t->shape) STP_CHECK(d >= 0, path, ": tensor \"", name, "\" has negative shape ", to_string(t->shape));
    STP_CHECK(static_cast<std::int64_t>(t->data.size()) == numel(t->shape), path, ": tensor \"", name, "\" has ",
              t->data.size(), " values but shape ", to_string(t->shape));
    for (std::size_t j = 0; j < i; ++j)
      STP_CHECK(tensors[j].first != name, path, ": duplicate tensor name \"", name, "\"");
    std::uint64_t end = offset + t->data.size() * 4;
    h += (h.size() > 1 ? "," : "") + json_escape(name) + ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t d = 0; d < t->shape.size(); ++d) h += (d ? "," : "") + std::to_string(t->shape[d]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  h += "}";
  while ((8 + h.size()) % 8 != 0) h += ' ';  // align the data section to 8 bytes
  return h;
}

void write_all(std::FILE* f, const void* data, std::size_t bytes, const std::string& path) {
  if (bytes == 0) return;
  STP_CHECK(std::fwrite(data, 1, bytes, f) == bytes, path, ": write failed: ", std::strerror(errno));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = build_header(tensors, metadata, path);
  std::string tmp = path + ".tmp";
  try {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    STP_CHECK(f, tmp, ": cannot create file: ", std::strerror(errno));
    std::uint64_t n = header.size();
    write_all(f.get(), &n, 8, tmp);
    write_all(f.get(), header.data(), header.size(), tmp);
    for (const auto& [name, t] : tensors) write_all(f.get(), t->data.data(), t->data.size() * 4, tmp);
    STP_CHECK(std::fflush(f.get()) == 0 && ::fsync(fileno(f.get())) == 0, tmp, ": flush failed: ", std::strerror(errno));
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
