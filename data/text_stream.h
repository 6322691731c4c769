// Encoding a text file of any size in bounded memory (stp tokenize): the file is read in chunks
// of about chunk_bytes, each cut at a safe cut (BpeTokenizer::stream_cut) and encoded on its own
// (in parallel over the cores, as BpeTokenizer::encode does), so the ids are exactly those of
// encode(the whole file). Memory is a few chunks' worth whatever the file's size; a stretch of
// text without a safe cut (no newline between two printable ASCII characters) is read whole, and
// so is the whole file for a tokenizer without safe cuts (BpeTokenizer::stream_cuts()).
//
// The file must be a regular file (base/file_io.h) and valid UTF-8: an invalid byte is an
// stp::Error naming the file, the byte and its offset in the file (and `invalid_hint`), unless
// replace_invalid, which substitutes U+FFFD for each ill-formed subsequence as
// utf8::replace_invalid does on the whole file (a cut is a newline, which no ill-formed
// subsequence spans, so the chunks' substitutions are the whole file's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"

namespace stp {

struct TextStreamOptions {
  std::size_t chunk_bytes = std::size_t(16) << 20;  // >= 1; tests force tiny chunks
  bool replace_invalid = false;
  std::string invalid_hint;  // appended to the invalid-UTF-8 message
};

// Calls emit with the ids of each chunk, in order, and progress(bytes of the file encoded) after
// each; returns the file's size. `what` names the file's role in messages ("INPUT").
std::uint64_t encode_text_file(const BpeTokenizer& tok, const std::string& path, const std::string& what,
                               const TextStreamOptions& options,
                               const std::function<void(const std::vector<std::int32_t>&)>& emit,
                               const std::function<void(std::uint64_t)>& progress = {});

}  // namespace stp
