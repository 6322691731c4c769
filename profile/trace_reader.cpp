#include "profile/trace_reader.h"

#include <charconv>
#include <cstdio>
#include <memory>
#include <unordered_map>

#include "base/error.h"

namespace stp::profile {

namespace {

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Interns strings into Trace::strings.
class Interner {
 public:
  explicit Interner(Trace& t) : t_(t) {
    for (std::uint32_t i = 0; i < t_.strings.size(); ++i) ids_.emplace(t_.strings[i], i);
  }
  std::uint32_t operator()(std::string_view s) {
    auto it = ids_.find(s);
    if (it != ids_.end()) return it->second;
    auto id = static_cast<std::uint32_t>(t_.strings.size());
    t_.strings.emplace_back(s);
    ids_.emplace(std::string(s), id);
    return id;
  }

 private:
  Trace& t_;
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> ids_;
};

// A thread of the trace: (pid, tid) where a string tid is stored as -(interned id) - 1.
struct ThreadKey {
  int pid;
  std::int64_t tid;
  bool operator==(const ThreadKey&) const = default;
};
struct ThreadHash {
  std::size_t operator()(const ThreadKey& k) const {
    return std::hash<std::int64_t>{}(k.tid * 1000003 + k.pid);
  }
};

// Assigns lanes once the whole file is read: thread_name metadata may come after the spans.
class Threads {
 public:
  std::uint32_t index(ThreadKey k) {
    auto [it, fresh] = index_.try_emplace(k, static_cast<std::uint32_t>(keys_.size()));
    if (fresh) {
      keys_.push_back(k);
      names_.push_back(0);
    }
    return it->second;
  }
  void name(ThreadKey k, std::uint32_t name_id) { names_[index(k)] = name_id; }
  std::vector<Lane> lanes(const Trace& t) const {
    std::vector<Lane> out(keys_.size(), Lane::Other);
    for (std::size_t i = 0; i < keys_.size(); ++i) {
      if (names_[i]) out[i] = lane_of_stream(t.str(names_[i]));
      else if (keys_[i].tid < 0) out[i] = lane_of_stream(t.str(static_cast<std::uint32_t>(-keys_[i].tid - 1)));
      else if (keys_[i].tid >= 1 && keys_[i].tid <= 5) out[i] = static_cast<Lane>(keys_[i].tid - 1);  // base/trace.h ids
    }
    return out;
  }

 private:
  std::unordered_map<ThreadKey, std::uint32_t, ThreadHash> index_;
  std::vector<ThreadKey> keys_;
  std::vector<std::uint32_t> names_;
};

class Reader {
 public:
  Reader(std::string_view text, const std::string& source, Trace& out)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), source_(source), t_(out), intern_(out) {}

  void read() {
    ws();
    if (p_ < end_ && *p_ == '[') {
      events();
    } else {
      expect('{');
      bool found = false;
      if (!eat('}')) {
        do {
          std::string_view key = string();
          expect(':');
          if (key == "traceEvents") {
            events();
            found = true;
          } else {
            skip_any();
          }
        } while (eat(','));
        expect('}');
      }
      if (!found) throw Error(str("trace '", source_, "' has no \"traceEvents\" array (not a Chrome trace?)"));
    }
    ws();
    if (p_ != end_) fail("unexpected text after the trace");
    std::vector<Lane> lanes = threads_.lanes(t_);
    for (std::size_t i = 0; i < t_.spans.size(); ++i) t_.spans[i].lane = lanes[span_thread_[i]];
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    if (p_ >= end_)
      throw Error(str("trace '", source_, "' is truncated: it ends after ", end_ - begin_, " bytes inside the trace (",
                      what, "); was the run interrupted while writing it?"));
    throw Error(str("trace '", source_, "' is not valid JSON at byte ", p_ - begin_, ": ", what));
  }

  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(str("expected '", c, "'"));
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  unsigned hex4() {
    if (end_ - p_ < 4) fail("short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      int h = hex(p_[i]);
      if (h < 0) fail("bad \\u escape");
      v = v * 16 + static_cast<unsigned>(h);
    }
    p_ += 4;
    return v;
  }
  void utf8(unsigned cp) {
    if (cp < 0x80) {
      scratch_ += static_cast<char>(cp);
    } else if (cp < 0x800) {
      scratch_ += static_cast<char>(0xC0 | (cp >> 6));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      scratch_ += static_cast<char>(0xE0 | (cp >> 12));
      scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      scratch_ += static_cast<char>(0xF0 | (cp >> 18));
      scratch_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // A string's contents: a view into the text when it has no escapes, else decoded into scratch_
  // (valid until the next call).
  std::string_view string() {
    ws();
    if (p_ >= end_ || *p_ != '"') fail("expected a string");
    const char* s = ++p_;
    while (p_ < end_ && *p_ != '"' && *p_ != '\\') {
      if (static_cast<unsigned char>(*p_) < 0x20) fail("control character in a string");
      ++p_;
    }
    if (p_ >= end_) fail("unterminated string");
    if (*p_ == '"') return {s, static_cast<std::size_t>(p_++ - s)};
    scratch_.assign(s, p_);
    while (p_ < end_ && *p_ != '"') {
      char c = *p_++;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        scratch_ += c;
        continue;
      }
      if (p_ >= end_) break;
      char e = *p_++;
      switch (e) {
        case '"': scratch_ += '"'; break;
        case '\\': scratch_ += '\\'; break;
        case '/': scratch_ += '/'; break;
        case 'b': scratch_ += '\b'; break;
        case 'f': scratch_ += '\f'; break;
        case 'n': scratch_ += '\n'; break;
        case 'r': scratch_ += '\r'; break;
        case 't': scratch_ += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
            p_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(cp);
          break;
        }
        default: --p_; fail("bad escape");
      }
    }
    if (p_ >= end_) fail("unterminated string");
    ++p_;
    return scratch_;
  }

