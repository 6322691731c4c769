#include "data/data.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "base/error.h"
#include "config/config.h"
#include "data/shard_paths.h"
#include "data/token_formats.h"
#include "data/window_shuffle.h"

namespace stp {
namespace {

MappedTokens map_tokens(const DataOptions& o) {
  STP_CHECK(o.format == "text" || o.format == "u16" || o.format == "llmc" || o.format == "tok32",
            "data: unknown data.format '", o.format, "'");
  // A folder of binary shards may hold their loss masks too (X.bin.mask beside X.bin).
  std::function<bool(const std::string&)> keep;
  if (o.format != "text") keep = [](const std::string& name) { return !name.ends_with(".mask"); };
  const std::vector<std::string> files = shard_paths(
      o.path, "data: data.path",
      str("regular files to read as data.format ", o.format, o.format == "text" ? "" : " (besides *.mask)"), keep);
  return MappedTokens(files, token_format(o.format), "data: data.path");
}

}  // namespace

DataOptions DataOptions::from_config(const Config& cfg) {
  return DataOptions{cfg.data.path,        cfg.data.format, cfg.data.sampling, cfg.model.seq_len,
                     cfg.model.vocab_size, cfg.train.seed,  cfg.data.mask_path};
}

TokenDataset::TokenDataset(const DataOptions& options) : options_(options), tokens_(map_tokens(options_)) {
  const DataOptions& o = options_;
  STP_ASSERT(o.seq_len >= 1 && o.vocab_size >= 1, "data: bad seq_len/vocab_size");
  STP_CHECK(o.sampling == "random" || o.sampling == "sequential" || o.sampling == "shuffle",
            "data: unknown data.sampling '", o.sampling, "'");

  const std::uint64_t need = std::uint64_t(o.seq_len) + 1;
  STP_CHECK(num_tokens() >= need, "data: '", o.path, "' has ", num_tokens(),
            " tokens, fewer than model.seq_len + 1 = ", need,
            " needed for one sequence; use more data or a shorter model.seq_len");
  // One pass for both bounds: the model's vocabulary and a tok32 header's; the first token over
  // the lower one is the error.
  const std::uint64_t header = tokens_.bound();
  const std::uint64_t vocab = std::uint64_t(o.vocab_size);
  if (const auto i = tokens_.find_at_least(header != 0 ? std::min(header, vocab) : vocab)) {
    const std::size_t k = tokens_.shard_of(*i);
    const std::uint64_t at = *i - tokens_.shard_begin(k);
    const std::uint32_t t = token(*i);
    STP_CHECK(header == 0 || t < header, "data: '", tokens_.file(k), "': token ", t, " at position ", at,
              " is >= the vocab_size ", header, " of its tok32 header");
    throw Error(str("data: token ", t, " at position ", at, " of '", tokens_.file(k), "' is >= model.vocab_size ",
                    o.vocab_size));
  }
  if (o.sampling == "random") tokens_.advise_random();
  if (!o.mask_path.empty()) mask_ = std::make_unique<LossMask>(o.mask_path, tokens_, "data.mask_path");
}

std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t TokenDataset::windows() const { return shuffle_windows(num_tokens(), std::uint64_t(options_.seq_len)); }

std::uint64_t TokenDataset::sequence_offset(std::uint64_t b) const {
  const std::uint64_t span = num_tokens() - std::uint64_t(options_.seq_len);  // N - T >= 1
  if (options_.sampling == "random") return splitmix64(splitmix64(options_.seed) ^ b) % span;
  if (options_.sampling == "shuffle")
    return shuffle_window(options_.seed, b, windows()) * std::uint64_t(options_.seq_len);
  __extension__ typedef unsigned __int128 u128;  // b * T must not wrap before the modulo
  return static_cast<std::uint64_t>((u128(b) * u128(options_.seq_len)) % span);
}

void TokenDataset::fill_batch(std::uint64_t b0, int rows, std::int32_t* inputs, std::int32_t* targets) const {
  const std::size_t T = static_cast<std::size_t>(options_.seq_len);
  std::vector<std::uint32_t> window(T + 1);  // read from the mapping, across shard boundaries
  for (int r = 0; r < rows; ++r) {
    const std::uint64_t offset = sequence_offset(b0 + std::uint64_t(r));
    tokens_.read(offset, T + 1, window.data());
    const std::uint32_t* src = window.data();
    std::int32_t* in = inputs + std::size_t(r) * T;
    std::int32_t* tg = targets + std::size_t(r) * T;
    for (std::size_t t = 0; t < T; ++t) {
      in[t] = static_cast<std::int32_t>(src[t]);
      tg[t] = static_cast<std::int32_t>(src[t + 1]);
    }
    if (mask_) {
      mask_->read(offset + 1, T, window.data());  // the targets' mask bytes
      for (std::size_t t = 0; t < T; ++t)
        if (window[t] == 0) tg[t] = -1;
    }
  }
}

std::uint64_t TokenDataset::counted_targets(std::uint64_t b0, std::uint64_t rows) const {
  const std::uint64_t T = static_cast<std::uint64_t>(options_.seq_len);
  if (!mask_) return rows * T;
  std::vector<std::uint32_t> bytes(T);
  std::uint64_t n = 0;
  for (std::uint64_t r = 0; r < rows; ++r) {
    mask_->read(sequence_offset(b0 + r) + 1, T, bytes.data());
    for (std::uint32_t b : bytes) n += b;
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
