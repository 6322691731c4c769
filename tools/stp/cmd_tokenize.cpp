// stp tokenize TOKENIZER INPUT OUTPUT [--invalid-utf8 error|replace]
//
// Encodes text with a byte-level BPE tokenizer (data/bpe_tokenizer.h) and writes a token file for
// data.path: llm.c's format (data.format llmc) when the vocabulary has at most 65536 ids, else
// stp's wide format (data.format tok32); data/token_file.h. TOKENIZER is an HF tokenizer.json or
// a folder (data/bpe_files.h). INPUT is a text file or a folder: a folder's regular files
// (symlinks and subfolders skipped), in name order, each encoded on its own, their ids
// concatenated. Invalid UTF-8 is an error naming the file and offset, or with --invalid-utf8
// replace, each ill-formed subsequence becomes U+FFFD (data/utf8.h). INPUT's files are regular
// files (a device or FIFO is refused: base/file_io.h). OUTPUT may not be INPUT, lie inside an
// input folder or be a file stp reads (tools/cli/output_guard.h), and appears whole or not at
// all. Progress goes to stderr, the tokenizer and the summary to stdout.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/file_io.h"
#include "data/bpe_tokenizer.h"
#include "data/token_file.h"
#include "data/utf8.h"
#include "tools/cli/cli.h"
#include "tools/cli/output_guard.h"
#include "tools/stp/command.h"

namespace {

namespace fs = std::filesystem;
using stp::str;
using Clock = std::chrono::steady_clock;

struct TokenizeArgs {
  std::string tokenizer, input, output;
  std::string invalid_utf8 = "error";
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

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int run(const TokenizeArgs& a) {
  const auto t0 = Clock::now();
  stp::tools::check_output_file(a.output, "OUTPUT", {{a.input, "INPUT"}, {a.tokenizer, "TOKENIZER"}});
  stp::BpeTokenizer tok = stp::BpeTokenizer::load(a.tokenizer);
  const std::vector<fs::path> files = input_files(a.input);
  std::uintmax_t total = 0;
  for (const auto& f : files) total += fs::file_size(f);
  std::printf("tokenizer %s: vocabulary of %d ids (pre-split %s); %zu input file(s), %.1f MB\n", a.tokenizer.c_str(),
              tok.vocab_size(), tok.pre_split_jit() ? "PCRE2 JIT" : "PCRE2 interpreter", files.size(),
              double(total) / 1e6);

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
  std::vector<std::int32_t> ids;
  for (const auto& f : files) {
    std::string text = stp::read_regular_file(f.string(), "INPUT");
    const std::size_t bad = stp::utf8::first_invalid(text);
    if (bad != std::string::npos) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", unsigned(static_cast<unsigned char>(text[bad])));
      STP_CHECK(a.invalid_utf8 == "replace", "'", f.string(), "' is not valid UTF-8: byte ", hex, " at offset ", bad,
                " does not start a valid character (--invalid-utf8 replace substitutes U+FFFD)");
      text = stp::utf8::replace_invalid(text);
    }
    const double scale = text.empty() ? 0.0 : double(fs::file_size(f)) / double(text.size());
    std::vector<std::int32_t> part =
        tok.encode(text, [&](std::size_t done) { report(before + std::uintmax_t(double(done) * scale), false); });
    ids.insert(ids.end(), part.begin(), part.end());
    before += fs::file_size(f);
  }
  const std::string format = stp::write_token_file(a.output, ids, tok.vocab_size());
  if (seconds_since(t0) >= every_s) report(total, true);
  const double s = seconds_since(t0);
  std::printf("wrote %s: %zu tokens (data.format %s, model.vocab_size >= %d) from %.1f MB in %.2f s (%.1f MB/s)\n",
              a.output.c_str(), ids.size(), format.c_str(), tok.vocab_size(), double(total) / 1e6, s,
              s > 0 ? double(total) / 1e6 / s : 0.0);
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
                 "a UTF-8 text file, or a folder: its regular files in name order, each encoded on its own")
      ->required()
      ->type_name("");
  app.add_option("OUTPUT", args->output, "the token file to write (llmc, or tok32 beyond 65536 ids)")
      ->required()
      ->type_name("");
  app.add_option("--invalid-utf8", args->invalid_utf8,
                 "error: invalid UTF-8 is an error naming the file and offset; replace: each ill-formed "
                 "subsequence becomes U+FFFD")
      ->check(CLI::IsMember({"error", "replace"}))
      ->capture_default_str();
  app.footer(
      "Writes data.format llmc when the vocabulary has at most 65536 ids, else tok32 (docs/config.md, Token "
      "files). Train on it with data.path: OUTPUT and model.vocab_size >= the vocabulary.");
  return [args] { return run(*args); };
}

}  // namespace

static const stp::tools::Command kCmd{"tokenize", "encode text into a token file with a BPE tokenizer", &define};
