#include "profile/trace_reader.h"

#include <simdjson.h>

#include <cstdio>
#include <memory>
#include <unordered_map>

#include "base/error.h"
#include "base/trace_names.h"

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
  std::size_t operator()(const ThreadKey& k) const { return std::hash<std::int64_t>{}(k.tid * 1000003 + k.pid); }
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
      else if (keys_[i].tid >= 1 && keys_[i].tid <= 5)
        out[i] = static_cast<Lane>(keys_[i].tid - 1);  // base/trace.h ids
    }
    return out;
  }

 private:
  std::unordered_map<ThreadKey, std::uint32_t, ThreadHash> index_;
  std::vector<ThreadKey> keys_;
  std::vector<std::uint32_t> names_;
};

namespace od = simdjson::ondemand;

// The fields of one event that the profile keeps.
struct Fields {
  char ph = 0;
  int pid = 0;
  std::int64_t tid = 0;
  std::uint32_t name = 0, cat = 0, part = 0, meta_name = 0;
  bool has_ts = false, has_dur = false;
  double ts = 0, dur = 0, bytes = -1;
  int chunk = -1, mb = -1;
};

// Walks the document with simdjson's On Demand API: values the profile does not keep are skipped
// by the iterator, never materialised.
class Reader {
 public:
  Reader(od::document& doc, const char* begin, const std::string& source, Trace& out)
      : doc_(doc), begin_(begin), source_(source), t_(out), intern_(out) {}

  void read() {
    od::document& doc = doc_;
    if (doc.type() == od::json_type::array) {
      events(doc.get_array());
    } else {
      bool found = false;
      for (auto field : doc.get_object()) {
        if (std::string_view(field.unescaped_key()) == "traceEvents") {
          events(field.value().get_array());
          found = true;
        }  // any other key: skipped
      }
      if (!found) throw Error(str("trace '", source_, "' has no \"traceEvents\" array (not a Chrome trace?)"));
    }
    const char* rest = nullptr;  // current_location() fails once every token has been read
    if (doc.current_location().get(rest) == simdjson::SUCCESS)
      throw simdjson::simdjson_error(simdjson::TRAILING_CONTENT);
    std::vector<Lane> lanes = threads_.lanes(t_);
    for (std::size_t i = 0; i < t_.spans.size(); ++i) t_.spans[i].lane = lanes[span_thread_[i]];
  }

 private:
  void events(od::array list) {
    for (auto e : list) event(e.get_object());
  }

  void args(od::object obj, Fields& f) {
    for (auto field : obj) {
      std::string_view key = field.unescaped_key();
      od::value v = field.value();
      switch (v.type()) {
        case od::json_type::string:
          if (key == trace::arg::kPart) f.part = intern_(v.get_string());
          else if (key == "name") f.meta_name = intern_(v.get_string());
          break;
        case od::json_type::number: {
          std::uint32_t key_id = intern_(key);
          double x = v.get_double();
          if (key == trace::arg::kBytes) f.bytes = x;
          else if (key == trace::arg::kChunk) f.chunk = static_cast<int>(x);
          else if (key == trace::arg::kMb) f.mb = static_cast<int>(x);
          t_.values.emplace_back(key_id, x);  // counters keep every numeric series
          break;
        }
        default: break;  // skipped
      }
    }
  }

