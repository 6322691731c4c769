// Reading a file in blocks, front to back (data/text_stream.h, data/documents.h). The file must be
// a regular file (base/file_io.h: a device or FIFO is refused by kind before it is opened), and
// is read no further than the size it had when it was opened, so a file that grows meanwhile
// cannot keep it reading; one that shrinks ends early. Errors (stp::Error) name the file and,
// first, `what` names its role ("INPUT").
#pragma once

#include <cstdint>
#include <string>

namespace stp {

class FileReader {
 public:
  FileReader(const std::string& path, const std::string& what);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  std::uint64_t size() const { return size_; }  // when it was opened
  bool done() const { return left_ == 0; }
  // Appends the next min(n, bytes left) bytes to buf; returns how many.
  std::size_t read(std::string& buf, std::size_t n);

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0, left_ = 0;
};

}  // namespace stp
