// Writing token files as the tokens arrive (stp tokenize): the formats of data/token_file.h, one
// file or shards of a fixed token count, each with an optional loss-mask companion.
//
// Shards. With shard_tokens = S > 0, shard k holds tokens [k S, (k + 1) S) of the stream (the
// last one fewer, none empty unless the stream is: zero tokens write one empty shard 0) and is
// named shard_path(path, k): path's stem + "_" + k in 6 digits + path's extension, in path's
// folder ("out.bin" -> "out_000000.bin", "out_000001.bin"; "out" -> "out_000000"), so that name
// order is stream order and a glob (out_*.bin) or a folder of them concatenates back the stream.
// With S = 0 one file, path, is written.
//
// The loss mask ("stp loss mask"), when Options::mask: for token file X the file X + ".mask":
//   bytes  0..7   magic "STPMASK1"
//   bytes  8..11  uint32 version = 1
//   bytes 12..15  uint32 reserved, 0
//   bytes 16..23  uint64 N, the token count of X
//   bytes 24..31  uint64 reserved, 0
//   bytes 32..    N bytes, one per token of X, each 0 or 1
// little-endian. Byte j = 1: token j counts as a target (the loss of predicting token j from the
// tokens before it is counted); 0: it does not (docs/config.md, Fine-tuning data and loss masks).
//
// Every file is written into a temporary in its folder and renamed onto its name by finish(),
// all of them at the end, so a failure (a bad input line, a full disk) leaves no new output and
// earlier files of those names as they were; an unfinished writer removes its temporaries. A
// destination that is a device (/dev/null) is written into directly at finish(). After the
// renames finish() removes what an earlier run left that would now be read wrongly: files named
// shard_path(path, k) (and their masks) for k = the shards written, the next, ... as long as one
// exists (a glob would read them after the new shards), and without a mask, the mask file beside
// each file written. Each is first passed to check_output, before anything is renamed.
// Errors (stp::Error) name the file: a write that fails, an llmc file of more than 2^31 - 1
// tokens (split it with shard_tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace stp {

class TokenWriter {
 public:
  struct Options {
    std::string path;
    std::int32_t vocab_size = 0;     // > 0: llmc when <= 65536, else tok32
    std::uint64_t shard_tokens = 0;  // 0: one file
    bool mask = false;               // write X.mask beside each token file X
    // Called with each file's name before it is created (stp tokenize's output guard).
    std::function<void(const std::string&)> check_output;
  };
  struct Result {
    std::string format;                // "llmc" or "tok32"
    std::vector<std::string> files;    // the token files, in order
    std::vector<std::string> removed;  // stale shards removed (token and mask files)
    std::uint64_t tokens = 0;
    std::uint64_t counted = 0;  // mask bytes of 1 (with a mask)
  };

  explicit TokenWriter(Options options);
  ~TokenWriter();
  TokenWriter(const TokenWriter&) = delete;
  TokenWriter& operator=(const TokenWriter&) = delete;

  // Appends n ids (each in [0, vocab_size)) and, with a mask, their n mask bytes (0 or 1; mask
  // is ignored without one).
  void append(const std::int32_t* ids, const std::uint8_t* mask, std::size_t n);
  void append(const std::vector<std::int32_t>& ids) { append(ids.data(), nullptr, ids.size()); }
  Result finish();

  // The name of shard k of path (see above).
  static std::string shard_path(const std::string& path, std::size_t k);
  // The mask file of token file path: path + ".mask".
  static std::string mask_path(const std::string& path) { return path + ".mask"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stp
