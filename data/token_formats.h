// The token file formats of data.format as shard formats (data/mapped_tokens.h), each file of a
// data path parsed and checked on its own (data/data.h lists the formats):
//   text   1 byte per token, no header.
//   u16    2 bytes per token, no header; an odd size is an error. A file that is, header and
//          size, an llm.c token file is refused too (data.format llmc reads it; read as u16 its
//          header would become 512 tokens).
//   llmc   2 bytes per token after llm.c's 1024-byte header (magic, version, count), whose count
//          must agree with the size; a tok32 file is named as one.
//   tok32  4 bytes per token after the 32-byte header (data/token_file.h), which records the
//          vocabulary bound; an llm.c file is named as one.
// Every error is an stp::Error naming the file, the field, the value and what was expected.
#pragma once

#include <string>

#include "data/mapped_tokens.h"

namespace stp {

ShardFormat token_format(const std::string& format);  // text | u16 | llmc | tok32

}  // namespace stp
