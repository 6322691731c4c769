#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/error.h"

namespace stp {
namespace {

namespace fs = std::filesystem;

std::string kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::regular: return "";
    case fs::file_type::not_found: return "missing";
    case fs::file_type::directory: return "a folder";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

// Writes all of `bytes` to `fd`; false with errno set on failure.
bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// A device or FIFO the user named as the output (/dev/stdout): written into, as a shell would.
void write_into(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  STP_CHECK(fd >= 0, "cannot open '", path, "' for writing: ", std::strerror(errno));
  const bool ok = write_all(fd, bytes);
  const int err = errno;
  ::close(fd);
  STP_CHECK(ok, "cannot write '", path, "': ", std::strerror(err));
}

}  // namespace

std::string file_kind(const std::string& path) {
  std::error_code ec;
  return kind_of(fs::status(path, ec).type());
}

void check_regular_file(const std::string& path, const std::string& what) {
  const std::string kind = file_kind(path);
  STP_CHECK(kind != "missing", what, " '", path, "' does not exist");
  STP_CHECK(kind.empty(), what, " '", path, "' is ", kind,
            ", not a regular file (stp reads files whose size it knows: save the data to a file first)");
}

std::string read_regular_file(const std::string& path, const std::string& what) {
  check_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  STP_CHECK(f.good(), what, " cannot open '", path, "'");
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekg(0, std::ios::beg);
  STP_CHECK(f.good() && size >= 0, what, " cannot read '", path, "'");
  std::string bytes(static_cast<std::size_t>(size), '\0');
  f.read(bytes.data(), size);
  STP_CHECK(f.gcount() == size, what, " cannot read '", path, "': it ended after ", f.gcount(), " of its ", size,
            " bytes (was it changed while being read?)");
  return bytes;
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  STP_CHECK(st.type() != fs::file_type::directory, "cannot write '", path, "': it is a folder (name a file)");
  if (fs::exists(st) && st.type() != fs::file_type::regular) return write_into(path, bytes);
  // Through a symlink the file it names is replaced, so the link stays a link.
  fs::path target = path;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    target = fs::canonical(path, ec);
    STP_CHECK(!ec, "cannot write '", path, "': ", ec.message());
  }
  fs::path folder = target.parent_path();
  if (folder.empty()) folder = ".";
  // The temporary is created as open(2) creates any file (mode 0666 less the umask), under a name
  // no other writer uses: the process id and a counter, with O_EXCL to be sure.
  static std::atomic<unsigned> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp = (folder / str(".", target.filename().string(), ".tmp.", ::getpid(), ".", counter++)).string();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  STP_CHECK(fd >= 0, "cannot write '", path, "': cannot create a file in '", folder.string(),
            "': ", std::strerror(errno));
  int err = 0;
  auto step = [&err](bool ok) {
    if (!ok && err == 0) err = errno ? errno : EIO;
  };
  if (fs::exists(st)) step(::fchmod(fd, static_cast<mode_t>(st.permissions() & fs::perms::all)) == 0);
  if (err == 0) step(write_all(fd, bytes));
  if (err == 0) step(::fsync(fd) == 0);
  step(::close(fd) == 0);
  if (err == 0) step(std::rename(tmp.c_str(), target.c_str()) == 0);
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw Error(str("cannot write '", path, "': ", std::strerror(err)));
  }
}

}  // namespace stp
