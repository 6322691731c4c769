#include "data/token_formats.h"

#include <cstring>

#include "base/error.h"
#include "data/token_file.h"

namespace stp {
namespace {

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

std::int32_t int32_at(std::string_view bytes, std::size_t i) {
  std::int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}

bool starts_tok32(std::string_view bytes) { return bytes.substr(0, 8) == "STPTOK32"; }

// Header and size of an llm.c file: true when they agree.
bool whole_llmc(std::string_view bytes) {
  return bytes.size() >= kLlmcHeaderBytes && int32_at(bytes, 0) == kLlmcMagic && int32_at(bytes, 1) == 1 &&
         int32_at(bytes, 2) >= 0 && bytes.size() == kLlmcHeaderBytes + 2 * std::uint64_t(int32_at(bytes, 2));
}

ShardHeader parse_text(std::string_view bytes, const std::string&) { return {0, bytes.size(), 0}; }

ShardHeader parse_u16(std::string_view bytes, const std::string& path) {
  STP_CHECK(bytes.size() % 2 == 0, "data: '", path, "' has ", bytes.size(),
            " bytes, not a whole number of uint16 tokens (data.format u16)");
  STP_CHECK(!whole_llmc(bytes), "data: '", path,
            "' is an llm.c token file (magic 20240520 and a matching token count), not raw uint16 tokens: use "
            "data.format llmc, with every shard of the data path in that format");
  return {0, bytes.size() / 2, 0};
}

ShardHeader parse_llmc(std::string_view bytes, const std::string& path) {
  STP_CHECK(!starts_tok32(bytes), "data: '", path,
            "' is a tok32 token file, not llmc: use data.format tok32, with every shard of the data path in that "
            "format");
  STP_CHECK(bytes.size() >= kLlmcHeaderBytes, "data: '", path, "' has ", bytes.size(),
            " bytes, shorter than the llm.c header (", kLlmcHeaderBytes, " bytes)");
  const std::int32_t magic = int32_at(bytes, 0), version = int32_at(bytes, 1), count = int32_at(bytes, 2);
  STP_CHECK(magic == kLlmcMagic, "data: '", path, "' is not an llm.c token file: magic ", magic, ", expected ",
            kLlmcMagic, " (use data.format u16 for raw uint16 files)");
  STP_CHECK(version == 1, "data: '", path, "' has llm.c version ", version, ", expected 1");
  STP_CHECK(count >= 0, "data: '", path, "' has a negative token count ", count);
  const std::uint64_t expected = kLlmcHeaderBytes + 2 * std::uint64_t(count);
  STP_CHECK(bytes.size() == expected, "data: '", path, "' header says ", count, " tokens (", expected,
            " bytes with the header) but the file has ", bytes.size(), " bytes",
            bytes.size() < expected ? " (truncated?)" : "");
  return {kLlmcHeaderBytes, std::uint64_t(count), 0};
}

ShardHeader parse_tok32(std::string_view bytes, const std::string& path) {
  STP_CHECK(!(bytes.size() >= 4 && int32_at(bytes, 0) == kLlmcMagic), "data: '", path,
            "' is an llm.c token file (magic 20240520), not tok32: use data.format llmc, with every shard of the "
            "data path in that format");
  const Tok32Header h = parse_tok32_header(bytes, path);
  // A recorded vocab_size of 0 admits no id: as a bound it would read "none recorded".
  STP_CHECK(h.vocab_size > 0 || h.count == 0, "data: '", path, "' records vocab_size 0 in its tok32 header but holds ",
            h.count, " tokens");
  return {kTok32HeaderBytes, h.count, h.vocab_size};
}

}  // namespace

ShardFormat token_format(const std::string& format) {
  if (format == "text") return {"text", 1, parse_text};
  if (format == "u16") return {"u16", 2, parse_u16};
  if (format == "llmc") return {"llmc", 2, parse_llmc};
  STP_CHECK(format == "tok32", "data: unknown data.format '", format, "'");
  return {"tok32", 4, parse_tok32};
}

}  // namespace stp
