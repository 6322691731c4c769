#include "data/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {

FileReader::FileReader(const std::string& path, const std::string& what) : path_(path) {
  check_regular_file(path, what);
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STP_CHECK(fd_ >= 0, what, " '", path, "' cannot be opened: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(str(what, " '", path, "' cannot be read: ", std::strerror(err)));
  }
  size_ = left_ = std::uint64_t(st.st_size);
}

FileReader::~FileReader() { ::close(fd_); }

std::size_t FileReader::read(std::string& buf, std::size_t n) {
  n = std::size_t(std::min<std::uint64_t>(n, left_));
  const std::size_t at = buf.size();
  buf.resize(at + n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, buf.data() + at + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    STP_CHECK(r >= 0, "cannot read '", path_, "': ", std::strerror(errno));
    if (r == 0) break;  // the file shrank meanwhile
    got += std::size_t(r);
  }
  buf.resize(at + got);
  left_ = got < n ? 0 : left_ - n;
  return got;
}

}  // namespace stp
