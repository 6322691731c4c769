#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  check_regular_file(path, what);  // before open(2): opening a FIFO blocks until a writer comes
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STP_CHECK(fd >= 0, what, " cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(str(what, " cannot read '", path, "': ", std::strerror(err)));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > 0) {
    data_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (data_ == MAP_FAILED) {
      const int err = errno;
      data_ = nullptr;
      ::close(fd);
      throw Error(str(what, " cannot map '", path, "' (", size_, " bytes) into memory: ", std::strerror(err)));
    }
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::advise_random() const {
  if (data_) ::madvise(data_, size_, MADV_RANDOM);  // a hint: a failure changes nothing read
}

void MappedFile::release(std::uint64_t offset, std::uint64_t size) const {
  if (!data_ || offset >= size_) return;
  // The 2 MiB-aligned blocks holding the range: a fault maps more than the page it touched (the
  // page cache's large folio around it, up to 2 MiB, or fault-around's neighbours), and releasing
  // only the range read would leave the rest of that mapped. The mapping is read-only, so a page
  // another reader is using at the same moment is merely read from the page cache again.
  constexpr std::uint64_t kBlock = std::uint64_t(2) << 20;
  const std::uint64_t first = offset / kBlock * kBlock;
  const std::uint64_t last = std::min(size_, (offset + size + kBlock - 1) / kBlock * kBlock);
  ::madvise(static_cast<char*>(data_) + first, last - first,
            MADV_DONTNEED);  // a failure leaves pages resident, nothing more
}

}  // namespace stp
