// Loading a Config: YAML file -> registry-checked keys -> typed scalars, then `--set` overrides.
// Every value goes through set_knob(), so the file and --set accept exactly the same syntax.
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "config/config.h"
#include "base/error.h"
#include "config/hf_config.h"

namespace stp {
namespace {

std::string section_keys(const std::string& section) {
  std::string keys;
  for (const Knob& k : config_knobs()) {
    std::string key = k.key;
    if (key.compare(0, section.size() + 1, section + ".") == 0)
      keys += (keys.empty() ? "" : ", ") + key.substr(section.size() + 1);
  }
  return keys;
}

std::string all_sections() {
  std::string s;
  for (const auto& sec : config_sections()) s += (s.empty() ? "" : ", ") + sec;
  return s;
}

bool is_section(const std::string& name) {
  for (const auto& s : config_sections())
    if (s == name) return true;
  return false;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::string section = key.substr(0, key.find('.'));
  if (!is_section(section))
    throw Error(str("config: unknown section '", section, "' (", where, "); valid sections: ", all_sections()));
  throw Error(
      str("config: unknown key '", key, "' (", where, "); valid keys of '", section, "': ", section_keys(section)));
}

std::string where_of(const YAML::Node& node, const std::string& source) {
  const YAML::Mark m = node.Mark();
  if (m.is_null()) return source;
  return str(source, ":", m.line + 1, ":", m.column + 1);
}

// ---- Typed scalars -----------------------------------------------------------------------

[[noreturn]] void bad_type(const Knob& k, const std::string& text, const std::string& where,
                           const std::string& expected) {
  throw Error(str("config: ", k.key, ": '", text, "' is not ", expected, " (", where, ")"));
}

template <typename T>
T parse_integer(const Knob& k, const std::string& text, const std::string& where) {
  T v{};
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  auto r = std::from_chars(b, e, v);
  if (r.ec == std::errc::result_out_of_range)
    throw Error(str("config: ", k.key, ": ", text, " is out of range (", where, ")"));
  if (r.ec != std::errc() || r.ptr != e || b == e)
    bad_type(k, text, where, std::is_signed_v<T> ? "an integer" : "a non-negative integer");
  return v;
}

double parse_float(const Knob& k, const std::string& text, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || errno == ERANGE)
    bad_type(k, text, where, "a finite number");
  return v;
}

bool parse_bool(const Knob& k, const std::string& text, const std::string& where) {
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  bad_type(k, text, where, "a bool (true or false)");
}

std::string parse_choice(const Knob& k, const std::string& text, const std::string& where) {
  std::string choices = k.choices;
  std::size_t start = 0;
  for (;;) {
    std::size_t bar = choices.find('|', start);
    if (choices.substr(start, bar - start) == text) return text;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  std::string list = choices;
  for (auto& c : list)
    if (c == '|') c = ',';
  throw Error(str("config: ", k.key, ": '", text, "' is not one of ", list, " (", where, ")"));
}

// Sets knob `k` of `cfg` from a YAML node (scalar or null), checking the type.
void set_knob(Config& cfg, const Knob& k, const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar() && !node.IsNull())
    throw Error(str("config: ", k.key, ": expected a ", to_string(k.type), " value, got a ",
                    node.IsMap() ? "map" : "list", " (", where, ")"));
  const bool null = node.IsNull();
  const std::string text = null ? "null" : node.Scalar();
  KnobField f = k.field(cfg);
  switch (k.type) {
    case KnobType::Int:
      if (null) bad_type(k, text, where, "an integer");
      if (auto* p = std::get_if<int*>(&f)) **p = parse_integer<int>(k, text, where);
      else if (auto* q = std::get_if<std::int64_t*>(&f)) **q = parse_integer<std::int64_t>(k, text, where);
      else **std::get_if<std::uint64_t*>(&f) = parse_integer<std::uint64_t>(k, text, where);
      return;
    case KnobType::Float:
      if (null) bad_type(k, text, where, "a number");
      *std::get<double*>(f) = parse_float(k, text, where);
      return;
    case KnobType::Bool: *std::get<bool*>(f) = parse_bool(k, text, where); return;
    case KnobType::String:
      if (null || text.empty()) bad_type(k, text, where, "a non-empty string");
      *std::get<std::string*>(f) = text;
      return;
    case KnobType::Choice: *std::get<std::string*>(f) = parse_choice(k, text, where); return;
    case KnobType::Path:
      // "" is not a way to say none: it is what a template or a script fills in for an unset
      // variable, and reading it as null would start a run from random weights or without
      // validation unasked.
      if (!null && text.empty())
        throw Error(str("config: ", k.key, " is empty (", where, "); write null, or leave the key out, for none"));
      *std::get<std::string*>(f) = null ? "" : text;
      return;
    case KnobType::Bytes:
    case KnobType::BytesOrAuto: {
      auto* b = std::get<std::optional<std::uint64_t>*>(f);
      if (null) b->reset();
      else if (k.type == KnobType::Bytes) *b = parse_byte_size(text, str(k.key, " (", where, ")"));
      else if (text == "auto") *b = kAutoBytes;
      else try {
          *b = parse_byte_size(text, str(k.key, " (", where, ")"));
        } catch (const Error& e) {
          throw Error(str(e.what(), ", or auto"));
        }
      return;
    }
    case KnobType::Rate:
      *std::get<double*>(f) = null ? 0.0 : parse_byte_rate(text, str(k.key, " (", where, ")"));
      return;
  }
}

// ---- Documents -----------------------------------------------------------------------------

// A section or key name: a plain scalar (yaml-cpp would only say "bad conversion" of a list or
// map used as a key).
std::string key_name(const YAML::Node& key, const std::string& source) {
  STP_CHECK(!key.IsMap() && !key.IsSequence(), "config: ", where_of(key, source),
            ": a key must be a plain name, not a ", key.IsMap() ? "map" : "list");
  return key.as<std::string>();
}

void apply_document(Config& cfg, const YAML::Node& root, const std::string& source) {
  if (root.IsNull()) return;  // an empty file: all defaults
  STP_CHECK(root.IsMap(), "config: ", where_of(root, source), ": the top level must be a map of sections (",
            all_sections(), ")");
  std::set<std::string> seen;
  for (const auto& sec : root) {
    const std::string name = key_name(sec.first, source);
    const std::string where = where_of(sec.first, source);
    if (!is_section(name))
      throw Error(str("config: unknown section '", name, "' (", where, "); valid sections: ", all_sections()));
    STP_CHECK(seen.insert(name).second, "config: section '", name, "' appears twice (", where, ")");
    const YAML::Node& body = sec.second;
    if (body.IsNull()) continue;
    STP_CHECK(body.IsMap(), "config: section '", name, "' must be a map of keys (", where,
              "); valid keys: ", section_keys(name));
    for (const auto& kv : body) {
      const std::string key = name + "." + key_name(kv.first, source);
      const std::string kwhere = where_of(kv.first, source);
      const Knob* k = find_knob(key);
      if (!k) unknown_key(key, kwhere);
      STP_CHECK(seen.insert(key).second, "config: key '", key, "' appears twice (", kwhere, ")");
      set_knob(cfg, *k, kv.second, where_of(kv.second, source));
    }
  }
}

// The keys the document and the overrides set (model.init_from's config.json fills the others).
std::set<std::string> given_keys(const YAML::Node& root, const std::vector<std::string>& overrides) {
  std::set<std::string> out;
  if (root.IsMap()) {
    for (const auto& sec : root) {
      if (!sec.second.IsMap()) continue;
      for (const auto& kv : sec.second) out.insert(sec.first.as<std::string>() + "." + kv.first.as<std::string>());
    }
  }
  for (const auto& o : overrides) out.insert(o.substr(0, o.find('=')));
  return out;
}

Config load_parsed(const YAML::Node& root, const std::string& source, const std::vector<std::string>& overrides) {
  Config cfg = default_config();
  apply_document(cfg, root, source);
  for (const auto& o : overrides) apply_override(cfg, o);
  std::error_code ec;
  if (!cfg.model.init_from.empty() && std::filesystem::is_directory(cfg.model.init_from, ec))
    merge_hf_config(cfg, given_keys(root, overrides), cfg.model.init_from);
  if (cfg.parallel.cpu_threads == 0)
    cfg.parallel.cpu_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  try {
    validate_config(cfg);
  } catch (const Error& e) {
    throw Error(with_init_from_sources(cfg, e.what()));
  }
  return cfg;
}

// Parses "<number>[ ]<unit>" with the given unit table; returns the value in bytes.
double parse_scaled(const std::string& text, const std::string& key, bool rate) {
  const char* b = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(b, &end);
  std::string unit = end ? std::string(end) : std::string();
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (rate && unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  static const struct {
    const char* name;
    double scale;
  } units[] = {
      {"", 1},     {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3}, {"kB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12}};
  bool ok = end != b && std::isfinite(v) && v >= 0 && errno == 0 && !(text[0] == ' ');
  for (const auto& u : units) {
    if (ok && unit == u.name) {
      double bytes = std::round(v * u.scale);
      STP_CHECK(bytes < 1.8e19, "config: ", key, ": '", text, "' is too large");
      return bytes;
    }
  }
  throw Error(str("config: ", key, ": '", text, "' is not a ", rate ? "byte rate" : "byte size",
                  " (a non-negative number of bytes, optionally with a unit B, KiB, MiB, GiB, TiB (1024^k) or KB, MB, "
                  "GB, TB (1000^k)",
                  rate ? ", optionally followed by /s" : "", ")"));
}

}  // namespace

std::uint64_t parse_byte_size(const std::string& text, const std::string& key) {
  return static_cast<std::uint64_t>(parse_scaled(text, key, false));
}

double parse_byte_rate(const std::string& text, const std::string& key) { return parse_scaled(text, key, true); }

Config default_config() {
  Config cfg;
  for (const Knob& k : config_knobs()) set_knob(cfg, k, YAML::Load(k.default_value), "default");
  return cfg;
}

void apply_override(Config& cfg, const std::string& assignment) {
  std::size_t eq = assignment.find('=');
  STP_CHECK(eq != std::string::npos && eq > 0, "config: --set expects KEY=VALUE (e.g. parallel.tp=2), got '",
            assignment, "'");
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const std::string where = str("--set ", assignment);
  const Knob* k = find_knob(key);
  if (!k) unknown_key(key, where);
  // `--set train.resume=$CKPT` with CKPT unset: refused rather than read as null, which would
  // quietly undo what the user meant (start fresh, train without validation).
  if (value.find_first_not_of(" \t") == std::string::npos) {
    const bool nullable = k->type == KnobType::Path || k->type == KnobType::Bytes || k->type == KnobType::BytesOrAuto ||
                          k->type == KnobType::Rate;
    throw Error(str("config: ", key, " is empty (", where,
                    "), as an unset shell variable leaves it: remove the --set to keep the config file's value",
                    nullable ? str(", or write ", key, "=null to clear it") : std::string(", or give a value")));
  }
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw Error(str("config: ", key, ": cannot parse value '", value, "' as a YAML scalar: ", e.msg, " (", where, ")"));
  }
  set_knob(cfg, *k, node, where);
}

Config load_config_from_string(const std::string& yaml, const std::string& source,
                               const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    // Every document of the text, so that a second one is refused rather than ignored.
    std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
    if (!docs.empty()) root = docs.front();
    for (std::size_t i = 1; i < docs.size(); ++i)
      STP_CHECK(docs[i].IsNull(), "config: ", where_of(docs[i], source),
                ": a second YAML document (after a '---' line); a config file is one document (every section in "
                "one map): merge the documents, or remove the '---' line");
  } catch (const YAML::Exception& e) {
    throw Error(str("config: ", source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML error: ", e.msg));
  }
  try {
    return load_parsed(root, source, overrides);
  } catch (const YAML::Exception& e) {  // e.g. a map key that is not a scalar
    throw Error(str("config: ", source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  STP_CHECK(std::filesystem::is_regular_file(path, ec), "config: file '", path, "' not found (or not a regular file)");
  std::ifstream f(path, std::ios::binary);
  STP_CHECK(f.good(), "config: cannot read '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return load_config_from_string(ss.str(), path, overrides);
}

}  // namespace stp
