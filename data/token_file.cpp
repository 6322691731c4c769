#include "data/token_file.h"

#include <cstring>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {
namespace {

constexpr char kTok32Magic[8] = {'S', 'T', 'P', 'T', 'O', 'K', '3', '2'};

template <class T>
void put(std::string& out, T v) {  // little-endian host
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <class T>
T get(std::string_view bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

}  // namespace

std::string write_token_file(const std::string& path, const std::vector<std::int32_t>& ids, std::int32_t vocab_size) {
  STP_ASSERT(vocab_size > 0, "write_token_file: vocab_size ", vocab_size);
  for (std::size_t i = 0; i < ids.size(); ++i)
    STP_ASSERT(ids[i] >= 0 && ids[i] < vocab_size, "write_token_file: id ", ids[i], " at ", i);
  std::string out;
  std::string format;
  if (vocab_size <= 65536) {
    format = "llmc";
    STP_CHECK(ids.size() <= 0x7fffffffu, "tokenize: ", ids.size(),
              " tokens do not fit an llm.c file (at most 2^31 - 1); split the input");
    std::int32_t header[256] = {};
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<std::int32_t>(ids.size());
    out.append(reinterpret_cast<const char*>(header), sizeof header);
    out.reserve(out.size() + 2 * ids.size());
    for (std::int32_t id : ids) put(out, static_cast<std::uint16_t>(id));
  } else {
    format = "tok32";
    out.append(kTok32Magic, sizeof kTok32Magic);
    put(out, std::uint32_t(1));
    put(out, static_cast<std::uint32_t>(vocab_size));
    put(out, static_cast<std::uint64_t>(ids.size()));
    put(out, std::uint64_t(0));
    out.reserve(out.size() + 4 * ids.size());
    for (std::int32_t id : ids) put(out, static_cast<std::uint32_t>(id));
  }
  write_file_atomic(path, out);
  return format;
}

Tok32Header parse_tok32_header(std::string_view bytes, const std::string& path) {
  STP_CHECK(bytes.size() >= kTok32HeaderBytes, "data: '", path, "' has ", bytes.size(),
            " bytes, shorter than the tok32 header (", kTok32HeaderBytes, " bytes)");
  STP_CHECK(std::memcmp(bytes.data(), kTok32Magic, sizeof kTok32Magic) == 0, "data: '", path,
            "' is not a tok32 token file (its first 8 bytes are not \"STPTOK32\")");
  const auto version = get<std::uint32_t>(bytes, 8);
  STP_CHECK(version == 1, "data: '", path, "' has tok32 version ", version, ", expected 1");
  const auto vocab = get<std::uint32_t>(bytes, 12);
  const auto count = get<std::uint64_t>(bytes, 16);
  STP_CHECK(get<std::uint64_t>(bytes, 24) == 0, "data: '", path, "' has a nonzero reserved tok32 header field");
  const std::uint64_t payload = bytes.size() - kTok32HeaderBytes;
  STP_CHECK(payload % 4 == 0 && count == payload / 4, "data: '", path, "' header says ", count,
            " tokens but the file has ", bytes.size(), " bytes (", kTok32HeaderBytes, " + 4 per token expected)");
  return {vocab, count};
}

}  // namespace stp