  void event(od::object obj) {
    const char* start = nullptr;
    if (doc_.current_location().get(start) != simdjson::SUCCESS) start = nullptr;  // for error messages only
    Fields f;
    auto values_begin = static_cast<std::uint32_t>(t_.values.size());
    bool has_args = false;
    for (auto field : obj) {
      std::string_view key = field.unescaped_key();
      od::value v = field.value();
      if (key == "ph") {
        std::string_view ph = v.get_string();
        f.ph = ph.empty() ? '?' : ph[0];
      } else if (key == "pid") {
        if (v.type() != od::json_type::number)
          throw Error(str("trace '", source_, "': \"pid\" must be a number (the rank)", at(start)));
        f.pid = static_cast<int>(v.get_double());
      } else if (key == "tid") {
        if (v.type() == od::json_type::string) f.tid = -static_cast<std::int64_t>(intern_(v.get_string())) - 1;
        else f.tid = static_cast<std::int64_t>(v.get_double());
      } else if (key == "ts") {
        f.ts = v.get_double();
        f.has_ts = true;
      } else if (key == "dur") {
        f.dur = v.get_double();
        f.has_dur = true;
      } else if (key == "name") {
        f.name = intern_(v.get_string());
      } else if (key == "cat") {
        f.cat = intern_(v.get_string());
      } else if (key == "args" && v.type() == od::json_type::object) {
        args(v.get_object(), f);
        has_args = true;
      }  // any other key: skipped
    }
    switch (f.ph) {
      case 'X': {
        if (!f.has_ts || !f.has_dur)
          throw Error(str("trace '", source_, "': an \"X\" event without \"ts\" or \"dur\"", at(start)));
        if (f.dur < 0) throw Error(str("trace '", source_, "': an \"X\" event with negative \"dur\"", at(start)));
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
        if (!f.has_ts) throw Error(str("trace '", source_, "': a \"C\" event without \"ts\"", at(start)));
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
      default: break;
    }
    t_.values.resize(values_begin);
  }

  std::string at(const char* start) const {
    return start ? str(" (event at byte ", start - begin_, ")") : std::string();
  }

  od::document& doc_;
  const char* begin_;
  const std::string& source_;
  Trace& t_;
  Interner intern_;
  Threads threads_;
  std::vector<std::uint32_t> span_thread_;
};

enum class Ending { Complete, Truncated, TextAfter };

// How the text ends, for the error message once simdjson has refused it: inside a string or an
// open bracket (an interrupted writer), with text after the closing bracket, or complete.
Ending ending_of(const char* data, std::size_t size) {
  int depth = 0;
  bool in_string = false, started = false;
  for (std::size_t i = 0; i < size; ++i) {
    char c = data[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (started && depth == 0 && c != ' ' && c != '\n' && c != '\r' && c != '\t') return Ending::TextAfter;
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth, started = true;
    else if (c == '}' || c == ']') --depth;
  }
  return in_string || depth > 0 ? Ending::Truncated : Ending::Complete;
}

// Parses `text` (simdjson needs SIMDJSON_PADDING readable bytes after it). simdjson's errors
// become stp::Error: a text that does not end with the closing bracket is reported as truncated
// (an interrupted writer), anything else as invalid JSON at the byte where it was found.
Trace parse_padded(const char* data, std::size_t size, const std::string& source) {
  Trace t;
  od::parser parser;
  const char* where = nullptr;
  try {
    od::document doc = parser.iterate(data, size, size + simdjson::SIMDJSON_PADDING);
    try {
      Reader(doc, data, source, t).read();
    } catch (const simdjson::simdjson_error&) {
      if (doc.current_location().get(where) != simdjson::SUCCESS) where = nullptr;
      throw;
    }
  } catch (const simdjson::simdjson_error& e) {
    Ending ending = e.error() == simdjson::TRAILING_CONTENT ? Ending::TextAfter : ending_of(data, size);
    if (ending == Ending::TextAfter)
      throw Error(str("trace '", source, "' is not valid JSON: unexpected text after the trace"));
    if (ending == Ending::Truncated)
      throw Error(str("trace '", source, "' is truncated: it ends after ", size,
                      " bytes inside the trace; was the run interrupted while writing it?"));
    std::string at =
        where && where >= data && where <= data + size ? str(" at byte ", where - data) : " at an unknown byte";
    throw Error(str("trace '", source, "' is not valid JSON", at, ": ", e.what()));
  }
  return t;
}

}  // namespace

Trace parse_trace(std::string_view json, const std::string& source) {
  simdjson::padded_string text(json);
  return parse_padded(text.data(), text.size(), source);
}

Trace read_trace_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  STP_CHECK(f, "cannot open trace '", path, "' (does the run have output.trace: true?)");
  STP_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, "cannot read trace '", path, "'");
  long size = std::ftell(f.get());
  STP_CHECK(size >= 0 && std::fseek(f.get(), 0, SEEK_SET) == 0, "cannot read trace '", path, "'");
  STP_CHECK(size > 0, "trace '", path, "' is empty (was the run interrupted while writing it?)");
  simdjson::padded_string text(static_cast<std::size_t>(size));  // read straight into simdjson's padded buffer
  STP_CHECK(std::fread(text.data(), 1, text.size(), f.get()) == text.size(), "error while reading trace '", path, "'");
  return parse_padded(text.data(), text.size(), path);
}

Trace from_recorder(const TraceRecorder& recorder) { return parse_trace(recorder.to_json(), "the in-memory trace"); }

}  // namespace stp::profile
