// formats/safetensors_reader.h, formats/tensor_source.h and the streamed readers of
// formats/checkpoint.h and formats/hf_folder.h: a tensor is read when it is asked for, in any
// order, with the values the whole-file readers give; a file that changes under an open reader is
// an error naming it, never a short read taken for data.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "formats/hf_folder.h"
#include "formats/safetensors_reader.h"
#include "formats/tensor_source.h"
#include "tests/support/checkpoint_sample.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

using Sample = stp::testing::CheckpointSample;

void expect_same(const std::map<std::string, HostTensor>& a, const std::map<std::string, HostTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.shape, b.at(name).shape) << name;
    EXPECT_EQ(t.data, b.at(name).data) << name;
  }
}

}  // namespace

TEST(SafetensorsReader, ReadsEachTensorWhenAskedInAnyOrder) {
  ScratchDir dir;
  Sample s;
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"wte.weight", &s.wte}, {"ln_f.weight", &s.ln}}, {{"format", "pt"}});
  const SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.find("missing"), nullptr);
  const SafetensorsEntry* ln = r.find("ln_f.weight");
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->shape, (Shape{2}));
  EXPECT_EQ(r.read(*ln).data, s.ln.data);  // the second tensor first
  EXPECT_EQ(r.read(*r.find("wte.weight")).data, s.wte.data);
  EXPECT_EQ(r.read(*ln).data, s.ln.data);  // and again
}

TEST(SafetensorsReader, AFileThatShrankUnderTheReaderIsAnErrorNamingIt) {
  ScratchDir dir;
  Sample s;
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"wte.weight", &s.wte}, {"ln_f.weight", &s.ln}});
  const SafetensorsReader r(path);  // the header checked against the full size
  fs::resize_file(path, fs::file_size(path) - 4);
  const SafetensorsEntry* last = &r.tensors().back();
  expect_error([&] { r.read(*last); }, {path, "cannot read", "truncated"});
}

TEST(CheckpointReader, GivesEachStateByModelNameAsReadCheckpointDoes) {
  ScratchDir dir;
  Sample s;
  const std::string path = write_checkpoint(dir.file("run"), s.data(3));
  const CheckpointReader r(path);
  const Checkpoint whole = read_checkpoint(path);
  EXPECT_EQ(r.optimizer_step(), 3);
  EXPECT_EQ(r.state().step, 3);
  for (CheckpointTensor w : {CheckpointTensor::Model, CheckpointTensor::ExpAvg, CheckpointTensor::ExpAvgSq})
    EXPECT_EQ(r.tensors(w).names(), (std::vector<std::string>{"ln_f.weight", "wte.weight"}));
  ASSERT_NE(r.tensors(CheckpointTensor::ExpAvgSq).shape("wte.weight"), nullptr);
  EXPECT_EQ(*r.tensors(CheckpointTensor::ExpAvgSq).shape("wte.weight"), (Shape{5, 2}));
  EXPECT_EQ(r.tensors(CheckpointTensor::Model).shape("wte.weight.exp_avg"), nullptr);
  EXPECT_EQ(r.tensors(CheckpointTensor::ExpAvg).read("ln_f.weight").data, s.m_ln.data);
  expect_same(read_all(r.tensors(CheckpointTensor::Model)), whole.model);
  expect_same(read_all(r.tensors(CheckpointTensor::ExpAvg)), whole.exp_avg);
  expect_same(read_all(r.tensors(CheckpointTensor::ExpAvgSq)), whole.exp_avg_sq);
}

TEST(ModelSource, ReadsAFileOrAFolderOneTensorAtATime) {
  ScratchDir dir;
  Sample s;
  const std::string folder = dir.file("hf");
  fs::create_directories(folder);
  const std::string file = folder + "/model.safetensors";
  write_safetensors(file, {{"transformer.wte.weight", &s.wte}, {"ln_f.weight", &s.ln}});
  for (const std::string& path : {file, folder}) {
    const ModelSource m(path);
    EXPECT_EQ(m.names(), (std::vector<std::string>{"ln_f.weight", "wte.weight"})) << path;
    EXPECT_EQ(m.shape("transformer.wte.weight"), nullptr) << "the prefix is dropped";
    EXPECT_EQ(m.read("wte.weight").data, s.wte.data) << path;
    expect_same(read_all(m), read_model_source(path));
  }
}
