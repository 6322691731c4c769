#include "data/token_file.h"

#include <cstring>

#include "base/error.h"
#include "data/token_writer.h"

namespace stp {
namespace {

constexpr char kTok32Magic[8] = {'S', 'T', 'P', 'T', 'O', 'K', '3', '2'};

template <class T>
T get(std::string_view bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof v);
  return v;
}

}  // namespace

std::string write_token_file(const std::string& path, const std::vector<std::int32_t>& ids, std::int32_t vocab_size) {
  STP_ASSERT(vocab_size > 0, "write_token_file: vocab_size ", vocab_size);
  TokenWriter::Options o;
  o.path = path;
  o.vocab_size = vocab_size;
  TokenWriter w(o);
  w.append(ids);
  return w.finish().format;
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
