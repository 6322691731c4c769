// SafetensorsReader: the header as read_safetensors_file checks it, then one tensor per pread.
#include "formats/safetensors_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"

namespace stp {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit

// Every byte of [offset, offset + bytes), or an stp::Error naming the file (a file that shrank
// under the reader: its header was checked against the size it had when opened).
void read_exact(int fd, void* dst, std::size_t bytes, std::uint64_t offset, const std::string& path) {
  auto* out = static_cast<char*>(dst);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    STP_CHECK(n > 0, path, ": cannot read ", bytes, " bytes at offset ", offset, " (truncated file?)");
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  const std::uint64_t file_bytes = std::filesystem::file_size(path, ec);
  STP_CHECK(!ec, path, ": cannot open safetensors file: ", ec.message());
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STP_CHECK(fd_ >= 0, path, ": cannot open safetensors file: ", std::strerror(errno));
  try {
    STP_CHECK(file_bytes >= 8, path, ": not a safetensors file (", file_bytes,
              " bytes, shorter than the 8-byte header length)");
    std::uint64_t header_bytes = 0;
    read_exact(fd_, &header_bytes, 8, 0, path);
    STP_CHECK(header_bytes <= file_bytes - 8, path, ": header length ", header_bytes, " exceeds the file size ",
              file_bytes, " (truncated or not a safetensors file)");
    STP_CHECK(header_bytes <= kMaxHeaderBytes, path, ": header length ", header_bytes, " exceeds the limit ",
              kMaxHeaderBytes);
    std::string header(static_cast<std::size_t>(header_bytes), '\0');
    read_exact(fd_, header.data(), header.size(), 8, path);
    data_start_ = 8 + header_bytes;
    header_ = parse_safetensors_header(header, file_bytes - data_start_, path);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  for (std::size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

HostTensor SafetensorsReader::read(const SafetensorsEntry& e) const {
  HostTensor t;
  t.shape = e.shape;
  const std::size_t n = static_cast<std::size_t>(numel(e.shape));
  t.data.resize(n);
  if (e.dtype == "F32") {
    read_exact(fd_, t.data.data(), n * 4, data_start_ + e.begin, path_);
    return t;
  }
  // The halves go to the upper half of the buffer and are widened from the front: value i's four
  // bytes [4i, 4i + 4) end at or before half i + 1's first byte (2n + 2i + 2), so no half is
  // overwritten before it is read.
  auto* bytes = reinterpret_cast<unsigned char*>(t.data.data());
  read_exact(fd_, bytes + 2 * n, n * 2, data_start_ + e.begin, path_);
  const bool bf16 = e.dtype == "BF16";
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, bytes + 2 * n + 2 * i, 2);
    const float f = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    std::memcpy(bytes + 4 * i, &f, 4);
  }
  return t;
}

}  // namespace stp
