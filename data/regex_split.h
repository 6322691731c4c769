// The pre-split of a byte-level BPE tokenizer: a PCRE2 pattern (compiled with UTF and UCP, so
// \p{L}, \p{N} and \s follow Unicode properties; JIT-compiled where PCRE2 supports it) cuts text
// into pieces. Every match is a piece, and so is every stretch between matches (HF's "Isolated"
// split); empty matches cut nothing.
//
// scan() is a pure function of the position it starts from: the pieces found from a piece boundary
// on do not depend on what came before it (the subject is always the whole segment, so look-behind
// and look-ahead see across the scanned range). BpeTokenizer relies on this to scan chunks of one
// text in parallel and join them where their cuts agree.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace stp {

class RegexSplitter {
 public:
  // An empty pattern makes every segment one piece. Throws stp::Error naming the pattern, the
  // offset and PCRE2's message when it does not compile.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Scans subject (valid UTF-8) from `from`, a piece boundary, and appends the end offset of each
  // piece to `ends`, stopping after the first end >= to (to <= subject.size()). Thread-safe.
  void scan(std::string_view subject, std::size_t from, std::size_t to, std::vector<std::size_t>& ends) const;

  bool jit() const { return jit_; }

 private:
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

}  // namespace stp
