// formats/safetensors_writer.h: a file written tensor by tensor, in any order, is byte for byte
// write_safetensors' file of the same tensors; without a commit nothing is left behind.
#include "formats/safetensors_writer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/error.h"
#include "formats/safetensors.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::read_bytes;
using stp::testing::ScratchDir;

namespace {

struct Tensors {
  HostTensor z{{2, 3}, {1, 2, 3, 4, 5, 6}};
  HostTensor a{{3}, {-1, 0.5f, 7}};
  HostTensor empty{{0, 4}, {}};
  HostTensor m{{1, 1}, {42}};
  std::vector<std::pair<std::string, const HostTensor*>> list() const {
    return {{"z", &z}, {"a", &a}, {"empty", &empty}, {"m", &m}};
  }
  std::vector<std::pair<std::string, Shape>> shapes() const {
    std::vector<std::pair<std::string, Shape>> out;
    for (const auto& [name, t] : list()) out.emplace_back(name, t->shape);
    return out;
  }
};

}  // namespace

TEST(SafetensorsWriter, WritesInAnyOrderTheBytesOfWriteSafetensors) {
  ScratchDir dir;
  Tensors t;
  const std::map<std::string, std::string> metadata{{"step", "7"}};
  write_safetensors(dir.file("whole.safetensors"), t.list(), metadata);
  const std::string path = dir.file("streamed.safetensors");
  SafetensorsWriter w(path, t.shapes(), metadata);
  EXPECT_FALSE(std::filesystem::exists(path)) << "only PATH.tmp until the commit";
  for (const char* name : {"m", "a", "empty", "z"}) {  // reversed, and out of order
    for (const auto& [n, tensor] : t.list())
      if (n == name) w.write(n, tensor->data.data(), tensor->data.size());
  }
  w.commit();
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_bytes(path), read_bytes(dir.file("whole.safetensors")));
  EXPECT_EQ(read_safetensors(path).at("z").data, t.z.data);
}

TEST(SafetensorsWriter, WithoutACommitNothingIsLeftAndTheOldFileStays) {
  ScratchDir dir;
  Tensors t;
  const std::string path = dir.file("f.safetensors");
  stp::testing::write_bytes(path, "old");
  {
    SafetensorsWriter w(path, t.shapes());
    w.write("z", t.z.data.data(), t.z.data.size());
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_bytes(path), "old");
}

TEST(SafetensorsWriter, ACommitWithATensorNeverWrittenIsAnErrorNamingIt) {
  ScratchDir dir;
  Tensors t;
  const std::string path = dir.file("f.safetensors");
  SafetensorsWriter w(path, t.shapes());
  w.write("z", t.z.data.data(), t.z.data.size());
  w.write("m", t.m.data.data(), t.m.data.size());
  expect_error([&] { w.commit(); }, {path, "tensor 'a' was never written"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SafetensorsWriter, HeaderErrorsAreWriteSafetensorsErrors) {
  ScratchDir dir;
  expect_error(
      [&] {
        SafetensorsWriter w(dir.file("d.safetensors"), {{"a", {1}}, {"a", {2}}});
      },
      {"duplicate tensor name \"a\""});
  expect_error([&] { SafetensorsWriter w(dir.file("n.safetensors"), {{"a", {-1}}}); }, {"has negative shape"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}
