#include "data/mapped_tokens.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/error.h"

namespace stp {
namespace {

template <class T>
std::uint32_t load(const unsigned char* p) {  // little-endian host, as the formats
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void widen(const unsigned char* src, std::size_t n, std::uint32_t* out) {
  for (std::size_t j = 0; j < n; ++j) out[j] = load<T>(src + j * sizeof(T));
}

// The first j < n with element j >= limit, or n. The maximum first (a loop the compiler
// vectorises), the search only in the rare part that holds an offender.
template <class T>
std::size_t first_at_least(const unsigned char* src, std::size_t n, std::uint64_t limit) {
  std::uint32_t most = 0;
  for (std::size_t j = 0; j < n; ++j) most = std::max(most, load<T>(src + j * sizeof(T)));
  if (most < limit) return n;
  for (std::size_t j = 0; j < n; ++j)
    if (load<T>(src + j * sizeof(T)) >= limit) return j;
  return n;
}

}  // namespace

MappedTokens::MappedTokens(const std::vector<std::string>& files, const ShardFormat& format, const std::string& what)
    : width_(format.width) {
  STP_ASSERT(!files.empty(), "MappedTokens: no files");
  STP_ASSERT(width_ == 1 || width_ == 2 || width_ == 4, "MappedTokens: width ", width_);
  shards_.reserve(files.size());
  std::size_t bound_from = 0;  // the shard whose header gave bound_, for messages
  for (const std::string& path : files) {
    MappedFile file(path, what);
    const ShardHeader header = format.parse(file.bytes(), path);
    STP_ASSERT(header.offset + header.count * std::uint64_t(width_) == file.size(), "MappedTokens: '", path,
               "' header disagrees with its size");
    if (header.bound != 0) {
      if (bound_ == 0) {
        bound_ = header.bound;
        bound_from = shards_.size();
      }
      STP_CHECK(header.bound == bound_, "data: '", path, "' records vocab_size ", header.bound, " in its ", format.name,
                " header but '", files[bound_from], "' records ", bound_,
                ": the shards of one data set share one vocabulary; tokenize them with one tokenizer");
    }
    const auto* base = reinterpret_cast<const unsigned char*>(file.bytes().data());
    shards_.push_back({std::move(file), base ? base + header.offset : nullptr, count_, header.count});
    count_ += header.count;
  }
}

std::uint64_t MappedTokens::offset_in_file(const Shard& s, const unsigned char* p) {
  return static_cast<std::uint64_t>(p - reinterpret_cast<const unsigned char*>(s.file.bytes().data()));
}

std::size_t MappedTokens::shard_of(std::uint64_t i) const {
  STP_ASSERT(i < count_, "MappedTokens: element ", i, " of ", count_);
  // The last shard starting at or before i: empty shards share their begin with the next one,
  // which is then the one that holds i.
  auto it =
      std::upper_bound(shards_.begin(), shards_.end(), i, [](std::uint64_t v, const Shard& s) { return v < s.begin; });
  return static_cast<std::size_t>(it - shards_.begin()) - 1;
}

std::uint32_t MappedTokens::at(std::uint64_t i) const {
  const Shard& s = shards_[shard_of(i)];
  const unsigned char* p = s.data + (i - s.begin) * std::uint64_t(width_);
  return width_ == 1 ? *p : width_ == 2 ? load<std::uint16_t>(p) : load<std::uint32_t>(p);
}

void MappedTokens::read(std::uint64_t i, std::size_t n, std::uint32_t* out) const {
  STP_ASSERT(i <= count_ && n <= count_ - i, "MappedTokens: elements ", i, " + ", n, " of ", count_);
  while (n > 0) {
    const Shard& s = shards_[shard_of(i)];
    const std::uint64_t local = i - s.begin;
    const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(n, s.count - local));
    const unsigned char* src = s.data + local * std::uint64_t(width_);
    if (width_ == 1) widen<std::uint8_t>(src, m, out);
    else if (width_ == 2) widen<std::uint16_t>(src, m, out);
    else widen<std::uint32_t>(src, m, out);
    // A fault maps more than the page it touched (a large folio of the page cache, pages around
    // it), so a run's random reads would leave the resident set growing with the data's size.
    // Measured on the 2-core development machine: about 6 us a read of 129 tokens with the
    // re-fault this causes, against 0.4 us without (100 M tokens, random windows).
    s.file.release(offset_in_file(s, src), m * std::uint64_t(width_));
    i += m;
    n -= m;
    out += m;
  }
}

std::optional<std::uint64_t> MappedTokens::find_at_least(std::uint64_t limit) const {
  if (width_ < 4 && limit >= (std::uint64_t(1) << (8 * width_))) return std::nullopt;
  // Parts of 4 Mi elements (8 MiB of uint16): enough to amortise a task, few enough in flight
  // (one per core) that the pages read and not yet released stay a few tens of MiB.
  constexpr std::uint64_t kPart = std::uint64_t(1) << 22;
  struct Part {
    std::size_t shard;
    std::uint64_t local, n;
  };
  std::vector<Part> parts;
  for (std::size_t k = 0; k < shards_.size(); ++k)
    for (std::uint64_t j = 0; j < shards_[k].count; j += kPart)
      parts.push_back({k, j, std::min(kPart, shards_[k].count - j)});
  std::atomic<std::uint64_t> first{count_};
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, parts.size(), 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t p = r.begin(); p < r.end(); ++p) {
      const Part& part = parts[p];
      const Shard& s = shards_[part.shard];
      if (s.begin + part.local >= first.load(std::memory_order_relaxed)) continue;  // a lower one is found
      const unsigned char* src = s.data + part.local * std::uint64_t(width_);
      const std::size_t n = static_cast<std::size_t>(part.n);
      const std::size_t j = width_ == 1   ? first_at_least<std::uint8_t>(src, n, limit)
                            : width_ == 2 ? first_at_least<std::uint16_t>(src, n, limit)
                                          : first_at_least<std::uint32_t>(src, n, limit);
      s.file.release(offset_in_file(s, src), part.n * std::uint64_t(width_));
      if (j == n) continue;
      std::uint64_t found = s.begin + part.local + j;
      std::uint64_t seen = first.load(std::memory_order_relaxed);
      while (found < seen && !first.compare_exchange_weak(seen, found, std::memory_order_relaxed)) {}
    }
  });
  const std::uint64_t i = first.load();
  if (i == count_) return std::nullopt;
  return i;
}

void MappedTokens::advise_random() const {
  for (const Shard& s : shards_) s.file.advise_random();
}

}  // namespace stp
