// A stream of unsigned integers (token ids, loss-mask bytes) stored in one or more binary files,
// the shards, read through read-only memory maps (base/mapped_file.h) and seen as one
// concatenation: element i of the stream is element i - shard_begin(k) of shard k, the shards in
// the order given (data/shard_paths.h gives name order). Nothing is copied whole or widened: an
// element is read from the mapping when asked for, so resident memory does not grow with the
// data's size, and processes that map the same files share their cached pages.
//
// A ShardFormat says how one file holds its elements: `width` bytes each (1, 2 or 4,
// little-endian unsigned, as the host), after a header that `parse` reads. parse() gets all of a
// file's bytes (only the header is touched) and checks the header against the file's size, naming
// the file in the stp::Error it throws; it returns where the elements start, how many there are
// and, if the header records one, a bound every element is below (a vocabulary size). The
// token formats of data.format are data/token_formats.h; a loss-mask file is one more format.
//
// Errors at construction (stp::Error): whatever opening, mapping or parse() of a shard throws
// (each names its file), and shards whose headers record different bounds (naming both files and
// both bounds: the shards of one data set share one vocabulary). An empty list is an assertion.
// Every shard may be empty; the stream may be empty.
//
// Thread safety: const members may be called from any number of threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"

namespace stp {

// What parse() reads from a shard's header.
struct ShardHeader {
  std::uint64_t offset = 0;  // the first element's byte offset in the file
  std::uint64_t count = 0;   // elements; offset + width * count == the file's size
  std::uint64_t bound = 0;   // every element is < bound, as the header records; 0: none recorded
};

struct ShardFormat {
  std::string name;  // for messages: "llmc", "tok32", "loss mask"
  int width = 1;     // bytes per element: 1, 2 or 4
  std::function<ShardHeader(std::string_view bytes, const std::string& path)> parse;
};

class MappedTokens {
 public:
  // Maps `files` in order; `what` names them in messages ("data: data.path").
  MappedTokens(const std::vector<std::string>& files, const ShardFormat& format, const std::string& what);

  std::uint64_t count() const { return count_; }  // elements in all shards
  std::uint32_t at(std::uint64_t i) const;        // element i < count()
  // Elements i .. i + n - 1 (i + n <= count()), crossing shard boundaries, into out[0 .. n).
  // Then drops the pages it read from the process's resident set (MappedFile::release): they stay
  // in the page cache, and the resident set stays small under any pattern of reads.
  void read(std::uint64_t i, std::size_t n, std::uint32_t* out) const;

  std::size_t shards() const { return shards_.size(); }
  const std::string& file(std::size_t k) const { return shards_[k].file.path(); }
  std::uint64_t shard_begin(std::size_t k) const { return shards_[k].begin; }  // its first element's i
  std::uint64_t shard_count(std::size_t k) const { return shards_[k].count; }
  std::size_t shard_of(std::uint64_t i) const;    // the shard holding element i < count()
  std::uint64_t bound() const { return bound_; }  // the headers' common bound; 0: none recorded

  // The lowest i whose element is >= limit, or none. One pass over the mappings, in parallel over
  // the cores (oneTBB), releasing each part's pages once read (MappedFile::release), so it adds
  // no resident memory that grows with the data; no pass at all when the width alone keeps every
  // element below limit (2-byte elements and limit >= 65536).
  std::optional<std::uint64_t> find_at_least(std::uint64_t limit) const;

  // Reads will be scattered (random sampling): no read-ahead around them (MappedFile).
  void advise_random() const;

 private:
  struct Shard {
    MappedFile file;
    const unsigned char* data = nullptr;  // the first element
    std::uint64_t begin = 0;
    std::uint64_t count = 0;
  };
  static std::uint64_t offset_in_file(const Shard& s, const unsigned char* p);

  int width_ = 1;
  std::vector<Shard> shards_;
  std::uint64_t count_ = 0;
  std::uint64_t bound_ = 0;
};

}  // namespace stp
