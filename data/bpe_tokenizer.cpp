#include "data/bpe_tokenizer.h"

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "base/error.h"
#include "data/bpe_files.h"
#include "data/regex_split.h"
#include "data/utf8.h"

namespace stp {
namespace {

constexpr std::size_t kChunkBytes = 256 * 1024;  // the parallel scan's unit of work
constexpr std::size_t kCachedPieceBytes = 64;    // longer pieces are merged every time
constexpr std::size_t kCacheEntries = 1 << 20;   // a thread's word cache is cleared beyond this
                                                 // (its arena then holds at most 1 << 20 * 323 bytes)

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The word cache's hash: 8 bytes at a time, then a full avalanche (splitmix64's finalizer), which
// linear probing needs in its low bits.
std::uint64_t piece_hash(std::string_view s) {
  std::uint64_t h = 0x243F6A8885A308D3ull ^ s.size();
  std::size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
  }
  if (i < s.size()) {
    std::uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
  }
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  return h ^ (h >> 31);
}

// A thread's cache of piece -> ids: open addressing over one array of 32-byte slots. A piece of
// at most 8 bytes is kept in its slot, and so are up to 2 ids: the common hit reads one slot.
// Longer pieces and id lists live in an arena.
class WordCache {
 public:
  // Appends the ids of piece (hash h) to out; false when piece is not cached.
  bool append(std::string_view piece, std::uint64_t h, std::vector<std::int32_t>& out) const {
    if (slots_.empty()) return false;
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return false;
      if (s.hash != h || s.key_len != piece.size()) continue;
      const char* key = s.key_len <= kInlineKey ? s.key : arena_.data() + s.key_at;
      if (std::memcmp(key, piece.data(), piece.size()) != 0) continue;
      const std::int32_t* ids =
          s.n_ids <= kInlineIds ? s.ids : reinterpret_cast<const std::int32_t*>(arena_.data() + s.ids_at);
      out.insert(out.end(), ids, ids + s.n_ids);
      return true;
    }
  }
  void insert(std::string_view piece, std::uint64_t h, const std::int32_t* ids, std::size_t n) {
    if (n > 0xFFFF || piece.size() > 0xFFFF) return;
    if (entries_ >= kCacheEntries) clear();
    if (2 * (entries_ + 1) > slots_.size()) grow();
    Slot s{};
    s.hash = h;
    s.key_len = static_cast<std::uint16_t>(piece.size());
    s.n_ids = static_cast<std::uint16_t>(n);
    if (piece.size() <= kInlineKey) {
      std::memcpy(s.key, piece.data(), piece.size());
    } else {
      s.key_at = static_cast<std::uint32_t>(arena_.size());
      arena_.insert(arena_.end(), piece.begin(), piece.end());
    }
    if (n <= kInlineIds) {
      std::memcpy(s.ids, ids, n * sizeof(std::int32_t));
    } else {
      arena_.resize((arena_.size() + 3) / 4 * 4);  // ids aligned
      s.ids_at = static_cast<std::uint32_t>(arena_.size());
      const char* p = reinterpret_cast<const char*>(ids);
      arena_.insert(arena_.end(), p, p + n * sizeof(std::int32_t));
    }
    place(s);
    ++entries_;
  }

 private:
  static constexpr std::size_t kInlineKey = 8, kInlineIds = 2;
  struct Slot {
    std::uint64_t hash;
    std::uint16_t key_len;  // 0: empty
    std::uint16_t n_ids;
    std::uint32_t key_at;  // arena offset of a longer key
    union {
      char key[kInlineKey];
      std::uint64_t key_word;
    };
    union {
      std::int32_t ids[kInlineIds];
      std::uint32_t ids_at;  // arena offset of more ids
    };
  };
  static_assert(sizeof(Slot) == 32);
  void place(const Slot& s) {
    std::size_t i = s.hash & mask_;
    while (slots_[i].key_len != 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? std::size_t(1) << 14 : 2 * old.size(), Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.key_len != 0) place(s);
  }
  void clear() {
    slots_.clear();
    arena_.clear();
    entries_ = 0;
    mask_ = 0;
  }
  std::vector<Slot> slots_;
  std::vector<char> arena_;
  std::size_t entries_ = 0, mask_ = 0;
};

struct Merge {
  std::int32_t rank;
  std::int32_t id;  // the merged token
};

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b);
}

struct Special {
  std::string bytes;
  std::int32_t id;
};

// A stretch of the input: plain text [begin, end) or one special token.
struct Segment {
  std::size_t begin, end;
  std::int32_t special;  // -1 for text
};

