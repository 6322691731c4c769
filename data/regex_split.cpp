#include "data/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"
#include "data/utf8.h"

namespace stp {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? str("PCRE2 error ", code) : std::string(reinterpret_cast<char*>(buf), std::size_t(n));
}

// Per-call matching state: match data and a JIT stack large enough for long whitespace runs.
struct Matcher {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  explicit Matcher(const pcre2_code* code, bool jit) {
    data = pcre2_match_data_create_from_pattern(code, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (jit) {
      stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    STP_CHECK(data && context && (!jit || stack), "tokenizer: out of memory for PCRE2 match data");
  }
  ~Matcher() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;
};

}  // namespace

RegexSplitter::RegexSplitter(const std::string& pattern) {
  if (pattern.empty()) return;
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &offset, nullptr);
  STP_CHECK(code != nullptr, "tokenizer: the pre-split pattern does not compile with PCRE2 at offset ", offset, ": ",
            pcre2_message(err), " (pattern: ", pattern, ")");
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::scan(std::string_view subject, std::size_t from, std::size_t to,
                         std::vector<std::size_t>& ends) const {
  const std::size_t n = subject.size();
  if (from >= n) return;
  if (!code_) {
    ends.push_back(n);
    return;
  }
  const auto* code = static_cast<const pcre2_code*>(code_);
  Matcher m(code, jit_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t piece = from;  // start of the current piece (a boundary)
  std::size_t at = from;     // where the next search starts
  while (piece < to) {
    // pcre2_jit_match skips pcre2_match's option checks (the subject was validated by the caller).
    int rc = jit_ ? pcre2_jit_match(code, s, n, at, PCRE2_NO_UTF_CHECK, m.data, m.context)
                  : pcre2_match(code, s, n, at, PCRE2_NO_UTF_CHECK, m.data, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      ends.push_back(n);
      return;
    }
    STP_CHECK(rc >= 0, "tokenizer: PCRE2 matching failed at byte ", at, ": ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    const std::size_t ms = ov[0], me = ov[1];
    if (me <= ms) {  // an empty match cuts nothing: search again one character on
      if (ms >= n) {
        ends.push_back(n);
        return;
      }
      std::size_t len = utf8::sequence_length(subject, ms);
      at = ms + (len ? len : 1);
      continue;
    }
    if (ms > piece) ends.push_back(ms);
    ends.push_back(me);
    piece = at = me;
  }
}

}  // namespace stp
