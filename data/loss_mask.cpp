#include "data/loss_mask.h"

#include <cstring>
#include <map>
#include <vector>

#include "base/error.h"
#include "data/shard_paths.h"

namespace stp {
namespace {

constexpr std::size_t kHeaderBytes = 32;

template <typename U>
U read_le(std::string_view bytes, std::size_t offset) {
  U v;
  std::memcpy(&v, bytes.data() + offset, sizeof(U));  // little-endian host
  return v;
}

struct Pair {
  std::string token_file;
  std::uint64_t tokens = 0;
};

std::string which(const std::string& mask, const Pair& p) {
  return str("the loss mask '", mask, "' of the token file '", p.token_file, "'");
}

// The mask format, checking each file against the token shard it is paired with.
ShardFormat mask_format(const std::map<std::string, Pair>& pairs) {
  auto parse = [&pairs](std::string_view bytes, const std::string& path) {
    const Pair& p = pairs.at(path);
    const std::string w = which(path, p);
    STP_CHECK(bytes.size() >= kHeaderBytes, "data: ", w, " has ", bytes.size(), " bytes, shorter than the ",
              kHeaderBytes, "-byte header; make the mask with stp tokenize");
    STP_CHECK(bytes.substr(0, 8) == "STPMASK1", "data: ", w,
              " is not a loss mask: its first 8 bytes are not \"STPMASK1\" (data.mask_path takes the .mask file stp "
              "tokenize writes)");
    const auto version = read_le<std::uint32_t>(bytes, 8);
    STP_CHECK(version == 1, "data: ", w, " has version ", version, "; this stp reads version 1");
    STP_CHECK(read_le<std::uint32_t>(bytes, 12) == 0 && read_le<std::uint64_t>(bytes, 24) == 0, "data: ", w,
              " has nonzero reserved header fields (bytes 12..15, 24..31)");
    const auto n = read_le<std::uint64_t>(bytes, 16);
    STP_CHECK(n == p.tokens, "data: ", w, " is for ", n, " tokens, but the token file holds ", p.tokens,
              "; make the mask with its token file");
    STP_CHECK(bytes.size() - kHeaderBytes == n, "data: ", w, " has ", bytes.size(), " bytes, but a mask of ", n,
              " tokens has 32 + ", n, " = ", kHeaderBytes + n, " (a truncated or padded file)");
    return ShardHeader{kHeaderBytes, n, 0};
  };
  return ShardFormat{"loss mask", 1, parse};
}

MappedTokens map_masks(const std::string& path, const MappedTokens& tokens, const std::string& key) {
  const std::vector<std::string> files = shard_paths(path, str("data: ", key), "loss masks (*.mask)",
                                                     [](const std::string& name) { return name.ends_with(".mask"); });
  STP_CHECK(files.size() == tokens.shards(), "data: ", key, " '", path, "' names ", files.size(),
            " loss mask file(s) but the token data has ", tokens.shards(), " shard(s) (first '", tokens.file(0),
            "'): give one mask per token file, paired in name order (stp tokenize writes X.mask beside X)");
  std::map<std::string, Pair> pairs;
  for (std::size_t k = 0; k < files.size(); ++k) {
    const bool fresh = pairs.emplace(files[k], Pair{tokens.file(k), tokens.shard_count(k)}).second;
    STP_CHECK(fresh, "data: ", key, " names the loss mask '", files[k], "' twice");
  }
  return MappedTokens(files, mask_format(pairs), str("data: ", key));
}

}  // namespace

LossMask::LossMask(const std::string& path, const MappedTokens& tokens, const std::string& key)
    : bytes_(map_masks(path, tokens, key)) {
  if (const auto j = bytes_.find_at_least(2)) {
    const std::size_t k = bytes_.shard_of(*j);
    const std::uint64_t at = *j - bytes_.shard_begin(k);
    throw Error(str("data: ", which(bytes_.file(k), Pair{tokens.file(k), tokens.shard_count(k)}), " has byte ",
                    bytes_.at(*j), " at offset ", kHeaderBytes + at, " (token ", at, "); every mask byte is 0 or 1"));
  }
}

}  // namespace stp
