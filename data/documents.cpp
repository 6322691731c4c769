#include "data/documents.h"

#include <tbb/parallel_for.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_fields.h"

namespace stp {
namespace {

using nlohmann::json;

constexpr std::size_t kBlockBytes = std::size_t(4) << 20;

const char* type_of(const json& v) {
  return v.is_string()    ? "a string"
         : v.is_object()  ? "an object"
         : v.is_array()   ? "an array"
         : v.is_null()    ? "null"
         : v.is_boolean() ? "a boolean"
                          : "a number";
}

}  // namespace

bool jsonl_document(std::string_view line, const std::string& path, std::uint64_t line_no, const JsonlSchema& schema,
                    Document& doc) {
  doc.clear();
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return false;
  const std::string where = str("'", path, "' line ", line_no);
  json record;
  try {
    record = json::parse(line);
  } catch (const json::exception& e) {
    throw Error(str(where, ": invalid JSON: ", json_error_text(e, JsonPosition::Column)));
  }
  STP_CHECK(record.is_object(), where, ": the record is ", type_of(record), ", not a JSON object");
  auto string_field = [&](const json& obj, const std::string& key, const std::string& in) -> const std::string& {
    auto it = obj.find(key);
    if (it == obj.end()) {
      std::string have;
      for (const auto& [k, v] : obj.items()) have += str(have.empty() ? "" : ", ", quoted_text(k));
      throw Error(str(where, ": ", in, "no field ", quoted_text(key), " (",
                      have.empty() ? std::string("it has no fields") : "it has " + have, ")"));
    }
    STP_CHECK(it->is_string(), where, ": ", in, "field ", quoted_text(key), " is ", type_of(*it), ", not a string");
    return it->get_ref<const std::string&>();
  };
  switch (schema.kind) {
    case JsonlKind::Text: doc.push_back({string_field(record, schema.text_field, ""), -1, 1}); break;
    case JsonlKind::PromptCompletion:
      STP_ASSERT(schema.eot >= 0, "jsonl_document: no end-of-text token");
      doc.push_back({string_field(record, schema.prompt_field, ""), -1, 0});
      doc.push_back({string_field(record, schema.completion_field, ""), -1, 1});
      doc.push_back({"", schema.eot, 1});
      break;
    case JsonlKind::Messages: {
      STP_ASSERT(schema.eot >= 0, "jsonl_document: no end-of-text token");
      auto it = record.find(schema.messages_field);
      if (it == record.end()) string_field(record, schema.messages_field, "");  // throws, naming the fields
      STP_CHECK(it->is_array(), where, ": field ", quoted_text(schema.messages_field), " is ", type_of(*it),
                ", not an array of messages");
      const bool chatml = schema.im_start >= 0 && schema.im_end >= 0;
      bool ended = false;  // the last part is the EOT
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& m = (*it)[i];
        const std::string in = str(quoted_text(schema.messages_field), " message ", i, ": ");
        STP_CHECK(m.is_object(), where, ": ", in, "is ", type_of(m), ", not an object with \"role\" and \"content\"");
        const std::string& role = string_field(m, "role", in);
        const std::string& content = string_field(m, "content", in);
        const std::uint8_t a = role == "assistant" ? 1 : 0;
        if (chatml) {
          doc.push_back({"", schema.im_start, 0});
          doc.push_back({role + "\n", -1, 0});
          doc.push_back({content, -1, a});
          doc.push_back({"", schema.im_end, a});
          doc.push_back({"\n", -1, 0});
          ended = false;
        } else {
          doc.push_back({role + ": ", -1, 0});
          doc.push_back({content, -1, a});
          if (a) doc.push_back({"", schema.eot, 1});
          else doc.push_back({"\n", -1, 0});
          ended = a;
        }
      }
      if (!ended) doc.push_back({"", schema.eot, 0});
      break;
    }
  }
  return true;
}

void jsonl_documents(const std::vector<std::string>& lines, const std::vector<std::uint64_t>& line_nos,
                     const std::string& path, const JsonlSchema& schema, std::vector<Document>& docs) {
  STP_ASSERT(lines.size() == line_nos.size(), "jsonl_documents: ", lines.size(), " lines, ", line_nos.size(),
             " numbers");
  std::vector<Document> parsed(lines.size());
  std::vector<char> kept(lines.size(), 0);
  std::vector<std::string> errors(lines.size());
  tbb::parallel_for(std::size_t(0), lines.size(), [&](std::size_t i) {
    try {
      kept[i] = jsonl_document(lines[i], path, line_nos[i], schema, parsed[i]) ? 1 : 0;
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  });
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  docs.clear();
  for (std::size_t i = 0; i < lines.size(); ++i)
    if (kept[i]) docs.push_back(std::move(parsed[i]));
}

void encode_documents(const BpeTokenizer& tok, const std::vector<Document>& docs, std::vector<std::int32_t>& ids,
                      std::vector<std::uint8_t>& mask) {
  std::vector<std::vector<std::int32_t>> out(docs.size());
  std::vector<std::vector<std::uint8_t>> bits(docs.size());
  tbb::parallel_for(std::size_t(0), docs.size(), [&](std::size_t d) {
    for (const DocPart& p : docs[d]) {
      if (p.token >= 0) {
        out[d].push_back(p.token);
      } else {
        const std::vector<std::int32_t> part = tok.encode(p.text);
        out[d].insert(out[d].end(), part.begin(), part.end());
      }
      bits[d].resize(out[d].size(), p.counted);
    }
  });
  for (std::size_t d = 0; d < docs.size(); ++d) {
    ids.insert(ids.end(), out[d].begin(), out[d].end());
    mask.insert(mask.end(), bits[d].begin(), bits[d].end());
  }
}

bool LineReader::fill() {  // appends a block; false at the end of the file
  if (file_.done()) return false;
  buf_.erase(0, pos_);
  pos_ = 0;
  return file_.read(buf_, kBlockBytes) > 0;
}

bool LineReader::next(std::string& line) {
  std::size_t scanned = pos_;
  for (;;) {
    const std::size_t nl = buf_.find('\n', scanned);
    if (nl != std::string::npos) {
      line.assign(buf_, pos_, nl - pos_);
      consumed_ += nl + 1 - pos_;
      pos_ = nl + 1;
      ++line_no_;
      return true;
    }
    scanned = buf_.size() - pos_;
    if (!fill()) break;
  }
  if (pos_ >= buf_.size()) return false;
  line.assign(buf_, pos_, std::string::npos);  // the last line, without a newline
  consumed_ += buf_.size() - pos_;
  pos_ = buf_.size();
  ++line_no_;
  return true;
}

}  // namespace stp
