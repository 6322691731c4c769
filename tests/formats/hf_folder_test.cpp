// Reading Hugging Face model folders: a sharded BF16 folder reads back exactly, and every broken
// folder (a missing or misplaced shard, a hostile shard name, a truncated shard, an unknown dtype)
// is an stp::Error naming the problem.
#include "formats/hf_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "tests/support/hf_fixture.h"

namespace {

namespace fs = std::filesystem;
using stp::HostTensor;

std::string fresh_dir(const std::string& name) {
  std::string d = std::string(STP_BINARY_DIR) + "/tests/hf_folder/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::map<std::string, HostTensor> sample() {
  std::map<std::string, HostTensor> t;
  t["a.weight"] = {{2, 3}, {1.5f, -2.25f, 3.0e-3f, 7.0f, -0.125f, 1e20f}};
  t["b.bias"] = {{4}, {0.1f, 0.2f, -0.3f, 65504.0f}};
  t["transformer.c.weight"] = {{1, 2}, {-1.0f, 3.14159f}};
  return t;
}

void expect_error(const std::string& dir, const std::string& needle) {
  try {
    stp::read_model_source(dir);
    FAIL() << "no error for " << dir;
  } catch (const stp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(HfFolder, ShardedBf16ReadsBackExactly) {
  const std::string dir = fresh_dir("sharded");
  stp::testing::write_sharded_folder(dir, sample(), 2, "BF16");
  auto got = stp::read_model_source(dir);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& [name, t] : sample()) {
    const std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    ASSERT_TRUE(got.count(n)) << n;
    EXPECT_EQ(got[n].shape, t.shape);
    for (std::size_t i = 0; i < t.data.size(); ++i) EXPECT_EQ(got[n].data[i], stp::testing::bf16_round(t.data[i]));
  }
  EXPECT_NE(got["a.weight"].data[0], 0.0f);
}

TEST(HfFolder, SingleFileFolderAndPlainFile) {
  const std::string dir = fresh_dir("single");
  stp::testing::write_raw_safetensors(dir + "/model.safetensors", sample(), "F32");
  auto got = stp::read_model_source(dir);
  EXPECT_EQ(got.at("a.weight").data, sample().at("a.weight").data);
  EXPECT_EQ(stp::read_model_source(dir + "/model.safetensors").at("b.bias").data, sample().at("b.bias").data);
}

TEST(HfFolder, BrokenFoldersAreClearErrors) {
  {
    const std::string dir = fresh_dir("empty");
    expect_error(dir, "holds neither model.safetensors.index.json nor model.safetensors");
  }
  {
    const std::string dir = fresh_dir("missing_shard");
    stp::testing::write_sharded_folder(dir, sample(), 2, "BF16");
    fs::remove(dir + "/model-00002-of-00002.safetensors");
    expect_error(dir, "names shard 'model-00002-of-00002.safetensors', which is missing");
  }
  {
    const std::string dir = fresh_dir("misplaced");
    stp::testing::write_sharded_folder(dir, sample(), 2, "BF16");
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"a.weight": "model-00002-of-00002.safetensors",
               "b.bias": "model-00002-of-00002.safetensors"}})";
    expect_error(dir, "puts tensor 'a.weight' in model-00002-of-00002.safetensors, which does not hold it");
  }
  {
    const std::string dir = fresh_dir("hostile_name");
    std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {"a": "../../etc/passwd"}})";
    expect_error(dir, "is not a plain file name");
  }
  {
    const std::string dir = fresh_dir("no_map");
    std::ofstream(dir + "/model.safetensors.index.json") << R"({"metadata": {}})";
    expect_error(dir, "lacks a \"weight_map\"");
  }
  {
    const std::string dir = fresh_dir("truncated");
    stp::testing::write_sharded_folder(dir, sample(), 2, "BF16");
    const std::string shard = dir + "/model-00001-of-00002.safetensors";
    fs::resize_file(shard, fs::file_size(shard) - 3);
    expect_error(dir, "model-00001-of-00002.safetensors");
  }
  {
    const std::string dir = fresh_dir("bad_dtype");
    stp::testing::write_raw_safetensors(dir + "/model.safetensors", {{"x", HostTensor{{2}, {1, 2}}}}, "F32");
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto at = bytes.find("\"F32\"");
    ASSERT_NE(at, std::string::npos);
    f.seekp(static_cast<std::streamoff>(at + 1));
    f.write("I32", 3);
    f.close();
    expect_error(dir, "I32");
  }
}

// Names read from the folder's files go into messages escaped: a control character in a shard or
// tensor name (an escape sequence, a newline) never reaches the terminal as is.
TEST(HfFolder, ControlCharactersInNamesAreEscaped) {
  auto expect_clean = [](const std::string& dir, const std::string& needle) {
    try {
      stp::read_model_source(dir);
      ADD_FAILURE() << "no error for " << dir;
    } catch (const stp::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      for (char c : what) EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) << what;
    }
  };
  {
    const std::string dir = fresh_dir("control_shard");
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"a.weight": "sh\u001b[31mard\n2.safetensors"}})";
    expect_clean(dir, "names shard 'sh\\u001b[31mard\\n2.safetensors', which is missing");
  }
  {
    const std::string dir = fresh_dir("control_tensor");
    stp::testing::write_sharded_folder(dir, sample(), 2, "BF16");
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"weight_map": {"a.weight\r\u0007": "model-00002-of-00002.safetensors"}})";
    expect_clean(dir, "puts tensor 'a.weight\\r\\u0007' in model-00002-of-00002.safetensors");
  }
  {
    const std::string dir = fresh_dir("control_in_file");
    stp::testing::write_raw_safetensors(dir + "/model.safetensors", {{"x\ny", HostTensor{{2}, {1, 2}}}}, "I32");
    expect_clean(dir, "tensor \"x\\ny\"");
  }
}

}  // namespace
