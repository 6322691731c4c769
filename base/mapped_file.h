// A regular file mapped read-only into the address space (mmap(2), PROT_READ, MAP_SHARED): its
// bytes are read from the page cache when touched, never copied whole, and every process that maps
// the same file shares the same cached pages.
//
// The constructor refuses what base/file_io.h's check_regular_file() refuses (a device, a FIFO, a
// folder, a missing path), by kind and before it is opened; `what` names the path in messages as
// there ("data: data.path"). The size is the one the opened file has (fstat), so the mapping and
// its size agree. A file of 0 bytes maps nothing (bytes() is empty). Errors are stp::Error naming
// the path and the system's reason.
//
// The file must not shrink while it is mapped: reading a page past its new end raises SIGBUS, as
// for every reader that maps files. Move-only; the destructor unmaps.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stp {

class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  std::uint64_t size() const { return size_; }

  // Tells the kernel that reads will be scattered (madvise MADV_RANDOM): no read-ahead around a
  // touched page. A hint only.
  void advise_random() const;

  // Drops the pages of bytes [offset, offset + size), and the others of the 2 MiB-aligned blocks
  // that hold them (a fault maps more than the page it touched), from this process's resident
  // set (madvise MADV_DONTNEED): they stay in the page cache and are read again if touched, so
  // this never changes what is read. Readers that release what they have read keep their resident
  // memory small however much of the file they read.
  void release(std::uint64_t offset, std::uint64_t size) const;

 private:
  std::string path_;
  void* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace stp
