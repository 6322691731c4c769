// stp tokenize TOKENIZER INPUT OUTPUT [options]
//
// Encodes text with a byte-level BPE tokenizer (data/bpe_tokenizer.h) and writes token files for
// data.path: llm.c's format (data.format llmc) when the vocabulary has at most 65536 ids, else
// stp's wide format (data.format tok32); data/token_file.h. TOKENIZER is an HF tokenizer.json or
// a folder (data/bpe_files.h). INPUT is a file or a folder: a folder's regular files (symlinks and
// subfolders skipped), in name order.
//   * Text (the default): each file is one document, encoded in chunks of bounded size cut where
//     the encoding cannot join across (data/text_stream.h), so memory does not grow with the file
//     and the ids are those of encoding the file whole.
//   * --jsonl: each line of each file is a JSON object, a document (data/documents.h): its
//     --text-field; or, for fine-tuning, --prompt-field and --completion-field, or
//     --messages-field (a chat), which also write a loss mask beside each token file.
// Documents are separated by the end-of-text token (--eot; none between the parts of one file of
// text); a prompt/completion record ends with it. --shard-tokens N writes shards of N tokens
// (data/token_writer.h). Invalid UTF-8 in text is an error naming the file and offset, or with
// --invalid-utf8 replace, each ill-formed subsequence becomes U+FFFD (data/utf8.h). Inputs are
// regular files (a device or FIFO is refused: base/file_io.h). No output may be an input, lie
// inside an input folder or be a file stp reads (tools/cli/output_guard.h), and the outputs
// appear whole or not at all. Progress goes to stderr, the tokenizer and the summary to stdout.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "data/bpe_tokenizer.h"
#include "data/documents.h"
#include "data/text_stream.h"
#include "data/token_writer.h"
#include "tools/cli/cli.h"
#include "tools/cli/output_guard.h"
#include "tools/stp/command.h"

