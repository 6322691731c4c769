// Benchmark: byte-level BPE encoding throughput (data/bpe_tokenizer.h), in MB of text per second.
// The text is INPUT's UTF-8 files (a folder's regular files in name order; files that are not
// valid UTF-8, like the fortunes folder's .dat indexes, are skipped) repeated to at least --mb MB.
// Prints the first (cold word cache) encode and the median, min and max over --repeats warm ones,
// with --threads worker threads (0: oneTBB's default, every core). Wall-clock MB/s is the number;
// MB per CPU-second (process user + system time) and the cores used show whether other processes
// took the CPU meanwhile (on a shared machine wall-clock rates drop while MB per CPU-second holds).
// Streaming (data/text_stream.h): the same text written to a file (--stream-file, default a
// temporary in /tmp, removed at the end) is encoded from the file in chunks of --chunk-mb MB,
// alternating with the in-memory encode on every repeat so that both see the same machine; the
// report gives each one's median and spread, the ratio of the medians (target >= 0.90) and
// whether the streamed ids equal the in-memory ones.
// Options: --tokenizer PATH (default tests/data/tokenizer/gpt2), --input PATH (default
// /usr/share/games/fortunes), --mb N (default 10), --repeats N (default 7), --threads N (default 0),
// --stream-file PATH, --chunk-mb N (default 16, stp tokenize's).
#include <sys/resource.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/bpe_tokenizer.h"
#include "data/text_stream.h"
#include "data/utf8.h"
#include "tools/cli/cli.h"

namespace fs = std::filesystem;

static double cpu_seconds() {  // this process's user + system time
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static std::string read_text(const std::string& input) {
  std::vector<fs::path> files;
  if (fs::is_directory(input)) {
    for (const auto& e : fs::directory_iterator(input))
      if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(input);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (stp::utf8::first_invalid(s) == std::string::npos) text += s;
  }
  STP_CHECK(!text.empty(), "no valid UTF-8 text in '", input, "'");
  return text;
}

int main(int argc, char** argv) {
  CLI::App app{"Byte-level BPE encoding throughput in MB/s of text (median and spread over repeats).",
               "bench_tokenizer"};
  stp::tools::init_cli(app);
  std::string tokenizer = "tests/data/tokenizer/gpt2", input = "/usr/share/games/fortunes";
  double mb = 10;
  int repeats = 7, threads = 0;
  app.add_option("--tokenizer", tokenizer, "tokenizer.json or a tokenizer folder")->capture_default_str();
  app.add_option("--input", input, "a UTF-8 text file or a folder of them")->capture_default_str();
  app.add_option("--mb", mb, "repeat the text to at least this many MB")->capture_default_str();
  app.add_option("--repeats", repeats, "timed encodes after the cold one")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "worker threads (0: every core)")->capture_default_str();
  std::string stream_file;
  double chunk_mb = 16;
  app.add_option("--stream-file", stream_file, "the file the streaming encode reads (default: a temporary in /tmp)");
  app.add_option("--chunk-mb", chunk_mb, "the streaming encode's chunk size in MB (2^20 bytes)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  if (auto status = stp::tools::parse_cli(app, argc, argv)) return *status;
  return stp::tools::run_main(app, [&] {
    using Clock = std::chrono::steady_clock;
    std::unique_ptr<tbb::global_control> limit;
    if (threads > 0)
      limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, threads);
    const auto t0 = Clock::now();
    const stp::BpeTokenizer tok = stp::BpeTokenizer::load(tokenizer);
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string unit = read_text(input);
    std::string text;
    while (double(text.size()) < mb * 1e6) text += unit;
    const double size_mb = double(text.size()) / 1e6;
    std::printf("tokenizer %s: %d ids, loaded in %.2f s, pre-split %s\n", tokenizer.c_str(), tok.vocab_size(), load_s,
                tok.pre_split_jit() ? "PCRE2 JIT" : "PCRE2 interpreter");
    std::printf("text: %s, %.2f MB repeated to %.2f MB; threads %s\n", input.c_str(), double(unit.size()) / 1e6,
                size_mb, threads > 0 ? std::to_string(threads).c_str() : "all");
    const bool own_file = stream_file.empty();
    if (own_file) stream_file = "/tmp/bench_tokenizer_" + std::to_string(::getpid()) + ".txt";
    {
      std::ofstream out(stream_file, std::ios::binary | std::ios::trunc);
      out.write(text.data(), std::streamsize(text.size()));
      STP_CHECK(out.good(), "cannot write '", stream_file, "'");
    }
    stp::TextStreamOptions so;
    so.chunk_bytes = std::size_t(chunk_mb * double(1 << 20));
    std::size_t n_ids = 0;
    double cpu_s = 0, wall_s = 0;
    std::vector<std::int32_t> memory_ids, stream_ids;
    // One encode of `text` in memory, or of the file streamed; MB/s.
    auto timed = [&](bool streamed, std::vector<std::int32_t>* keep) {
      const auto s = Clock::now();
      const double c = cpu_seconds();
      if (!streamed) {
        std::vector<std::int32_t> ids = tok.encode(text);
        n_ids = ids.size();
        if (keep) *keep = std::move(ids);
      } else {
        std::size_t n = 0;
        stp::encode_text_file(tok, stream_file, "--stream-file", so, [&](const std::vector<std::int32_t>& ids) {
          n += ids.size();
          if (keep) keep->insert(keep->end(), ids.begin(), ids.end());
        });
        n_ids = n;
      }
      const double w = std::chrono::duration<double>(Clock::now() - s).count();
      if (!streamed) {
        cpu_s += cpu_seconds() - c;
        wall_s += w;
      }
      return size_mb / w;
    };
    const double cold = timed(false, &memory_ids);
    timed(true, &stream_ids);  // warms the page cache; its ids are compared below
    const bool identical = memory_ids == stream_ids;
    memory_ids = {};
    stream_ids = {};
    cpu_s = wall_s = 0;
    std::vector<double> rates, stream_rates;
    for (int i = 0; i < repeats; ++i) {  // alternating, the order swapped every repeat
      const bool first = i % 2 == 1;
      if (first) stream_rates.push_back(timed(true, nullptr));
      rates.push_back(timed(false, nullptr));
      if (!first) stream_rates.push_back(timed(true, nullptr));
    }
    if (own_file) std::remove(stream_file.c_str());
    std::sort(rates.begin(), rates.end());
    std::sort(stream_rates.begin(), stream_rates.end());
    const double median = rates[rates.size() / 2], stream_median = stream_rates[stream_rates.size() / 2];
    std::printf("ids: %zu (%.2f bytes per id)\n", n_ids, double(text.size()) / double(n_ids));
    std::printf("cold %.1f MB/s; warm median %.1f MB/s (min %.1f, max %.1f, %d repeats); target >= 10 MB/s: %s\n", cold,
                median, rates.front(), rates.back(), repeats, median >= 10 ? "ok" : "MISSED");
    std::printf("warm: %.1f MB per CPU-second, %.2f cores busy on average\n", size_mb * repeats / cpu_s,
                cpu_s / wall_s);
    std::printf(
        "streamed from %s in %.0f MB chunks: median %.1f MB/s (min %.1f, max %.1f); ids %s the in-memory ones\n",
        stream_file.c_str(), chunk_mb, stream_median, stream_rates.front(), stream_rates.back(),
        identical ? "equal" : "DIFFER FROM");
    const double ratio = stream_median / median;
    std::printf("streamed / in-memory median: %.3f; target >= 0.90: %s\n", ratio,
                ratio >= 0.90 && identical ? "ok" : "MISSED");
    return 0;
  });
}
