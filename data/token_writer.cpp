#include "data/token_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

constexpr char kTok32Magic[8] = {'S', 'T', 'P', 'T', 'O', 'K', '3', '2'};
constexpr char kMaskMagic[8] = {'S', 'T', 'P', 'M', 'A', 'S', 'K', '1'};
constexpr std::size_t kBufferBytes = 1 << 20;

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= std::size_t(w);
  }
  return true;
}

// One output file: written into a temporary and renamed onto `dest` by commit(); a destination
// that exists and is not a regular file (a device) gets the temporary's bytes copied into it.
class SpoolFile {
 public:
  explicit SpoolFile(std::string dest) : dest_(std::move(dest)) {
    std::error_code ec;
    const fs::file_status st = fs::status(dest_, ec);
    STP_CHECK(st.type() != fs::file_type::directory, "cannot write '", dest_, "': it is a folder (name a file)");
    device_ = fs::exists(st) && st.type() != fs::file_type::regular;
    if (fs::exists(st)) perms_ = static_cast<int>(st.permissions() & fs::perms::all);
    target_ = dest_;
    if (!device_ && fs::is_symlink(fs::symlink_status(dest_, ec))) {  // the file it names is replaced
      target_ = fs::canonical(dest_, ec);
      STP_CHECK(!ec, "cannot write '", dest_, "': ", ec.message());
    }
    fs::path folder = device_ ? fs::temp_directory_path() : target_.parent_path();
    if (folder.empty()) folder = ".";
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; fd_ < 0 && attempt < 100; ++attempt) {
      tmp_ = (folder / str(".", target_.filename().string(), ".tmp.", ::getpid(), ".", counter++)).string();
      fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    STP_CHECK(fd_ >= 0, "cannot write '", dest_, "': cannot create a file in '", folder.string(),
              "': ", std::strerror(errno));
    buffer_.reserve(kBufferBytes);
  }
  ~SpoolFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
  }
  SpoolFile(const SpoolFile&) = delete;
  SpoolFile& operator=(const SpoolFile&) = delete;

  const std::string& dest() const { return dest_; }

  void write(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    if (buffer_.size() + n > kBufferBytes) flush();
    if (n >= kBufferBytes) return check(write_all(fd_, c, n));
    buffer_.insert(buffer_.end(), c, c + n);
  }
  // Overwrites bytes already written (a header's count).
  void patch(std::size_t offset, const void* p, std::size_t n) {
    flush();
    check(::pwrite(fd_, p, n, off_t(offset)) == ssize_t(n));
  }
  // Flushes the bytes to the disk and closes the temporary.
  void close() {
    flush();
    if (perms_ >= 0) check(::fchmod(fd_, mode_t(perms_)) == 0);
    check(::fsync(fd_) == 0);
    const int fd = fd_;
    fd_ = -1;
    check(::close(fd) == 0);
  }
  // Puts the closed temporary in place.
  void commit() {
    if (device_) {
      const int in = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
      const int out = ::open(dest_.c_str(), O_WRONLY | O_CLOEXEC);
      bool ok = in >= 0 && out >= 0;
      std::vector<char> buf(kBufferBytes);
      while (ok) {
        const ssize_t r = ::read(in, buf.data(), buf.size());
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          ok = r == 0;
          break;
        }
        ok = write_all(out, buf.data(), std::size_t(r));
      }
      const int err = errno;
      if (in >= 0) ::close(in);
      if (out >= 0) ::close(out);
      errno = err;
      check(ok);
    } else {
      check(std::rename(tmp_.c_str(), target_.c_str()) == 0);
      tmp_.clear();
    }
  }

 private:
  void flush() {
    if (buffer_.empty()) return;
    check(write_all(fd_, buffer_.data(), buffer_.size()));
    buffer_.clear();
  }
  void check(bool ok) const {
    if (!ok) throw Error(str("cannot write '", dest_, "': ", std::strerror(errno ? errno : EIO)));
  }
  std::string dest_, tmp_;
  fs::path target_;
  bool device_ = false;
  int perms_ = -1;
  int fd_ = -1;
  std::vector<char> buffer_;
};

