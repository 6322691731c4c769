// Op constructors, printing and parsing of op strings (docs/design.md, Op strings).
#include "schedule/op.h"

#include <cctype>

#include "base/error.h"

namespace stp::sched {

static Part make_part(Pass pass, int chunk, int mb, bool defer_w = false) {
  Part p;
  p.pass = pass;
  p.chunk = chunk;
  p.mb = mb;
  p.defer_w = defer_w;
  return p;
}

Op Op::f(int chunk, int mb) { return Op{OpKind::F, make_part(Pass::F, chunk, mb), {}, {}}; }
Op Op::bwd(int chunk, int mb, bool defer_w) { return Op{OpKind::B, make_part(Pass::B, chunk, mb, defer_w), {}, {}}; }
Op Op::w(int chunk, int mb) { return Op{OpKind::W, make_part(Pass::W, chunk, mb), {}, {}}; }
Op Op::fb(int f_chunk, int f_mb, int b_chunk, int b_mb, bool defer_w) {
  return Op{OpKind::FB, make_part(Pass::F, f_chunk, f_mb), make_part(Pass::B, b_chunk, b_mb, defer_w), {}};
}
Op Op::fw(int f_chunk, int f_mb, int w_chunk, int w_mb) {
  return Op{OpKind::FW, make_part(Pass::F, f_chunk, f_mb), make_part(Pass::W, w_chunk, w_mb), {}};
}
Op Op::ff(int chunk, int mb1, int mb2) {
  return Op{OpKind::FF, make_part(Pass::F, chunk, mb1), make_part(Pass::F, chunk, mb2), {}};
}

std::string to_string(const Part& part) {
  static const char kLetter[] = {'F', 'B', 'W'};
  std::string s = str(kLetter[static_cast<int>(part.pass)], part.chunk, '.', part.mb);
  if (part.pass == Pass::B && part.defer_w) s += '*';
  return s;
}

std::string to_string(const Op& op) {
  switch (op.kind) {
    case OpKind::F:
    case OpKind::B:
    case OpKind::W: return to_string(op.a);
    case OpKind::FB:
    case OpKind::FW: return to_string(op.a) + "&" + to_string(op.b);
    case OpKind::FF: return to_string(op.a) + "+" + to_string(op.b);
  }
  return "?";
}

std::string join_ops(const std::vector<Op>& ops) {
  std::string s;
  for (const Op& op : ops) {
    if (!s.empty()) s += ' ';
    s += to_string(op);
  }
  return s;
}

namespace {

// Reads one decimal number at text[i]; advances i.
bool read_int(std::string_view text, std::size_t& i, int& out) {
  std::size_t start = i;
  long v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && v < 100000000) {
    v = v * 10 + (text[i] - '0');
    ++i;
  }
  out = static_cast<int>(v);
  return i > start;
}

// One part "F0.3" / "B1.4*" / "W1.2" starting at text[i].
Part read_part(std::string_view text, std::size_t& i, std::string_view whole) {
  STP_CHECK(i < text.size(), "malformed op '", whole, "': missing part after '&' or '+'");
  Pass pass;
  switch (text[i]) {
    case 'F': pass = Pass::F; break;
    case 'B': pass = Pass::B; break;
    case 'W': pass = Pass::W; break;
    default: throw Error(str("malformed op '", whole, "': expected F, B or W at position ", i));
  }
  ++i;
  int chunk = 0, mb = 0;
  bool ok = read_int(text, i, chunk) && i < text.size() && text[i++] == '.' && read_int(text, i, mb);
  STP_CHECK(ok, "malformed op '", whole, "': expected <letter><chunk>.<microbatch>, e.g. F0.3");
  STP_CHECK(mb >= 1, "malformed op '", whole, "': microbatches are 1-based");
  bool defer = false;
  if (i < text.size() && text[i] == '*') {
    STP_CHECK(pass == Pass::B, "malformed op '", whole, "': only a B can defer its W ('*')");
    defer = true;
    ++i;
  }
  return make_part(pass, chunk, mb, defer);
}

}  // namespace

Op parse_op(std::string_view text) {
  std::size_t i = 0;
  Op op;
  op.a = read_part(text, i, text);
  if (i == text.size()) {
    op.kind = op.a.pass == Pass::F ? OpKind::F : op.a.pass == Pass::B ? OpKind::B : OpKind::W;
    return op;
  }
  char sep = text[i++];
  STP_CHECK(sep == '&' || sep == '+', "malformed op '", text, "': unexpected '", sep, "'");
  op.b = read_part(text, i, text);
  STP_CHECK(i == text.size(), "malformed op '", text, "': trailing characters");
  STP_CHECK(op.a.pass == Pass::F, "malformed op '", text, "': a block starts with its forward");
  if (sep == '+') {
    STP_CHECK(op.b.pass == Pass::F && op.b.chunk == op.a.chunk, "malformed op '", text,
              "': '+' joins two forwards of the same chunk");
    op.kind = OpKind::FF;
  } else {
    STP_CHECK(op.b.pass != Pass::F, "malformed op '", text, "': '&' braids a forward with a B or a W");
    op.kind = op.b.pass == Pass::B ? OpKind::FB : OpKind::FW;
  }
  return op;
}

std::vector<Op> parse_ops(std::string_view text) {
  std::vector<Op> ops;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    std::size_t j = i;
    while (j < text.size() && text[j] != ' ') ++j;
    if (j > i) ops.push_back(parse_op(text.substr(i, j - i)));
    i = j;
  }
  return ops;
}

}  // namespace stp::sched
