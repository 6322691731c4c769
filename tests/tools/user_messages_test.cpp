// Messages in stp's words: what a user sees for bad input names the config key or file and says
// what to do; no library exception id (a JSON library's "[json.exception...]") and no raw
// std::filesystem_error text ("filesystem error: ...") reaches stderr. Skipped when the stp
// executable has not been built.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/run_command.h"
#include "tests/train/train_fixture.h"

namespace fs = std::filesystem;

namespace {

// A folder for one test with a small, quick config (one layer, one step).
struct Job {
  fs::path dir, config;
  explicit Job(const std::string& name) {
    dir = fs::path(STP_BINARY_DIR) / "tests" / "user_messages" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    config = dir / "config.yaml";
    std::ofstream(config) << "model: {arch: gpt2, n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 256, seq_len: 16}\n"
                          << "data: {path: " << stp::testing::tiny_text_file() << ", format: text}\n"
                          << "train: {steps: 1, micro_batch_size: 2, microbatches: 2}\n"
                          << "parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}\n"
                          << "output: {dir: " << (dir / "out").string() << "}\n";
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  }
};

// No line of `err` carries a library's own words.
void expect_stp_words(const stp::testing::CommandResult& r, const std::string& what) {
  for (const char* leak : {"json.exception", "filesystem error", "basic_string", "stoll", "stoi", "yaml-cpp"})
    EXPECT_EQ(r.err.find(leak), std::string::npos) << what << ": '" << leak << "' in: " << r.err;
}

// An output.dir that cannot be made is named as the config key, with the reason and what to do.
TEST(UserMessages, AnOutputDirThatCannotBeMadeNamesTheKey) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  Job job("bad_output_dir");
  const std::string file = job.file("a_file", "x");
  auto r = stp::testing::run_stp("train " + job.config.string() + " --set output.dir=" + file + "/run");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("stp train: error: output.dir '" + file + "/run'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Not a directory"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("choose another output.dir"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  expect_stp_words(r, "output.dir under a file");
}

// A validation set with fewer sequences than train.eval_batches global batches is read again from
// its start; the run says so, naming data.val_path, what it holds and what is needed.
TEST(UserMessages, AValidationSetShorterThanEvalBatchesIsAWarning) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  Job job("short_val");
  const std::string val = job.file("val.txt", std::string(100, 'a'));  // (100 - 1) / 16 = 6 sequences
  const std::string sets = " --set data.val_path=" + val + " --set train.eval_every=1";
  auto r = stp::testing::run_stp("train " + job.config.string() + sets + " --set train.eval_batches=2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("stp train: warning: data.val_path '" + val + "' holds 6 sequences"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("train.eval_batches = 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("8 sequences"), std::string::npos) << "2 x 2 x 2: " << r.err;
  EXPECT_NE(r.err.find("at most 1"), std::string::npos) << r.err;
  // One global batch of 4 sequences fits: no warning.
  auto ok = stp::testing::run_stp("train " + job.config.string() + sets + " --set train.eval_batches=1");
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
}

// Broken files of every kind stp reads, each met through the command a user would run.
TEST(UserMessages, BrokenFilesAreNamedInStpsWords) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  Job job("broken_files");
  fs::create_directories(job.dir / "hf");
  job.file("hf/config.json", "{\"model_type\": gpt2}");
  auto r = stp::testing::run_stp("plan " + job.config.string() + " --set model.init_from=" + (job.dir / "hf").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find((job.dir / "hf" / "config.json").string() + " is not valid JSON: line 1, column"),
            std::string::npos)
      << r.err;
  expect_stp_words(r, "config.json");

  fs::create_directories(job.dir / "run");
  job.file("run/metrics.jsonl", "{\"step\":1,\"loss\":3}\n{\"step\":2,,}\n{\"step\":3,\"loss\":2}\n");
  r = stp::testing::run_stp("plot " + (job.dir / "run").string() + " --svg " + (job.dir / "p.svg").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("metrics.jsonl' line 2, column"), std::string::npos) << r.err;
  expect_stp_words(r, "metrics.jsonl");

  r = stp::testing::run_stp("train " + job.config.string() + " --set train.resume=");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("train.resume is empty"), std::string::npos) << r.err;
  expect_stp_words(r, "empty resume");

  job.file("two.yaml", "train: {steps: 1}\n---\ntrain: {steps: 2}\n");
  r = stp::testing::run_stp("plan " + (job.dir / "two.yaml").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("second YAML document"), std::string::npos) << r.err;
}

// A run whose model keys come from model.init_from's config.json says so in its first line: the
// values it prints were not written in the YAML.
TEST(UserMessages, ValuesFromConfigJsonNameTheirSource) {
  if (!stp::testing::have_stp()) GTEST_SKIP() << "stp not built";
  Job job("init_from_source");
  auto first = stp::testing::run_stp("train " + job.config.string());
  ASSERT_EQ(first.status, 0) << first.err;
  const fs::path ck = job.dir / "out" / "checkpoint-1";
  const std::string config =
      job.file("import.yaml", "data: {path: " + stp::testing::tiny_text_file() +
                                  ", format: text}\n"
                                  "train: {steps: 1, micro_batch_size: 2, microbatches: 2}\n"
                                  "parallel: {backend: cpu, tp: 1, pp: 1, schedule: gpipe, cpu_threads: 1}\n"
                                  "model: {n_layer: 1}\n"
                                  "output: {dir: " +
                                  (job.dir / "import").string() + "}\n");
  auto r = stp::testing::run_stp("train " + config + " --set model.init_from=" + ck.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string head = r.err.substr(0, r.err.find('\n'));
  EXPECT_NE(head.find("| from " + (ck / "config.json").string() + ": "), std::string::npos) << head;
  EXPECT_NE(head.find("model.n_embd"), std::string::npos) << head;
  EXPECT_EQ(head.find("model.n_layer"), std::string::npos) << "given by the YAML: " << head;
}

}  // namespace