template <class T>
void put(std::string& out, T v) {  // little-endian host
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

struct TokenWriter::Impl {
  Options o;
  bool wide = false;  // tok32
  struct Shard {
    std::unique_ptr<SpoolFile> tokens, mask;
    std::uint64_t n = 0;
  };
  std::vector<Shard> shards;
  std::uint64_t total = 0, counted = 0;
  std::vector<char> scratch;

  std::string file_name(std::size_t k) const { return o.shard_tokens ? shard_path(o.path, k) : o.path; }

  void open_shard() {
    Shard s;
    const std::string name = file_name(shards.size());
    if (o.check_output) {
      o.check_output(name);
      if (o.mask) o.check_output(mask_path(name));
    }
    s.tokens = std::make_unique<SpoolFile>(name);
    std::string header;
    if (wide) {
      header.append(kTok32Magic, sizeof kTok32Magic);
      put(header, std::uint32_t(1));
      put(header, static_cast<std::uint32_t>(o.vocab_size));
      put(header, std::uint64_t(0));  // the count, patched by finish()
      put(header, std::uint64_t(0));
    } else {
      std::int32_t h[256] = {};
      h[0] = 20240520;
      h[1] = 1;
      header.append(reinterpret_cast<const char*>(h), sizeof h);
    }
    s.tokens->write(header.data(), header.size());
    if (o.mask) {
      s.mask = std::make_unique<SpoolFile>(mask_path(s.tokens->dest()));
      std::string mh(kMaskMagic, sizeof kMaskMagic);
      put(mh, std::uint32_t(1));
      put(mh, std::uint32_t(0));
      put(mh, std::uint64_t(0));  // the count, patched by finish()
      put(mh, std::uint64_t(0));
      s.mask->write(mh.data(), mh.size());
    }
    shards.push_back(std::move(s));
  }

  void write_ids(Shard& s, const std::int32_t* ids, std::size_t n) {
    const std::size_t width = wide ? 4 : 2;
    scratch.resize(n * width);
    if (wide) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto v = static_cast<std::uint32_t>(ids[i]);
        std::memcpy(scratch.data() + 4 * i, &v, 4);
      }
    } else {
      STP_CHECK(s.n + n <= 0x7fffffffu, "tokenize: '", s.tokens->dest(),
                "' would hold more than 2^31 - 1 tokens, the most an llm.c file can; write shards "
                "(stp tokenize --shard-tokens N)");
      for (std::size_t i = 0; i < n; ++i) {
        const auto v = static_cast<std::uint16_t>(ids[i]);
        std::memcpy(scratch.data() + 2 * i, &v, 2);
      }
    }
    s.tokens->write(scratch.data(), scratch.size());
  }
};

TokenWriter::TokenWriter(Options options) : impl_(std::make_unique<Impl>()) {
  STP_ASSERT(options.vocab_size > 0, "TokenWriter: vocab_size ", options.vocab_size);
  impl_->wide = options.vocab_size > 65536;
  impl_->o = std::move(options);
}

TokenWriter::~TokenWriter() = default;

std::string TokenWriter::shard_path(const std::string& path, std::size_t k) {
  const fs::path p(path);
  char digits[32];
  std::snprintf(digits, sizeof digits, "_%06zu", k);
  return (p.parent_path() / (p.stem().string() + digits + p.extension().string())).string();
}

void TokenWriter::append(const std::int32_t* ids, const std::uint8_t* mask, std::size_t n) {
  Impl& m = *impl_;
  for (std::size_t i = 0; i < n; ++i)
    STP_ASSERT(ids[i] >= 0 && ids[i] < m.o.vocab_size, "TokenWriter: id ", ids[i], " at ", m.total + i);
  std::size_t at = 0;
  while (at < n) {
    if (m.shards.empty() || (m.o.shard_tokens && m.shards.back().n == m.o.shard_tokens)) m.open_shard();
    Impl::Shard& s = m.shards.back();
    std::size_t take = n - at;
    if (m.o.shard_tokens) take = std::min<std::uint64_t>(take, m.o.shard_tokens - s.n);
    m.write_ids(s, ids + at, take);
    if (m.o.mask) {
      STP_ASSERT(mask != nullptr, "TokenWriter: a mask writer was given no mask bytes");
      for (std::size_t i = at; i < at + take; ++i) {
        STP_ASSERT(mask[i] <= 1, "TokenWriter: mask byte ", int(mask[i]), " at ", m.total + i);
        m.counted += mask[i];
      }
      s.mask->write(mask + at, take);
    }
    s.n += take;
    m.total += take;
    at += take;
  }
}

TokenWriter::Result TokenWriter::finish() {
  Impl& m = *impl_;
  if (m.shards.empty()) m.open_shard();
  Result r;
  r.format = m.wide ? "tok32" : "llmc";
  r.tokens = m.total;
  r.counted = m.counted;
  for (Impl::Shard& s : m.shards) {
    if (m.wide) {
      s.tokens->patch(16, &s.n, 8);
    } else {
      const auto n = static_cast<std::int32_t>(s.n);
      s.tokens->patch(8, &n, 4);
    }
    s.tokens->close();
    if (s.mask) {
      s.mask->patch(16, &s.n, 8);
      s.mask->close();
    }
  }
  // Stale shards are found, and checked as outputs (one may be an input), before anything is put
  // in place.
  std::vector<std::string> stale;
  std::error_code ec;
  if (!m.o.mask)  // the mask of an earlier run beside a file now written without one
    for (const Impl::Shard& s : m.shards) {
      const std::string g = mask_path(s.tokens->dest());
      if (fs::is_regular_file(fs::symlink_status(g, ec))) {
        if (m.o.check_output) m.o.check_output(g);
        stale.push_back(g);
      }
    }
  if (m.o.shard_tokens) {
    for (std::size_t k = m.shards.size();; ++k) {
      const std::string f = shard_path(m.o.path, k);
      const std::size_t before = stale.size();
      for (const std::string& g : {f, mask_path(f)})
        if (fs::is_regular_file(fs::symlink_status(g, ec))) {
          if (m.o.check_output) m.o.check_output(g);
          stale.push_back(g);
        }
      if (stale.size() == before) break;
    }
  }
  for (Impl::Shard& s : m.shards) {
    s.tokens->commit();
    if (s.mask) s.mask->commit();
    r.files.push_back(s.tokens->dest());
  }
  for (const std::string& f : stale) {
    STP_CHECK(fs::remove(f, ec), "cannot remove '", f, "', left by an earlier run: ", ec ? ec.message() : "it is gone");
    r.removed.push_back(f);
  }
  m.shards.clear();
  return r;
}

}  // namespace stp
