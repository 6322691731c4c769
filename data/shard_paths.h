// The files a data path names (data.path, data.val_path, or a path of their shape), in the order
// their contents are concatenated into one stream:
//   a regular file (a symlink to one is followed): that file;
//   a folder: its regular files for which keep(file name) holds, sorted by file name (byte
//     order); symlinks and subfolders in it are skipped;
//   a path that does not exist and holds a glob character (`*`, `?` or `[`): the paths matching it
//     as a glob(3) pattern (`data/fineweb_train_*.bin`), sorted by path (byte order); each must be
//     a regular file (symlinks followed), and keep() is not applied: the pattern chose them.
// Errors (stp::Error; `what` names the path, e.g. "data: data.path"): a path that does not exist
// and is no glob, a device or FIFO (refused by kind: base/file_io.h), a folder with no file to
// keep (the message says which files count: `kept`, e.g. "regular files to read as data.format
// text"), a glob that matches nothing, a match that is not a regular file.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace stp {

std::vector<std::string> shard_paths(const std::string& path, const std::string& what, const std::string& kept,
                                     const std::function<bool(const std::string& file_name)>& keep = {});

}  // namespace stp
