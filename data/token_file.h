// Writing token files (stp tokenize) and reading the wide format (data.format tok32).
//
// llmc   llm.c's format: 256 little-endian int32 (magic 20240520, version 1, token count, zeros),
//        then the uint16 tokens. Read by data/data.cpp.
// tok32  stp's wide format, for vocabularies beyond 65536 ids (Qwen2 has 151k), little-endian:
//          bytes  0..7   magic "STPTOK32"
//          bytes  8..11  uint32 version = 1
//          bytes 12..15  uint32 vocab_size: every id is < vocab_size
//          bytes 16..23  uint64 token count N
//          bytes 24..31  uint64 reserved, 0
//          bytes 32..    N uint32 ids
//        The reader rejects (stp::Error, naming the file and the field) a file shorter than the
//        header, another magic or version, a nonzero reserved field, a size other than 32 + 4 N,
//        and an id >= vocab_size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stp {

// Writes ids as llmc when vocab_size <= 65536, else tok32; returns the format written. The file
// appears whole or not at all (data/token_writer.h, which writes them as the ids arrive).
std::string write_token_file(const std::string& path, const std::vector<std::int32_t>& ids, std::int32_t vocab_size);

// The ids of a tok32 file whose bytes are `bytes` (path for messages).
std::vector<std::uint32_t> parse_tok32(const std::string& bytes, const std::string& path);

}  // namespace stp
