// Token data: loading (data.format) and sampling (data.sampling); docs/design.md, Sampling.
//
// Formats (data/token_formats.h):
//   text  every byte is a token (vocab 256).
//   u16   raw little-endian uint16 tokens (the file size must be even).
//   llmc  llm.c token file: a header of 256 int32 (header[0] = 20240520 magic, header[1] = 1
//         version, header[2] = token count), then exactly that many uint16 tokens.
//   tok32 stp's wide token file (ids up to 2^32 - 1): a 32-byte header (magic "STPTOK32",
//         version 1, vocab_size, token count), then uint32 tokens; data/token_file.h. `stp
//         tokenize` writes it when the tokenizer's vocabulary exceeds 65536 ids.
//
// Paths (data/shard_paths.h): data.path is a file, a folder or a glob of shards, in any format:
//   a file          that file (symlinks followed);
//   a folder        its regular files (symlinks and subfolders skipped), sorted by name; for the
//                   binary formats files named *.mask are skipped (loss masks, not tokens);
//   a glob          a path that does not exist and holds `*`, `?` or `[`
//                   (`data/fineweb_train_*.bin`): the matching files, sorted by path.
// The files are concatenated in that order into one stream of N tokens, and a sequence may span
// the boundary between two shards, as it spans two text files of a folder: llm.c's
// `*_train_*.bin` and `*_val_*.bin` shards, each starting with its end-of-text token, work as
// they are (data.path and data.val_path globs).
//
// Reading: the files are mapped read-only (base/mapped_file.h, data/mapped_tokens.h), never read
// into memory whole nor widened, so resident memory does not grow with the data, and the
// processes of a run (MPI) share the page cache of the same files. A token is read from the
// mapping when a batch needs it. Files must not be truncated while a run maps them (a read past
// the new end is a SIGBUS).
//
// Vocabulary check: every token must be < model.vocab_size, and a tok32 file's tokens < the
// vocab_size of its header. One pass over the mappings checks both, in parallel over the cores,
// releasing pages as it goes; it is skipped when the format's width alone bounds the tokens
// (text: bytes; u16, llmc: model.vocab_size >= 65536). A tok32 header's vocab_size is checked,
// not trusted in place of the pass: a file whose ids break it would otherwise hand the model an
// id past its embedding whenever one exceeds model.vocab_size too.
//
// Sampling: number the sequences of a run b = 0, 1, 2, ... in the order step, data-parallel
// replica, microbatch, row (sequence_index()). Sequence b reads the T + 1 tokens at offset
//   sequential:  (b * T) mod (N - T)
//   random:      splitmix64(splitmix64(seed) ^ b) mod (N - T)
//   shuffle:     shuffle_window(seed, b, W) * T, W = floor((N - 1) / T) windows: every window once
//                per epoch of W sequences, in a seeded permutation of its own per epoch
//                (data/window_shuffle.h)
// (N tokens, T = seq_len); inputs are the first T, targets the last T. Every offset is a pure
// function of b (and the seed), so resuming from a checkpoint needs only the step number.
//
// Every file is a regular file (symlinks followed): a device (/dev/zero never ends) or a FIFO (no
// size) is refused by kind before it is opened (base/file_io.h). A file whose size is not a
// whole number of tokens is an error in every format: an odd u16 size, an llm.c or tok32 size
// other than the header's count says (a truncated shard).
//
// Loss mask (data.mask_path; data/loss_mask.h): with a mask, fill_batch writes the target -1
// (ignored: not counted in the loss or its mean) at every target position whose token the mask
// leaves out: target position t of the sequence at offset o counts iff mask byte o + t + 1 is 1.
// Without one every target counts.
//
// Errors (stp::Error), each naming the file: a missing path, not a regular file, a folder with no
// token files, a glob matching nothing, N < T + 1, an odd u16 size, a bad llm.c header (magic,
// version, or a token count that disagrees with the file size), a bad tok32 header
// (data/token_file.h), a shard in another format than data.format (an llm.c file read as u16 or
// tok32, a tok32 file read as llmc), tok32 shards whose headers record different vocab_sizes, a
// token >= vocab_size (naming the token, its position in its file and the vocab_size).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/loss_mask.h"
#include "data/mapped_tokens.h"

namespace stp {

struct Config;

struct DataOptions {
  std::string path;
  std::string format = "text";      // text | u16 | llmc | tok32
  std::string sampling = "random";  // random | sequential | shuffle
  int seq_len = 128;                // T
  int vocab_size = 256;
  std::uint64_t seed = 0;
  std::string mask_path = {};  // "" = none: every target counts (data/loss_mask.h)

  static DataOptions from_config(const Config& cfg);
};

class TokenDataset {
 public:
  explicit TokenDataset(const DataOptions& options);  // maps the files and checks every token

  std::uint64_t num_tokens() const { return tokens_.count(); }  // N
  const DataOptions& options() const { return options_; }
  std::uint32_t token(std::uint64_t i) const { return tokens_.at(i); }
  const MappedTokens& tokens() const { return tokens_; }  // the shards: their files and places

  // Offset of sequence b's first token (the formulas above); < N - T.
  std::uint64_t sequence_offset(std::uint64_t b) const;

  // W = floor((N - 1) / T): the sequence-aligned windows of the data, the sequences of a shuffle
  // epoch.
  std::uint64_t windows() const;

  // Rows r = 0..rows-1 are sequences b0 + r: inputs (rows, T), targets (rows, T), host memory.
  // A target the loss mask leaves out is -1.
  void fill_batch(std::uint64_t b0, int rows, std::int32_t* inputs, std::int32_t* targets) const;

  // How many of the rows · T targets of sequences b0 .. b0 + rows - 1 count (are not -1 in
  // fill_batch): rows · T without a mask. Reads the mask only, never the tokens.
  std::uint64_t counted_targets(std::uint64_t b0, std::uint64_t rows) const;

 private:
  DataOptions options_;
  MappedTokens tokens_;
  std::unique_ptr<LossMask> mask_;  // null: every target counts
};

// b of the first row of (step, replica, microbatch): step is 1-based, replica in [0, dp),
// microbatch in [0, microbatches).
//   b = ((step - 1) * dp + replica) * microbatches * micro_batch_size + microbatch * micro_batch_size
std::uint64_t sequence_index(std::int64_t step, int replica, int microbatch, int dp, int microbatches,
                             int micro_batch_size);

std::uint64_t splitmix64(std::uint64_t z);  // SplitMix64 output function (Steele et al.)

}  // namespace stp
