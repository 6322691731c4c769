// The loss mask of token data (data.mask_path, data.val_mask_path): which targets count in the
// loss. `stp tokenize` writes it next to the tokens for fine-tuning data (a prompt's tokens are
// not trained on); the trainer reads it through TokenDataset (data/data.h).
//
// File format ("stp loss mask"), little-endian:
//   bytes  0..7   magic "STPMASK1"
//   bytes  8..11  uint32 version = 1
//   bytes 12..15  uint32 reserved, 0
//   bytes 16..23  uint64 N: the token count of the paired token file
//   bytes 24..31  uint64 reserved, 0
//   bytes 32..    N bytes, byte j for token j of the paired token file: 1 = token j counts as a
//                 target (the loss of predicting it from the tokens before it is counted), 0 =
//                 it does not.
// A sequence at offset o reads tokens o..o+T (inputs o..o+T-1, targets o+1..o+T); its target
// position t counts iff byte o+t+1 is 1.
//
// Pairing: the mask path has the shape of the token path (data/shard_paths.h): one file for one
// token file; a folder (its *.mask files) or a glob of masks for shards, paired one to one in name
// order, mask k holding the N of token shard k (`stp tokenize` names the mask of X `X.mask`, so
// the name orders agree). The masks are one stream of bytes indexed like the tokens.
//
// The files are memory-mapped (data/mapped_tokens.h), not read whole: resident memory stays
// independent of their size. The constructor checks every byte once, in parallel. Errors
// (stp::Error, naming the mask file and its token file): a path that is not a regular file, a
// folder or glob with no mask, a number of masks other than the number of token shards, a file
// shorter than the header, another magic or version, a nonzero reserved field, N other than its
// token file's count, a size other than 32 + N, a byte other than 0 or 1 (naming its offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/mapped_tokens.h"

namespace stp {

class LossMask {
 public:
  // Maps the masks `path` names (`key`: the config key, for messages), paired with `tokens`'s shards.
  LossMask(const std::string& path, const MappedTokens& tokens, const std::string& key);

  std::uint64_t size() const { return bytes_.count(); }  // N, as the tokens
  // out[k] = 1 when token j + k counts, else 0, for k < n (j + n <= N); releases the pages read.
  void read(std::uint64_t j, std::size_t n, std::uint32_t* out) const { bytes_.read(j, n, out); }

 private:
  MappedTokens bytes_;
};

}  // namespace stp
