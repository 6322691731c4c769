// Positioned writes (pwrite) put each tensor at its offset, so the order of the writes does not
// change a byte of the file.
#include "formats/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "formats/safetensors.h"

namespace stp {
namespace {

void write_at(int fd, const void* data, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {  // pwrite may write less than asked (a signal, a large request)
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    STP_CHECK(n > 0, path, ": write failed: ", n < 0 ? std::strerror(errno) : "no progress");
    p += n, bytes -= static_cast<std::size_t>(n), offset += static_cast<std::uint64_t>(n);
  }
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<std::pair<std::string, Shape>>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  const std::string header = safetensors_header(tensors, metadata, path_);
  std::uint64_t offset = 8 + header.size();
  for (const auto& [name, shape] : tensors) {
    const auto count = static_cast<std::size_t>(numel(shape));
    places_[name] = Place{offset, count, false};
    order_.push_back(name);
    offset += count * sizeof(float);
  }
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STP_CHECK(fd_ >= 0, tmp_, ": cannot create file: ", std::strerror(errno));
  const std::uint64_t n = header.size();
  write_at(fd_, &n, 8, 0, tmp_);
  write_at(fd_, header.data(), header.size(), 8, tmp_);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ < 0) return;  // committed
  ::close(fd_);
  std::error_code ignore;
  std::filesystem::remove(tmp_, ignore);
}

void SafetensorsWriter::write(const std::string& name, const float* values, std::size_t count) {
  auto it = places_.find(name);
  STP_ASSERT(fd_ >= 0 && it != places_.end(), path_, ": tensor '", name, "' is not in the header, or the file is ",
             "committed");
  Place& p = it->second;
  STP_ASSERT(!p.written && count == p.count, path_, ": tensor '", name, "' written twice or with ", count,
             " values for ", p.count);
  write_at(fd_, values, count * sizeof(float), p.offset, tmp_);
  p.written = true;
}

void SafetensorsWriter::commit() {
  STP_ASSERT(fd_ >= 0, path_, ": committed twice");
  for (const std::string& name : order_)
    STP_CHECK(places_.at(name).written, path_, ": tensor '", name, "' was never written");
  STP_CHECK(::fsync(fd_) == 0, tmp_, ": flush failed: ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    std::error_code ignore;
    std::filesystem::remove(tmp_, ignore);
    throw Error(str(tmp_, ": close failed: ", std::strerror(err)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    std::error_code ignore;
    std::filesystem::remove(tmp_, ignore);
    throw Error(str("cannot rename ", tmp_, " to ", path_, ": ", ec.message()));
  }
}

}  // namespace stp
