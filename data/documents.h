// Documents for stp tokenize: what a JSONL record becomes, and encoding many of them at once.
//
// A Document is a list of parts, each either text (encoded on its own: a part's first and last
// bytes are token boundaries) or one token id, each with its mask byte (1: its tokens count as
// targets, data/token_writer.h). The parts of a JSONL record (docs/config.md, Fine-tuning data):
//   text               [text 1]
//   prompt/completion  [prompt 0] [completion 1] [EOT 1]
//   messages, ChatML   per message [<|im_start|> 0] [role "\n" 0] [content A] [<|im_end|> A] ["\n" 0],
//                      then [EOT 0]; A = 1 for role "assistant", else 0. Used when the tokenizer has
//                      the tokens <|im_start|> and <|im_end|> (Qwen2).
//   messages, plain    per message [role ": " 0] [content A], then for "assistant" [EOT 1], else
//                      ["\n" 0]; then [EOT 0] unless the last message was the assistant's.
// Text documents carry no EOT of their own: stp tokenize puts one between documents.
//
// Errors (stp::Error) name the file and the line: invalid JSON (nlohmann's reason and column),
// a line that is not an object, a missing field, a field of the wrong type, a message that is
// not an object with string "role" and "content".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/file_reader.h"

namespace stp {

struct DocPart {
  std::string text;          // encoded when token < 0
  std::int32_t token = -1;   // one token id
  std::uint8_t counted = 1;  // mask byte of its tokens
};
using Document = std::vector<DocPart>;

enum class JsonlKind { Text, PromptCompletion, Messages };

struct JsonlSchema {
  JsonlKind kind = JsonlKind::Text;
  std::string text_field = "text";
  std::string prompt_field, completion_field;
  std::string messages_field = "messages";
  std::int32_t eot = -1;                    // needed by PromptCompletion and Messages
  std::int32_t im_start = -1, im_end = -1;  // both >= 0: the ChatML template, else the plain one
};

// The document of JSONL line `line_no` (1-based) of `path`; false for a blank line (skipped).
bool jsonl_document(std::string_view line, const std::string& path, std::uint64_t line_no, const JsonlSchema& schema,
                    Document& doc);

// The documents of JSONL lines (their 1-based numbers in line_nos) of `path`, parsed in parallel;
// blank lines are skipped. Throws the error of the first bad line.
void jsonl_documents(const std::vector<std::string>& lines, const std::vector<std::uint64_t>& line_nos,
                     const std::string& path, const JsonlSchema& schema, std::vector<Document>& docs);

// Encodes docs (in parallel over documents and within long texts) and appends their ids and the
// mask byte of each id, in order.
void encode_documents(const BpeTokenizer& tok, const std::vector<Document>& docs, std::vector<std::int32_t>& ids,
                      std::vector<std::uint8_t>& mask);

// Reads a file's lines (split at '\n'; a trailing '\r' is kept, JSON treats it as whitespace)
// in blocks, so memory is one block and the longest line. A regular file (base/file_io.h).
class LineReader {
 public:
  LineReader(const std::string& path, const std::string& what) : file_(path, what) {}
  // The next line (without its '\n'); false at the end of the file.
  bool next(std::string& line);
  std::uint64_t line_no() const { return line_no_; }  // of the line last returned, 1-based
  std::uint64_t offset() const { return consumed_; }  // bytes of the file returned so far
  std::uint64_t size() const { return file_.size(); }

 private:
  bool fill();
  FileReader file_;
  std::string buf_;
  std::size_t pos_ = 0;
  std::uint64_t line_no_ = 0, consumed_ = 0;
};

}  // namespace stp
