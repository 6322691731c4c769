#include "data/data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "config/config.h"
#include "base/error.h"
#include "base/file_io.h"
#include "data/token_file.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderInts = 256;

std::string read_file(const fs::path& path) { return read_regular_file(path.string(), "data:"); }

// The files of data.path: the file itself, or (text) a folder's regular files sorted by name.
// Anything else (a device, a FIFO) is refused before it is opened: /dev/zero would never end.
std::vector<fs::path> list_files(const DataOptions& o) {
  std::error_code ec;
  STP_CHECK(fs::exists(o.path, ec), "data: data.path '", o.path, "' does not exist");
  if (!fs::is_directory(o.path, ec)) {
    check_regular_file(o.path, "data: data.path");
    return {fs::path(o.path)};
  }
  STP_CHECK(o.format == "text", "data: data.path '", o.path, "' is a folder; only data.format text reads folders (",
            o.format, " needs one file)");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(o.path))
    if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  STP_CHECK(!files.empty(), "data: folder '", o.path, "' holds no regular files");
  return files;
}

std::vector<std::uint32_t> load_text(const std::vector<fs::path>& files) {
  std::vector<std::uint32_t> tokens;
  for (const auto& f : files) {
    std::string bytes = read_file(f);
    for (unsigned char c : bytes) tokens.push_back(c);
  }
  return tokens;
}

std::vector<std::uint32_t> u16_tokens(const std::string& bytes, std::size_t offset) {
  std::vector<std::uint32_t> tokens((bytes.size() - offset) / 2);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::uint16_t t;
    std::memcpy(&t, bytes.data() + offset + 2 * i, 2);  // little-endian host
    tokens[i] = t;
  }
  return tokens;
}

std::vector<std::uint32_t> load_u16(const std::string& path) {
  std::string bytes = read_file(path);
  STP_CHECK(bytes.size() % 2 == 0, "data: '", path, "' has ", bytes.size(),
            " bytes, not a whole number of uint16 tokens (data.format u16)");
  return u16_tokens(bytes, 0);
}

std::vector<std::uint32_t> load_llmc(const std::string& path) {
  std::string bytes = read_file(path);
  const std::size_t header_bytes = kLlmcHeaderInts * 4;
  STP_CHECK(bytes.size() >= header_bytes, "data: '", path, "' has ", bytes.size(),
            " bytes, shorter than the llm.c header (", header_bytes, " bytes)");
  std::int32_t header[kLlmcHeaderInts];
  std::memcpy(header, bytes.data(), header_bytes);
  STP_CHECK(header[0] == kLlmcMagic, "data: '", path, "' is not an llm.c token file: magic ", header[0], ", expected ",
            kLlmcMagic, " (use data.format u16 for raw uint16 files)");
  STP_CHECK(header[1] == 1, "data: '", path, "' has llm.c version ", header[1], ", expected 1");
  STP_CHECK(header[2] >= 0, "data: '", path, "' has a negative token count ", header[2]);
  std::uint64_t expected = header_bytes + 2ull * std::uint64_t(header[2]);
  STP_CHECK(bytes.size() == expected, "data: '", path, "' header says ", header[2], " tokens (", expected,
            " bytes with the header) but the file has ", bytes.size(), " bytes");
  return u16_tokens(bytes, header_bytes);
}

}  // namespace

DataOptions DataOptions::from_config(const Config& cfg) {
  return DataOptions{cfg.data.path,        cfg.data.format, cfg.data.sampling, cfg.model.seq_len,
                     cfg.model.vocab_size, cfg.train.seed,  cfg.data.mask_path};
}

TokenDataset::TokenDataset(const DataOptions& options) : options_(options) {
  const DataOptions& o = options_;
  STP_ASSERT(o.seq_len >= 1 && o.vocab_size >= 1, "data: bad seq_len/vocab_size");
  STP_CHECK(o.format == "text" || o.format == "u16" || o.format == "llmc" || o.format == "tok32",
            "data: unknown data.format '", o.format, "'");
  STP_CHECK(o.sampling == "random" || o.sampling == "sequential", "data: unknown data.sampling '", o.sampling, "'");
  std::vector<fs::path> files = list_files(o);
  if (o.format == "text") tokens_ = load_text(files);
  else if (o.format == "u16") tokens_ = load_u16(o.path);
  else if (o.format == "llmc") tokens_ = load_llmc(o.path);
  else tokens_ = parse_tok32(read_file(o.path), o.path);

  const std::uint64_t need = std::uint64_t(o.seq_len) + 1;
  STP_CHECK(tokens_.size() >= need, "data: '", o.path, "' has ", tokens_.size(),
            " tokens, fewer than model.seq_len + 1 = ", need,
            " needed for one sequence; use more data or a shorter model.seq_len");
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    STP_CHECK(tokens_[i] < std::uint32_t(o.vocab_size), "data: token ", tokens_[i], " at position ", i, " of '", o.path,
              "' is >= model.vocab_size ", o.vocab_size);
  if (!o.mask_path.empty()) mask_ = std::make_unique<LossMask>(o.mask_path, o.path, tokens_.size());
}

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t TokenDataset::sequence_offset(std::uint64_t b) const {
  const std::uint64_t span = tokens_.size() - std::uint64_t(options_.seq_len);  // N - T >= 1
  if (options_.sampling == "random") return splitmix64(splitmix64(options_.seed) ^ b) % span;
  __extension__ typedef unsigned __int128 u128;  // b * T must not wrap before the modulo
  return static_cast<std::uint64_t>((u128(b) * u128(options_.seq_len)) % span);
}

void TokenDataset::fill_batch(std::uint64_t b0, int rows, std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t T = static_cast<std::size_t>(options_.seq_len);
  for (int r = 0; r < rows; ++r) {
    const std::uint64_t offset = sequence_offset(b0 + std::uint64_t(r));
    const std::uint32_t* src = tokens_.data() + offset;
    std::int32_t* in = inputs + std::size_t(r) * T;
    std::int32_t* tg = targets + std::size_t(r) * T;
    for (std::size_t t = 0; t < T; ++t) {
      in[t] = static_cast<std::int32_t>(src[t]);
      tg[t] = static_cast<std::int32_t>(src[t + 1]);
    }
    if (mask_)
      for (std::size_t t = 0; t < T; ++t)
        if (!mask_->counts(offset + t + 1)) tg[t] = -1;
  }
}

std::uint64_t TokenDataset::counted_targets(std::uint64_t b0, std::uint64_t rows) const {
  const std::uint64_t T = static_cast<std::uint64_t>(options_.seq_len);
  if (!mask_) return rows * T;
  std::uint64_t n = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t offset = sequence_offset(b0 + r);
    for (std::uint64_t t = 1; t <= T; ++t) n += mask_->counts(offset + t) ? 1 : 0;
  }
  return n;
}

std::uint64_t sequence_index(std::int64_t step, int replica, int microbatch, int dp, int microbatches,
                             int micro_batch_size) {
  STP_ASSERT(step >= 1 && replica >= 0 && replica < dp && microbatch >= 0 && microbatch < microbatches,
             "sequence_index: step ", step, " replica ", replica, "/", dp, " microbatch ", microbatch, "/",
             microbatches);
  const std::uint64_t per_replica = std::uint64_t(microbatches) * std::uint64_t(micro_batch_size);
  return (std::uint64_t(step - 1) * std::uint64_t(dp) + std::uint64_t(replica)) * per_replica +
         std::uint64_t(microbatch) * std::uint64_t(micro_batch_size);
}

}  // namespace stp
