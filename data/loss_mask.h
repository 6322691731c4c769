// The loss mask of a token file (data.mask_path, data.val_mask_path): which targets count in the
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
// The file is memory-mapped, not read whole: resident memory stays independent of its size. The
// constructor checks every byte once. Errors (stp::Error, naming the mask file and the token
// file): a path that is not a regular file, a file shorter than the header, another magic or
// version, a nonzero reserved field, N other than the token file's count, a size other than
// 32 + N, a byte other than 0 or 1 (naming its offset in the file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stp {

class LossMask {
 public:
  // Maps `path`, the mask of `tokens_path`, which holds num_tokens tokens.
  LossMask(const std::string& path, const std::string& tokens_path, std::uint64_t num_tokens);
  ~LossMask();
  LossMask(const LossMask&) = delete;
  LossMask& operator=(const LossMask&) = delete;

  std::uint64_t size() const { return n_; }  // N
  // Whether token j counts as a target; j < N.
  bool counts(std::uint64_t j) const { return bits_[j] != 0; }

 private:
  void check(const std::string& which);  // the header and every byte of the mapped file

  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const unsigned char* bits_ = nullptr;  // the N bytes after the header
  std::uint64_t n_ = 0;
};

}  // namespace stp
