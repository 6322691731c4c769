#include "data/loss_mask.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/file_io.h"

namespace stp {
namespace {

constexpr std::size_t kHeaderBytes = 32;

template <typename U>
U read_le(const unsigned char* p) {
  U v;
  std::memcpy(&v, p, sizeof(U));  // little-endian host
  return v;
}

}  // namespace

LossMask::LossMask(const std::string& path, const std::string& tokens_path, std::uint64_t num_tokens) : n_(num_tokens) {
  check_regular_file(path, str("data: the loss mask of '", tokens_path, "':"));
  const std::string which = str("the loss mask '", path, "' of the token file '", tokens_path, "'");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STP_CHECK(fd >= 0, "data: cannot open ", which, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error(str("data: cannot read ", which, ": ", std::strerror(e)));
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size >= kHeaderBytes) {
    // The map outlives the descriptor; a private read-only map sees no later writes by others.
    map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) map_ = nullptr;
  }
  const int map_errno = errno;
  ::close(fd);
  STP_CHECK(size >= kHeaderBytes, "data: ", which, " has ", size, " bytes, shorter than the ", kHeaderBytes,
            "-byte header; make the mask with stp tokenize");
  STP_CHECK(map_ != nullptr, "data: cannot map ", which, ": ", std::strerror(map_errno));
  map_bytes_ = size;
  try {
    check(which);
  } catch (...) {  // the destructor of a half-made object does not run
    ::munmap(map_, map_bytes_);
    throw;
  }
}

void LossMask::check(const std::string& which) {
  const std::uint64_t size = map_bytes_;
  const auto* bytes = static_cast<const unsigned char*>(map_);
  STP_CHECK(std::memcmp(bytes, "STPMASK1", 8) == 0, "data: ", which,
            " is not a loss mask: its first 8 bytes are not \"STPMASK1\" (data.mask_path takes the .mask file stp "
            "tokenize writes)");
  const auto version = read_le<std::uint32_t>(bytes + 8);
  STP_CHECK(version == 1, "data: ", which, " has version ", version, "; this stp reads version 1");
  STP_CHECK(read_le<std::uint32_t>(bytes + 12) == 0 && read_le<std::uint64_t>(bytes + 24) == 0, "data: ", which,
            " has nonzero reserved header fields (bytes 12..15, 24..31)");
  const auto header_n = read_le<std::uint64_t>(bytes + 16);
  STP_CHECK(header_n == n_, "data: ", which, " is for ", header_n, " tokens, but the token file holds ", n_,
            "; make the mask with its token file");
  STP_CHECK(size - kHeaderBytes == n_, "data: ", which, " has ", size, " bytes, but a mask of ", n_,
            " tokens has 32 + ", n_, " = ", kHeaderBytes + n_, " (a truncated or padded file)");
  bits_ = bytes + kHeaderBytes;
  for (std::uint64_t j = 0; j < n_; ++j)
    STP_CHECK(bits_[j] <= 1, "data: ", which, " has byte ", static_cast<unsigned>(bits_[j]), " at offset ",
              kHeaderBytes + j, " (token ", j, "); every mask byte is 0 or 1");
}

LossMask::~LossMask() {
  if (map_) ::munmap(map_, map_bytes_);
}

}  // namespace stp