// A chunk of one text segment, scanned in parallel: pieces end at `ends`, the first starts at `start`.
struct Task {
  std::size_t seg_begin, seg_end;  // the segment (the regex subject)
  std::size_t from, to;            // the chunk, offsets within the segment
  std::size_t start = 0;           // where its first piece starts after joining
  std::vector<std::size_t> ends;
  std::vector<std::int32_t> ids;
};

}  // namespace

struct BpeTokenizer::Impl {
  std::vector<std::string> id_bytes;  // id -> bytes ("" for an unused id)
  std::vector<bool> used;
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> vocab;  // bytes -> id
  std::array<std::int32_t, 256> byte_id{};
  std::unordered_map<std::uint64_t, Merge> merges;
  std::vector<Special> specials;  // longest first
  std::array<bool, 256> special_first{};
  bool ignore_merges = false;
  bool streams = false;  // the pattern has safe cuts (stream_cut)
  std::unique_ptr<RegexSplitter> splitter;
  tbb::enumerable_thread_specific<WordCache> caches;

  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const;
  void encode_piece(std::string_view piece, WordCache& cache, std::vector<std::int32_t>& out) const;
  std::vector<Segment> segments(std::string_view text) const;
};

void BpeTokenizer::Impl::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  const int n = static_cast<int>(piece.size());
  if (n == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  std::vector<std::int32_t> ids(std::size_t(n), 0);
  std::vector<int> prev(static_cast<std::size_t>(n)), next(static_cast<std::size_t>(n));
  std::vector<char> alive(std::size_t(n), 1);
  for (int i = 0; i < n; ++i) {
    ids[std::size_t(i)] = byte_id[static_cast<unsigned char>(piece[std::size_t(i)])];
    prev[std::size_t(i)] = i - 1;
    next[std::size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Entry {
    std::int32_t rank;
    int pos;
    std::int32_t left, right;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](int left) {
    if (left < 0) return;
    const int right = next[std::size_t(left)];
    if (right < 0) return;
    auto it = merges.find(pair_key(ids[std::size_t(left)], ids[std::size_t(right)]));
    if (it != merges.end()) heap.push({it->second.rank, left, ids[std::size_t(left)], ids[std::size_t(right)]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<int> merged;
  while (!heap.empty()) {
    // One pass of the lowest rank: all its occurrences, left to right; new pairs join afterwards.
    const std::int32_t rank = heap.top().rank;
    merged.clear();
    while (!heap.empty() && heap.top().rank == rank) {
      Entry e = heap.top();
      heap.pop();
      const auto l = std::size_t(e.pos);
      if (!alive[l] || ids[l] != e.left || next[l] < 0 || ids[std::size_t(next[l])] != e.right) continue;
      const auto r = std::size_t(next[l]);
      ids[l] = merges.at(pair_key(e.left, e.right)).id;
      alive[r] = 0;
      next[l] = next[r];
      if (next[r] >= 0) prev[std::size_t(next[r])] = e.pos;
      merged.push_back(e.pos);
    }
    for (int pos : merged) {
      if (!alive[std::size_t(pos)]) continue;
      push(prev[std::size_t(pos)]);
      push(pos);
    }
  }
  for (int i = 0; i >= 0; i = next[std::size_t(i)]) out.push_back(ids[std::size_t(i)]);
}

void BpeTokenizer::Impl::encode_piece(std::string_view piece, WordCache& cache, std::vector<std::int32_t>& out) const {
  if (ignore_merges) {
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCachedPieceBytes) {
    bpe(piece, out);
    return;
  }
  const std::uint64_t h = piece_hash(piece);
  if (cache.append(piece, h, out)) return;
  const std::size_t at = out.size();
  bpe(piece, out);
  cache.insert(piece, h, out.data() + at, out.size() - at);
}

std::vector<Segment> BpeTokenizer::Impl::segments(std::string_view text) const {
  std::vector<Segment> segs;
  std::size_t begin = 0;
  if (!specials.empty()) {
    for (std::size_t i = 0; i < text.size();) {
      const Special* hit = nullptr;
      if (special_first[static_cast<unsigned char>(text[i])])
        for (const Special& s : specials)
          if (text.compare(i, s.bytes.size(), s.bytes) == 0) {
            hit = &s;
            break;
          }
      if (!hit) {
        ++i;
        continue;
      }
      if (i > begin) segs.push_back({begin, i, -1});
      segs.push_back({i, i + hit->bytes.size(), hit->id});
      i += hit->bytes.size();
      begin = i;
    }
  }
  if (begin < text.size()) segs.push_back({begin, text.size(), -1});
  return segs;
}

BpeTokenizer BpeTokenizer::load(const std::string& path) { return BpeTokenizer(read_bpe_files(path)); }

BpeTokenizer::BpeTokenizer(const BpeSpec& spec) : impl_(std::make_shared<Impl>()) {
  Impl& m = *impl_;
  // The ids size the tables below: each is checked first, so that no id can overflow the size or
  // make it allocate beyond the cap (read_bpe_files() checks them too, naming the file's token).
  std::int32_t size = 0;
  for (const auto* tokens : {&spec.vocab, &spec.specials})
    for (const auto& t : *tokens) {
      STP_CHECK(t.id >= 0 && t.id < kMaxVocabSize, "tokenizer: ", spec.source, ": id ", t.id,
                " is not in [0, 2^22 = ", kMaxVocabSize, ") (stp's limit on token ids)");
      size = std::max(size, t.id + 1);
    }
  STP_CHECK(size > 0, "tokenizer: ", spec.source, " has an empty vocabulary");
  m.id_bytes.resize(std::size_t(size));
  m.used.assign(std::size_t(size), false);
  for (const auto& t : spec.vocab) {
    STP_CHECK(!m.used[std::size_t(t.id)] || m.id_bytes[std::size_t(t.id)] == t.bytes, "tokenizer: ", spec.source,
              ": id ", t.id, " is given to two different tokens");
    m.id_bytes[std::size_t(t.id)] = t.bytes;
    m.used[std::size_t(t.id)] = true;
    m.vocab.emplace(t.bytes, t.id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab.find(std::string(1, static_cast<char>(b)));
    STP_CHECK(it != m.vocab.end(), "tokenizer: ", spec.source, ": the vocabulary has no token for byte ", b,
              " (not a byte-level BPE vocabulary)");
    m.byte_id[std::size_t(b)] = it->second;
  }
  for (std::size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    auto ia = m.vocab.find(a), ib = m.vocab.find(b), iab = m.vocab.find(a + b);
    STP_CHECK(ia != m.vocab.end() && ib != m.vocab.end() && iab != m.vocab.end(), "tokenizer: ", spec.source,
              ": merge ", r, " joins tokens that are not all in the vocabulary");
    m.merges.emplace(pair_key(ia->second, ib->second), Merge{std::int32_t(r), iab->second});  // first rank wins
  }
  for (const auto& t : spec.specials) {
    m.id_bytes[std::size_t(t.id)] = t.bytes;
    m.used[std::size_t(t.id)] = true;
    m.specials.push_back({t.bytes, t.id});
    m.special_first[static_cast<unsigned char>(t.bytes[0])] = true;
  }
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [](const Special& x, const Special& y) { return x.bytes.size() > y.bytes.size(); });
  m.ignore_merges = spec.ignore_merges;
  m.splitter = std::make_unique<RegexSplitter>(spec.pattern);
  for (const char* known : {kGpt2Pattern, kLlama3Pattern, kQwen2Pattern}) m.streams |= spec.pattern == known;
}

std::int32_t BpeTokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->id_bytes.size()); }

bool BpeTokenizer::pre_split_jit() const { return impl_->splitter->jit(); }

bool BpeTokenizer::stream_cuts() const { return impl_->streams; }

std::size_t BpeTokenizer::stream_cut(std::string_view text, std::size_t from) const {
  const Impl& m = *impl_;
  if (!m.streams) return std::string_view::npos;
  const std::size_t longest = m.specials.empty() ? 0 : m.specials.front().bytes.size();
  auto graphic = [](char c) { return c > ' ' && c < 0x7F; };  // printable ASCII, not space
  if (text.size() < longest + 2) return std::string_view::npos;
  const std::size_t last = text.size() - 1 - longest;  // text[p + longest - 1] must exist
  for (std::size_t p = std::max<std::size_t>(from, 2); p <= last; ++p) {
    const void* nl = std::memchr(text.data() + p - 1, '\n', last - p + 1);
    if (!nl) break;
    p = std::size_t(static_cast<const char*>(nl) - text.data()) + 1;
    if (p > last) break;
    if (!graphic(text[p - 2]) || !graphic(text[p])) continue;
    bool straddled = false;
    for (const Special& s : m.specials)
      for (std::size_t k = 1; k < s.bytes.size() && k <= p && !straddled; ++k)
        straddled = text.compare(p - k, s.bytes.size(), s.bytes) == 0;
    if (!straddled) return p;
  }
  return std::string_view::npos;
}

std::optional<std::int32_t> BpeTokenizer::token_id(std::string_view bytes) const {
  for (const Special& s : impl_->specials)
    if (s.bytes == bytes) return s.id;
  auto it = impl_->vocab.find(bytes);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string BpeTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int32_t id = ids[i];
    STP_CHECK(id >= 0 && id < vocab_size() && impl_->used[std::size_t(id)], "tokenizer: id ", id, " at position ", i,
              " is not in the vocabulary (size ", vocab_size(), ")");
    out += impl_->id_bytes[std::size_t(id)];
  }
  return out;
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const { return encode(text, Progress()); }

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text, const Progress& progress) const {
  const Impl& m = *impl_;
  const std::size_t bad = utf8::first_invalid(text);
  if (bad != std::string_view::npos) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(text[bad]));
    throw Error(str("tokenizer: the text is not valid UTF-8: byte ", hex, " at offset ", bad,
                    " does not start a valid character"));
  }
  const std::vector<Segment> segs = m.segments(text);

  // Chunks: a segment longer than kChunkBytes is cut after a newline (or else at a character
  // boundary) near every kChunkBytes.
  std::vector<Task> tasks;
  std::vector<std::size_t> task_of_segment(segs.size(), 0);
  for (std::size_t si = 0; si < segs.size(); ++si) {
    const Segment& s = segs[si];
    task_of_segment[si] = tasks.size();
    if (s.special >= 0) continue;
    const std::size_t len = s.end - s.begin;
    std::size_t from = 0;
    while (from < len) {
      std::size_t to = len;
      if (len - from > 2 * kChunkBytes) {
        to = from + kChunkBytes;
        const std::size_t limit = std::min(len, to + 4096);
        std::size_t t = to;
        while (t < limit && text[s.begin + t - 1] != '\n') ++t;
        if (t < limit) to = t;
        while (to < len && (static_cast<unsigned char>(text[s.begin + to]) & 0xC0) == 0x80) ++to;
      }
      tasks.push_back({s.begin, s.end, from, to, from, {}, {}});
      from = to;
    }
  }

  auto subject = [&](const Task& t) { return text.substr(t.seg_begin, t.seg_end - t.seg_begin); };
  tbb::parallel_for(std::size_t(0), tasks.size(), [&](std::size_t i) {
    Task& t = tasks[i];
    m.splitter->scan(subject(t), t.from, t.to, t.ends);
  });
  // Join: the true scan reaches each chunk at `carry`, a piece boundary; from a cut the chunk also
  // found, the chunk's own pieces are the true ones (scan() depends only on where it starts).
  for (std::size_t i = 1; i < tasks.size(); ++i) {
    Task& prev = tasks[i - 1];
    Task& t = tasks[i];
    if (prev.seg_begin != t.seg_begin) continue;
    const std::size_t carry = prev.ends.empty() ? prev.start : prev.ends.back();
    if (carry == t.from) continue;
    auto it = std::lower_bound(t.ends.begin(), t.ends.end(), carry);
    if (it != t.ends.end() && *it == carry) {
      t.ends.erase(t.ends.begin(), it + 1);
    } else if (t.ends.empty() || carry > t.ends.back()) {
      t.ends.clear();
    } else {
      t.ends.clear();
      m.splitter->scan(subject(t), carry, t.to, t.ends);
    }
    t.start = carry;
  }
  std::mutex progress_mutex;
  std::size_t done = 0;
  tbb::parallel_for(std::size_t(0), tasks.size(), [&](std::size_t i) {
    Task& t = tasks[i];
    WordCache& cache = impl_->caches.local();
    const std::string_view sub = subject(t);
    std::size_t begin = t.start;
    for (std::size_t end : t.ends) {
      m.encode_piece(sub.substr(begin, end - begin), cache, t.ids);
      begin = end;
    }
    if (progress) {
      std::lock_guard<std::mutex> lock(progress_mutex);
      done += t.to - t.from;
      progress(done);
    }
  });
  std::size_t total = 0;
  for (const Task& t : tasks) total += t.ids.size();
  std::vector<std::int32_t> out;
  out.reserve(total + segs.size());
  for (std::size_t si = 0; si < segs.size(); ++si) {
    if (segs[si].special >= 0) {
      out.push_back(segs[si].special);
      continue;
    }
    for (std::size_t ti = task_of_segment[si]; ti < tasks.size() && tasks[ti].seg_begin == segs[si].begin; ++ti)
      out.insert(out.end(), tasks[ti].ids.begin(), tasks[ti].ids.end());
  }
  return out;
}

}  // namespace stp
