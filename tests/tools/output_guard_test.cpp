// tools/cli/output_guard.h: an output that is an input under any name, lies inside an input
// folder, is a file stp reads, or (a folder) holds an input is refused naming both; what does
// not overlap passes. The commands' use of it: tests/tools/cmd_outputs_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/files.h"
#include "tools/cli/output_guard.h"

namespace fs = std::filesystem;
using stp::testing::expect_error;
using stp::testing::ScratchDir;
using stp::testing::write_bytes;
using stp::tools::check_output_dir;
using stp::tools::check_output_file;
using stp::tools::Input;

TEST(OutputGuard, AFileThatIsAnInputUnderAnyNameIsRefused) {
  ScratchDir dir;
  write_bytes(dir.file("in.txt"), "text");
  const std::vector<Input> inputs = {{dir.file("in.txt"), "INPUT"}};
  expect_error([&] { check_output_file(dir.file("in.txt"), "OUTPUT", inputs); }, {"OUTPUT", "INPUT", "in.txt"});
  expect_error([&] { check_output_file((dir.path() / "." / "in.txt").string(), "OUTPUT", inputs); }, {"INPUT"});
  fs::create_symlink(dir.file("in.txt"), dir.file("sym.txt"));
  expect_error([&] { check_output_file(dir.file("sym.txt"), "OUTPUT", inputs); }, {"INPUT"});
  fs::create_hard_link(dir.file("in.txt"), dir.file("hard.txt"));
  expect_error([&] { check_output_file(dir.file("hard.txt"), "OUTPUT", inputs); }, {"INPUT"});
  EXPECT_NO_THROW(check_output_file(dir.file("out.bin"), "OUTPUT", inputs));
  write_bytes(dir.file("earlier.bin"), "an earlier output");
  EXPECT_NO_THROW(check_output_file(dir.file("earlier.bin"), "OUTPUT", inputs));
  EXPECT_NO_THROW(check_output_file("/dev/null", "OUTPUT", inputs));
  EXPECT_NO_THROW(check_output_file(dir.file("x.bin"), "OUTPUT", {{"", "unset"}}));
}

TEST(OutputGuard, AFileInsideAnInputFolderIsRefused) {
  ScratchDir dir;
  fs::create_directories(dir.path() / "texts" / "sub");
  write_bytes(dir.file("texts/a.txt"), "a");
  const std::vector<Input> inputs = {{dir.file("texts"), "INPUT"}};
  for (const char* out : {"texts/new.bin", "texts/a.txt", "texts/sub/deep.bin", "texts/missing/x.bin"})
    expect_error([&] { check_output_file(dir.file(out), "OUTPUT", inputs); }, {"OUTPUT", "inside", "INPUT"});
  fs::create_directory_symlink(dir.file("texts"), dir.file("alias"));
  expect_error([&] { check_output_file(dir.file("alias/new.bin"), "OUTPUT", inputs); }, {"inside"});
  EXPECT_NO_THROW(check_output_file(dir.file("texts.bin"), "OUTPUT", inputs));  // a sibling, not inside
  expect_error([&] { check_output_file(dir.file("texts"), "OUTPUT", {}); }, {"is a folder"});
  expect_error([&] { check_output_file(dir.file("no/such/x.bin"), "OUTPUT", {}); }, {"no/such' does not exist"});
}

TEST(OutputGuard, ExistingFilesThatStpReadsAreRefused) {
  ScratchDir dir;
  fs::create_directories(dir.path() / "checkpoint-3");
  for (const char* f :
       {"tokenizer.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe", "metrics.jsonl", "config.yaml",
        "trace.json", "model.safetensors", "checkpoint-3/state.json", "checkpoint-3/notes.txt"}) {
    write_bytes(dir.file(f), "x");
    expect_error([&] { check_output_file(dir.file(f), "--svg", {}); }, {"--svg", f});
  }
  fs::create_directories(dir.path() / "new");
  EXPECT_NO_THROW(check_output_file(dir.file("new/tokenizer.json"), "--svg", {}));  // nothing to overwrite
  EXPECT_NO_THROW(check_output_file(dir.file("plot.svg"), "--svg", {}));
}

TEST(OutputGuard, AnOutputFolderMayNotBeHoldOrLieInAnInput) {
  ScratchDir dir;
  fs::create_directories(dir.path() / "texts");
  write_bytes(dir.file("texts/corpus.txt"), "text");
  write_bytes(dir.file("run.yaml"), "{}");
  auto refused = [&](const std::string& out, const std::vector<Input>& inputs, const std::string& key) {
    expect_error([&] { check_output_dir(out, "output.dir", inputs); }, {"output.dir", key});
  };
  refused(dir.file("texts"), {{dir.file("texts/corpus.txt"), "data.path"}}, "data.path");    // holds it
  refused(dir.path().string(), {{dir.file("texts/corpus.txt"), "data.path"}}, "data.path");  // at depth
  refused(dir.file("texts"), {{dir.file("texts"), "data.path"}}, "data.path");               // is it
  refused(dir.file("texts/run"), {{dir.file("texts"), "data.path"}}, "data.path");           // inside it
  refused(dir.path().string(), {{dir.file("run.yaml"), "the config file"}}, "the config file");
  refused(dir.file("run.yaml"), {}, "not a folder");
  EXPECT_NO_THROW(check_output_dir(dir.file("out"), "output.dir", {{dir.file("texts"), "data.path"}}));
  EXPECT_NO_THROW(check_output_dir(dir.file("texts2"), "output.dir", {{dir.file("texts"), "data.path"}}));
  // A resumed run continues in the output.dir that holds its checkpoint, but may not write into it.
  fs::create_directories(dir.path() / "out" / "checkpoint-2");
  const Input resume{dir.file("out/checkpoint-2"), "train.resume", true};
  EXPECT_NO_THROW(check_output_dir(dir.file("out"), "output.dir", {resume}));
  refused(dir.file("out/checkpoint-2"), {resume}, "train.resume");
  refused(dir.file("out/checkpoint-2/next"), {resume}, "train.resume");
}
