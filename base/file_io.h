// Whole files in and out, with the two guarantees stp's commands rely on (docs/design.md, Files).
//
// Reading: stp reads only files whose size it knows. read_regular_file() and
// check_regular_file() take a regular file (symlinks followed) and refuse anything else by kind
// before a byte is read: a character or block device (/dev/zero never ends), a FIFO or socket (a
// stream: no size, and opening a FIFO blocks until something writes to it), a folder. The read
// takes exactly the size the file had when it was opened, so a file that grows meanwhile cannot
// keep it reading. `what` is how the message names the path, the key or argument that gave it
// ("data: data.path", "tokenizer:"); errors are stp::Error: "WHAT 'PATH' is a character device,
// not a regular file ...".
//
// Writing: write_file_atomic() writes the bytes into a temporary file in the destination's folder,
// flushes it to the disk and renames it onto the destination, so the destination is the complete
// new file or, after any failure (a full disk, a crash), whatever it was before: never a truncated
// one, and no temporary is left behind. An existing destination keeps its permission bits; a
// symlink keeps pointing where it did (the file it names is replaced). A destination that is a
// device or FIFO (/dev/stdout, /dev/null) has nothing to replace and is written into directly.
// A folder, a missing folder or a failed write is an stp::Error naming the path and the reason.
#pragma once

#include <string>
#include <string_view>

namespace stp {

// "a character device", "a FIFO", ... : the kind of a path that is not a regular file, for
// messages; "" for a regular file, "missing" when nothing is there.
std::string file_kind(const std::string& path);

void check_regular_file(const std::string& path, const std::string& what);
std::string read_regular_file(const std::string& path, const std::string& what);

void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace stp