  double number() {
    ws();
    double v = 0;
    auto [q, ec] = std::from_chars(p_, end_, v);
    if (ec != std::errc() || q == p_) fail("expected a number");
    p_ = q;
    return v;
  }

  bool peek_string() {
    ws();
    return p_ < end_ && *p_ == '"';
  }

  void literal(const char* word) {
    for (const char* w = word; *w; ++w, ++p_)
      if (p_ >= end_ || *p_ != *w) fail(str("expected ", word));
  }

  struct Fields {
    char ph = 0;
    bool has_pid = false, has_ts = false, has_dur = false;
    int pid = 0;
    std::int64_t tid = 0;
    std::uint32_t name = 0, cat = 0, part = 0, meta_name = 0;
    double ts = 0, dur = 0, bytes = -1;
    int chunk = -1, mb = -1;
  };

  void events() {
    expect('[');
    if (eat(']')) return;
    do event();
    while (eat(','));
    expect(']');
  }

  void args(Fields& f, std::uint32_t& values_begin) {
    expect('{');
    values_begin = static_cast<std::uint32_t>(t_.values.size());
    if (eat('}')) return;
    do {
      std::string_view key = string();
      expect(':');
      if (peek_string()) {
        // Keep the key before string() may reuse scratch_ for the value.
        if (key == "part") f.part = intern_(string());
        else if (key == "name") f.meta_name = intern_(string());
        else string();
        continue;
      }
      ws();
      if (p_ < end_ && (*p_ == '-' || (*p_ >= '0' && *p_ <= '9'))) {
        std::uint32_t key_id = intern_(key);
        double v = number();
        const std::string& k = t_.str(key_id);
        if (k == "bytes") f.bytes = v;
        else if (k == "chunk") f.chunk = static_cast<int>(v);
        else if (k == "mb") f.mb = static_cast<int>(v);
        t_.values.emplace_back(key_id, v);  // counters keep every numeric series
        continue;
      }
      skip_any();
    } while (eat(','));
    expect('}');
  }

  void skip_any() {
    stack_.clear();
    skip_with_stack();
  }

  // Skips any value, iteratively with an explicit container stack (no recursion on deep nesting).
  void skip_with_stack() {
    std::size_t base = stack_.size();
    do {
      ws();
      if (p_ >= end_) fail("expected a value");
      char c = *p_;
      if (c == '{' || c == '[') {
        ++p_;
        ws();
        if (p_ < end_ && (*p_ == (c == '{' ? '}' : ']'))) {
          ++p_;
        } else {
          stack_.push_back(c);
          if (c == '{') {
            string();
            expect(':');
          }
          continue;
        }
      } else if (c == '"') {
        string();
      } else if (c == 't') {
        literal("true");
      } else if (c == 'f') {
        literal("false");
      } else if (c == 'n') {
        literal("null");
      } else {
        number();
      }
      while (stack_.size() > base) {
        ws();
        if (p_ >= end_) fail("unterminated array or object");
        char open = stack_.back();
        if (*p_ == ',') {
          ++p_;
          if (open == '{') {
            string();
            expect(':');
          }
          break;
        }
        if (*p_ == (open == '{' ? '}' : ']')) {
          ++p_;
          stack_.pop_back();
          continue;
        }
        fail(str("expected ',' or '", open == '{' ? '}' : ']', "'"));
      }
    } while (stack_.size() > base);
  }