namespace {

namespace fs = std::filesystem;
using stp::str;
using Clock = std::chrono::steady_clock;

// The end-of-text token names tried, in order, when --eot is not given.
const char* const kEotNames[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};

struct TokenizeArgs {
  std::string tokenizer, input, output;
  std::string invalid_utf8 = "error";
  std::uint64_t shard_tokens = 0;
  std::string eot;  // empty: the tokenizer's own
  bool jsonl = false;
  std::string text_field = "text", prompt_field, completion_field, messages_field;
  std::size_t chunk_bytes = std::size_t(16) << 20;
};

std::vector<fs::path> input_files(const std::string& input) {
  std::error_code ec;
  STP_CHECK(fs::exists(input, ec), "input '", input, "' does not exist");
  if (!fs::is_directory(input, ec)) {
    stp::check_regular_file(input, "INPUT");
    return {fs::path(input)};
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(input))
    if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  STP_CHECK(!files.empty(), "input folder '", input, "' holds no regular files");
  return files;
}

// --eot: "none", an id, or a token's text; empty: the first of kEotNames the tokenizer has.
// nullopt: no separator (none, or the tokenizer has none of the names and none was asked for).
std::optional<std::int32_t> resolve_eot(const stp::BpeTokenizer& tok, const std::string& eot) {
  if (eot == "none") return std::nullopt;
  if (eot.empty()) {
    for (const char* name : kEotNames)
      if (auto id = tok.token_id(name)) return id;
    return std::nullopt;
  }
  if (std::all_of(eot.begin(), eot.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    STP_CHECK(eot.size() <= 9 && std::stol(eot) < tok.vocab_size(), "--eot ", eot,
              " is not an id of the tokenizer (its ids are below ", tok.vocab_size(), ")");
    const auto id = static_cast<std::int32_t>(std::stol(eot));
    try {
      (void)tok.decode({id});
    } catch (const stp::Error&) {
      throw stp::Error(str("--eot ", eot, " is not an id of the tokenizer's vocabulary"));
    }
    return id;
  }
  auto id = tok.token_id(eot);
  STP_CHECK(id.has_value(), "--eot ", stp::quoted_text(eot),
            " is not a token of the tokenizer (give its id, or a token's exact text such as <|endoftext|>)");
  return id;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int run(const TokenizeArgs& a) {
  const auto t0 = Clock::now();
  const bool fine_tune = !a.prompt_field.empty() || !a.completion_field.empty() || !a.messages_field.empty();
  STP_CHECK(a.jsonl || (!fine_tune && a.text_field == "text"),
            "--text-field, --prompt-field, --completion-field and --messages-field read JSONL: add --jsonl");
  STP_CHECK(a.prompt_field.empty() == a.completion_field.empty(),
            "--prompt-field and --completion-field go together (give both)");
  STP_CHECK(a.messages_field.empty() || a.prompt_field.empty(),
            "give either --prompt-field/--completion-field or --messages-field, not both");
  const std::vector<stp::tools::Input> inputs = {{a.input, "INPUT"}, {a.tokenizer, "TOKENIZER"}};
  stp::tools::check_output_file(a.output, "OUTPUT", inputs);
  stp::BpeTokenizer tok = stp::BpeTokenizer::load(a.tokenizer);
  const std::vector<fs::path> files = input_files(a.input);
  std::uintmax_t total = 0;
  for (const auto& f : files) total += fs::file_size(f);
  const std::optional<std::int32_t> eot = resolve_eot(tok, a.eot);
  // The EOT a mode needs: fine-tuning records end with one; text documents are separated by one
  // unless --eot none.
  auto need_eot = [&](const char* why, bool fine_tuning) -> std::int32_t {
    if (eot) return *eot;
    STP_CHECK(a.eot != "none" || !fine_tuning, "--eot none: ", why, " needs an end-of-text token; name one with --eot",
              " ID_OR_TOKEN");
    STP_CHECK(a.eot == "none", "the tokenizer has no end-of-text token (<|endoftext|>, <|end_of_text|> or </s>) for ",
              why, "; name one with --eot ID_OR_TOKEN", fine_tuning ? "" : ", or --eot none");
    return -1;
  };
  stp::JsonlSchema schema;
  schema.text_field = a.text_field;
  if (!a.prompt_field.empty()) {
    schema.kind = stp::JsonlKind::PromptCompletion;
    schema.prompt_field = a.prompt_field;
    schema.completion_field = a.completion_field;
    schema.eot = need_eot("ending each prompt/completion record", true);
  } else if (!a.messages_field.empty()) {
    schema.kind = stp::JsonlKind::Messages;
    schema.messages_field = a.messages_field;
    schema.eot = need_eot("ending each chat", true);
    if (auto s = tok.token_id("<|im_start|>"), e = tok.token_id("<|im_end|>"); s && e) {
      schema.im_start = *s;
      schema.im_end = *e;
    }
  }
  std::printf("tokenizer %s: vocabulary of %d ids (pre-split %s); %zu input file(s), %.1f MB\n", a.tokenizer.c_str(),
              tok.vocab_size(), tok.pre_split_jit() ? "PCRE2 JIT" : "PCRE2 interpreter", files.size(),
              double(total) / 1e6);
  if (!a.jsonl && !tok.stream_cuts())
    std::printf(
        "note: the pre-split pattern is not GPT-2's, Llama-3's or Qwen2's, whose safe cuts stp knows: each "
        "input file is read whole\n");
  if (schema.kind == stp::JsonlKind::Messages)
    std::printf("chat template: %s\n",
                schema.im_start >= 0 ? "ChatML (<|im_start|>role\\n...<|im_end|>\\n)" : "plain (role: content)");

  const bool tty = isatty(STDERR_FILENO) != 0;
  const double every_s = tty ? 0.5 : 10.0;  // a log file gets a line every 10 s
  auto last = Clock::now();
  std::uintmax_t before = 0;  // bytes of the files done
  auto report = [&](std::uintmax_t done, bool final) {
    if (!final && std::chrono::duration<double>(Clock::now() - last).count() < every_s) return;
    last = Clock::now();
    const double s = seconds_since(t0);
    std::fprintf(stderr, "%sstp tokenize: %.1f / %.1f MB (%.0f%%), %.1f MB/s%s", tty ? "\r" : "", double(done) / 1e6,
                 double(total) / 1e6, total ? 100.0 * double(done) / double(total) : 100.0,
                 s > 0 ? double(done) / 1e6 / s : 0.0, tty && !final ? "" : "\n");
  };

  std::fflush(stdout);
  stp::TokenWriter::Options wo;
  wo.path = a.output;
  wo.vocab_size = tok.vocab_size();
  wo.shard_tokens = a.shard_tokens;
  wo.mask = fine_tune;
  wo.check_output = [&](const std::string& f) { stp::tools::check_output_file(f, "OUTPUT", inputs); };
  stp::TokenWriter writer(wo);
  std::uint64_t documents = 0;
  auto separate = [&] {  // before every text document but the first
    if (documents++ > 0 && eot) writer.append(&*eot, nullptr, 1);
  };
  if (!a.jsonl) {
    stp::TextStreamOptions so;
    so.chunk_bytes = a.chunk_bytes;
    so.replace_invalid = a.invalid_utf8 == "replace";
    so.invalid_hint = " (--invalid-utf8 replace substitutes U+FFFD)";
    if (files.size() > 1) need_eot("separating the files of a folder", false);
    for (const auto& f : files) {
      separate();
      before += stp::encode_text_file(
          tok, f.string(), "INPUT", so, [&](const std::vector<std::int32_t>& ids) { writer.append(ids); },
          [&](std::uint64_t done) { report(before + done, false); });
    }
  } else {
    if (schema.kind == stp::JsonlKind::Text) need_eot("separating JSONL documents", false);
    std::vector<std::string> lines;
    std::vector<std::uint64_t> numbers;
    std::vector<stp::Document> docs;
    std::vector<std::int32_t> ids;
    std::vector<std::uint8_t> mask;
    for (const auto& f : files) {
      stp::LineReader reader(f.string(), "INPUT");
      bool more = true;
      while (more) {
        lines.clear();
        numbers.clear();
        std::size_t bytes = 0;
        std::string line;
        while (bytes < a.chunk_bytes && (more = reader.next(line))) {
          bytes += line.size() + 1;
          numbers.push_back(reader.line_no());
          lines.push_back(std::move(line));
        }
        stp::jsonl_documents(lines, numbers, f.string(), schema, docs);
        std::vector<stp::Document> batch;
        for (stp::Document& d : docs) {
          if (schema.kind == stp::JsonlKind::Text && documents++ > 0 && eot) batch.push_back({{"", *eot, 1}});
          batch.push_back(std::move(d));
        }
        ids.clear();
        mask.clear();
        stp::encode_documents(tok, batch, ids, mask);
        writer.append(ids.data(), mask.data(), ids.size());
        report(before + reader.offset(), false);
      }
      before += reader.size();
    }
  }
  const stp::TokenWriter::Result r = writer.finish();
  if (seconds_since(t0) >= every_s) report(total, true);
  const double s = seconds_since(t0);
  for (const std::string& f : r.removed) std::printf("removed %s, left by an earlier run\n", f.c_str());
  const std::string what = a.shard_tokens == 0 ? a.output
                                               : str(r.files.size(), " shard(s) ", r.files.front(),
                                                     r.files.size() > 1 ? " ... " + r.files.back() : "");
  std::printf("wrote %s: %llu tokens (data.format %s, model.vocab_size >= %d) from %.1f MB in %.2f s (%.1f MB/s)\n",
              what.c_str(), static_cast<unsigned long long>(r.tokens), r.format.c_str(), tok.vocab_size(),
              double(total) / 1e6, s, s > 0 ? double(total) / 1e6 / s : 0.0);
  if (wo.mask)
    std::printf("loss masks (data.mask_path): %s.mask; %llu of %llu tokens counted as targets\n",
                a.shard_tokens == 0 ? a.output.c_str() : "each shard's name +",
                static_cast<unsigned long long>(r.counted), static_cast<unsigned long long>(r.tokens));
  return 0;
}

stp::tools::Run define(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  app.add_option("TOKENIZER", args->tokenizer,
                 "an HF tokenizer.json, or a folder holding tokenizer.json, vocab.json + merges.txt, or "
                 "encoder.json + vocab.bpe")
      ->required()
      ->type_name("");
  app.add_option("INPUT", args->input,
                 "a UTF-8 text file (one document), a JSONL file (--jsonl), or a folder of them: its regular "
                 "files in name order")
      ->required()
      ->type_name("");
  app.add_option("OUTPUT", args->output,
                 "the token file to write (llmc, or tok32 beyond 65536 ids); with --shard-tokens the shards' "
                 "names: OUTPUT's stem + _000000, _000001, ... + its extension")
      ->required()
      ->type_name("");
  app.add_option("--invalid-utf8", args->invalid_utf8,
                 "error: invalid UTF-8 is an error naming the file and offset; replace: each ill-formed "
                 "subsequence becomes U+FFFD")
      ->check(CLI::IsMember({"error", "replace"}))
      ->capture_default_str();
  app.add_option("--shard-tokens", args->shard_tokens,
                 "write shards of N tokens (the last fewer), named so that data.path 'OUT_*.bin' reads them back "
                 "in order; 0: one file")
      ->capture_default_str();
  app.add_option("--eot", args->eot,
                 "the end-of-text token between documents (and ending each fine-tuning record): an id, a token's "
                 "text, or none; default: the tokenizer's <|endoftext|>, <|end_of_text|> or </s>")
      ->type_name("ID_OR_TOKEN");
  app.add_flag("--jsonl", args->jsonl, "INPUT holds JSON Lines: one object, one document, per line");
  app.add_option("--text-field", args->text_field, "with --jsonl: the field holding a document's text")
      ->capture_default_str();
  app.add_option("--prompt-field", args->prompt_field,
                 "with --jsonl and --completion-field: fine-tuning records; the prompt's tokens get mask 0")
      ->type_name("P");
  app.add_option("--completion-field", args->completion_field,
                 "with --jsonl and --prompt-field: the completion's tokens and the EOT after it get mask 1")
      ->type_name("C");
  app.add_option("--messages-field", args->messages_field,
                 "with --jsonl: a chat, a list of {role, content}, written with the ChatML template when the "
                 "tokenizer has <|im_start|> and <|im_end|>, else the plain one; assistant turns get mask 1")
      ->type_name("M");
  app.add_option("--chunk-bytes", args->chunk_bytes,
                 "text is read and encoded in chunks of about this many bytes (memory use; the ids do not "
                 "depend on it)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.footer(
      "Writes data.format llmc when the vocabulary has at most 65536 ids, else tok32 (docs/config.md, Token "
      "files). Train on it with data.path: OUTPUT (or the shards' glob) and model.vocab_size >= the vocabulary. "
      "Fine-tuning fields also write a loss mask beside each token file, X.mask (docs/config.md, Fine-tuning data and "
      "loss masks): a "
      "32-byte header (\"STPMASK1\", uint32 version 1, uint32 0, uint64 token count, uint64 0) and one byte per "
      "token, 1 when the token counts as a target; use it with data.mask_path.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"tokenize", "encode text into token files with a BPE tokenizer", &define};