  void event() {
    const char* start = p_;
    expect('{');
    Fields f;
    std::uint32_t values_begin = static_cast<std::uint32_t>(t_.values.size());
    bool has_args = false;
    if (!eat('}')) {
      do {
        std::string_view key = string();
        expect(':');
        if (key.size() == 2 && key == "ph") {
          std::string_view v = string();
          f.ph = v.empty() ? '?' : v[0];
        } else if (key == "pid") {
          if (peek_string()) fail("\"pid\" must be a number (the rank)");
          f.pid = static_cast<int>(number());
          f.has_pid = true;
        } else if (key == "tid") {
          if (peek_string()) f.tid = -static_cast<std::int64_t>(intern_(string())) - 1;
          else f.tid = static_cast<std::int64_t>(number());
        } else if (key == "ts") {
          f.ts = number();
          f.has_ts = true;
        } else if (key == "dur") {
          f.dur = number();
          f.has_dur = true;
        } else if (key == "name") {
          f.name = intern_(string());
        } else if (key == "cat") {
          f.cat = intern_(string());
        } else if (key == "args") {
          ws();
          if (p_ < end_ && *p_ == '{') {
            args(f, values_begin);
            has_args = true;
          } else {
            skip_any();
          }
        } else {
          skip_any();
        }
      } while (eat(','));
      expect('}');
    }
    auto at = [&] { return str(" (event at byte ", start - begin_, ")"); };
    switch (f.ph) {
      case 'X': {
        if (!f.has_ts || !f.has_dur) throw Error(str("trace '", source_, "': an \"X\" event without \"ts\" or \"dur\"", at()));
        if (f.dur < 0) throw Error(str("trace '", source_, "': an \"X\" event with negative \"dur\"", at()));
        Span s;
        s.ts = f.ts;
        s.end = f.ts + f.dur;
        s.pid = f.pid;
        s.kind = kind_of_category(t_.str(f.cat));
        s.name = f.name;
        s.part = f.part;
        s.bytes = f.bytes;
        s.chunk = f.chunk;
        s.mb = f.mb;
        t_.spans.push_back(s);
        span_thread_.push_back(threads_.index({f.pid, f.tid}));
        t_.values.resize(values_begin);  // span args are not counter series
        return;
      }
      case 'C': {
        if (!f.has_ts) throw Error(str("trace '", source_, "': a \"C\" event without \"ts\"", at()));
        Counter c;
        c.ts = f.ts;
        c.pid = f.pid;
        c.track = f.name;
        c.begin = values_begin;
        c.end = static_cast<std::uint32_t>(t_.values.size());
        if (has_args) t_.counters.push_back(c);
        return;
      }
      case 'M':
        if (t_.str(f.name) == "thread_name" && f.meta_name) threads_.name({f.pid, f.tid}, f.meta_name);
        break;
      default:
        break;
    }
    t_.values.resize(values_begin);
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const std::string& source_;
  Trace& t_;
  Interner intern_;
  Threads threads_;
  std::vector<std::uint32_t> span_thread_;
  std::string scratch_;
  std::vector<char> stack_;
};

}  // namespace

Trace parse_trace(std::string_view json, const std::string& source) {
  Trace t;
  Reader(json, source, t).read();
  return t;
}

Trace read_trace_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  STP_CHECK(f, "cannot open trace '", path, "' (does the run have output.trace: true?)");
  std::string text;
  char buf[1 << 16];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f.get())) > 0;) text.append(buf, n);
  STP_CHECK(!std::ferror(f.get()), "error while reading trace '", path, "'");
  STP_CHECK(!text.empty(), "trace '", path, "' is empty (was the run interrupted while writing it?)");
  return parse_trace(text, path);
}

Trace from_recorder(const TraceRecorder& recorder) {
  return parse_trace(recorder.to_json(), "the in-memory trace");
}

}  // namespace stp::profile
