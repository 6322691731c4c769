#include <filesystem>
#include <iterator>
#include <map>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "tests/support/checkpoint_sample.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;
using stp::testing::ScratchDir;
namespace fs = std::filesystem;

namespace {

using Sample = stp::testing::CheckpointSample;

void truncate_file(const fs::path& p, std::uintmax_t keep) { fs::resize_file(p, keep); }

}  // namespace

TEST(Checkpoint, RoundTrip) {
  ScratchDir dir;
  Sample s;
  std::string path = write_checkpoint(dir.file("run"), s.data(12));
  EXPECT_EQ(path, checkpoint_path(dir.file("run"), 12));
  EXPECT_EQ(fs::path(path).filename(), "checkpoint-12");
  Checkpoint ck = read_checkpoint(path);
  ASSERT_EQ(ck.model.size(), 2u);
  EXPECT_EQ(ck.model["wte.weight"].shape, (Shape{5, 2}));
  EXPECT_EQ(ck.model["wte.weight"].data, s.wte.data);
  EXPECT_EQ(ck.model["ln_f.weight"].data, s.ln.data);
  EXPECT_EQ(ck.exp_avg["wte.weight"].data, s.m_wte.data);
  EXPECT_EQ(ck.exp_avg_sq["wte.weight"].data, s.v_wte.data);
  EXPECT_EQ(ck.exp_avg["ln_f.weight"].data, s.m_ln.data);
  EXPECT_EQ(ck.exp_avg_sq["ln_f.weight"].data, s.v_ln.data);
  EXPECT_EQ(ck.optimizer_step, 12);
  EXPECT_EQ(ck.state.step, 12);
  EXPECT_EQ(ck.state.data_position, 4108u);
  EXPECT_EQ(ck.state.rng_seed, 18446744073709551615ull);  // exact 64-bit
  EXPECT_EQ(ck.state.rng_offset, 77u);
  EXPECT_EQ(ck.state.config_fingerprint, "0123456789abcdef");
  // The optimizer file uses the documented names.
  auto opt = read_safetensors_file(path + "/optimizer.safetensors");
  EXPECT_TRUE(opt.tensors.count("wte.weight.exp_avg") && opt.tensors.count("wte.weight.exp_avg_sq"));
  EXPECT_EQ(opt.metadata["step"], "12");
  // Rewriting the same step replaces it; nothing temporary is left behind.
  write_checkpoint(dir.file("run"), s.data(12));
  for (const auto& e : fs::directory_iterator(dir.file("run"))) EXPECT_EQ(e.path().filename(), "checkpoint-12");
}

// The shuffle position (data.sampling shuffle) reads back as written; a checkpoint without one
// reads back without one. The folder's extra files (the tokenizer's) are written byte for byte
// with the rest of it.
TEST(Checkpoint, ShufflePositionAndExtraFilesRoundTrip) {
  ScratchDir dir;
  Sample s;
  CheckpointData d = s.data(5);
  EXPECT_FALSE(read_checkpoint(write_checkpoint(dir.file("plain"), d)).state.shuffle.has_value());
  d.state.shuffle = ShufflePosition{1ull << 40, 1024, (1ull << 40) / 1024, 3, 17};
  const std::string binary("{\"a\": 1}\0\xff\n", 11);
  d.files = {{"tokenizer.json", binary}, {"tokenizer_config.json", "{}"}};
  const std::string path = write_checkpoint(dir.file("run"), d);
  const CheckpointState st = read_checkpoint(path).state;
  ASSERT_TRUE(st.shuffle.has_value());
  EXPECT_EQ(st.shuffle->tokens, 1ull << 40);
  EXPECT_EQ(st.shuffle->seq_len, 1024u);
  EXPECT_EQ(st.shuffle->windows, (1ull << 40) / 1024);
  EXPECT_EQ(st.shuffle->epoch, 3u);
  EXPECT_EQ(st.shuffle->index, 17u);
  EXPECT_EQ(stp::testing::read_bytes(path + "/tokenizer.json"), binary);
  EXPECT_EQ(stp::testing::read_bytes(path + "/tokenizer_config.json"), "{}");
}

TEST(Checkpoint, TruncatedOrMissingFilesAreNamedErrors) {
  ScratchDir dir;
  Sample s;
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "state.json"}) {
    SCOPED_TRACE(file);
    std::string path = write_checkpoint(dir.file("run"), s.data(3));
    fs::path f = fs::path(path) / file;
    truncate_file(f, fs::file_size(f) - 5);
    expect_error([&] { read_checkpoint(path); }, {file});
    fs::remove(f);
    expect_error([&] { read_checkpoint(path); }, {"incomplete", file, "missing"});
    EXPECT_EQ(find_latest_checkpoint(dir.file("run")), "");  // an incomplete folder is never picked
  }
  expect_error([&] { read_checkpoint(dir.file("nothing")); }, {"nothing", "not a folder"});
}

TEST(Checkpoint, HalfWrittenCheckpointsAreNeverPickedUp) {
  ScratchDir dir;
  Sample s;
  const std::string run = dir.file("run");
  write_checkpoint(run, s.data(5));
  write_checkpoint(run, s.data(20));
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 20));
  // A crash while writing step 30 leaves only the temporary folder.
  fs::create_directories(fs::path(run) / ".checkpoint-30.tmp");
  stp::testing::write_bytes(run + "/.checkpoint-30.tmp/model.safetensors", "partial");
  // A foreign or incomplete folder with a checkpoint name.
  fs::create_directories(fs::path(run) / "checkpoint-40");
  stp::testing::write_bytes(run + "/checkpoint-40/model.safetensors", "x");
  fs::create_directories(fs::path(run) / "checkpoint-x50");
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 20));
  // A write that fails half way (a bad tensor) leaves the earlier checkpoints untouched.
  CheckpointData bad = s.data(30);
  HostTensor broken{{3}, {1}};
  bad.model.push_back({"broken", &broken});
  EXPECT_THROW(write_checkpoint(run, bad), Error);
  EXPECT_FALSE(fs::exists(checkpoint_path(run, 30)));
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 20));
  // The next successful write of that step replaces the stale temporary folder.
  write_checkpoint(run, s.data(30));
  EXPECT_EQ(find_latest_checkpoint(run), checkpoint_path(run, 30));
  EXPECT_FALSE(fs::exists(fs::path(run) / ".checkpoint-30.tmp"));
  EXPECT_EQ(find_latest_checkpoint(dir.file("no-such-run")), "");
}

TEST(Checkpoint, OptimizerStateMustCoverTheModel) {
  ScratchDir dir;
  Sample s;
  CheckpointData d = s.data(1);
  d.optimizer.pop_back();  // ln_f.weight has no moments
  std::string path = write_checkpoint(dir.file("run"), d);
  expect_error([&] { read_checkpoint(path); }, {"optimizer.safetensors", "ln_f.weight.exp_avg"});
  CheckpointData e = s.data(2);
  HostTensor wrong{{3}, {1, 2, 3}};
  e.optimizer[1].second.exp_avg_sq = &wrong;
  path = write_checkpoint(dir.file("run"), e);
  expect_error([&] { read_checkpoint(path); }, {"ln_f.weight.exp_avg_sq", "[3]", "[2]"});
}

TEST(Checkpoint, TransformerPrefixIsAcceptedOnLoad) {
  ScratchDir dir;
  HostTensor a{{2}, {1, 2}}, b{{1}, {3}};
  write_safetensors(dir.file("hf.safetensors"), {{"transformer.wte.weight", &a}, {"ln_f.bias", &b}});
  auto t = read_model_tensors(dir.file("hf.safetensors"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t["wte.weight"].data, a.data);
  EXPECT_EQ(t["ln_f.bias"].data, b.data);
  write_safetensors(dir.file("dup.safetensors"), {{"transformer.wte.weight", &a}, {"wte.weight", &a}});
  expect_error([&] { read_model_tensors(dir.file("dup.safetensors")); }, {"transformer.wte.weight", "same tensor"});
}

// Numbers and JSON in a checkpoint's files that do not read are errors naming the file, in stp's
// words (never std::stoll's "stoll" or a JSON library's exception id).
TEST(Checkpoint, UnreadableNumbersAndJsonAreNamedErrors) {
  ScratchDir dir;
  Sample s;
  const std::string path = write_checkpoint(dir.file("run"), s.data(3));
  const std::string opt = (fs::path(path) / "optimizer.safetensors").string();
  SafetensorsFile file = read_safetensors_file(opt);
  std::vector<std::pair<std::string, const HostTensor*>> tensors;
  for (const auto& [name, t] : file.tensors) tensors.emplace_back(name, &t);
  write_safetensors(opt, tensors, {{"step", "99999999999999999999"}});
  expect_error([&] { read_checkpoint(path); }, {opt, "\"step\"", "99999999999999999999", "out of range"});

  const std::string state = (fs::path(path) / "state.json").string();
  stp::testing::write_bytes(state, "{\"format\": \"stp-checkpoint-v1\", \"step\": 3,,}");
  try {
    read_checkpoint(path);
    ADD_FAILURE() << "no error";
  } catch (const stp::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(state), std::string::npos) << what;
    EXPECT_NE(what.find("line 1, column"), std::string::npos) << what;
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  }
}

namespace {

// Every file of a folder, by name: its bytes.
std::map<std::string, std::string> folder_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = stp::testing::read_bytes(e.path().string());
  return out;
}

// A checkpoint written tensor by tensor, the optimizer's moments before the model and the
// tensors in reverse order: `keep` commits it.
std::string stream_checkpoint(const std::string& run, CheckpointData d, bool keep) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const auto& [name, t] : d.model) shapes.emplace_back(name, t->shape);
  const auto model = d.model;
  const auto optimizer = d.optimizer;
  d.model.clear();
  d.optimizer.clear();
  CheckpointWriter w(run, d, shapes);
  for (auto it = optimizer.rbegin(); it != optimizer.rend(); ++it) {
    w.write(CheckpointTensor::ExpAvgSq, it->first, it->second.exp_avg_sq->data.data(),
            it->second.exp_avg_sq->data.size());
    w.write(CheckpointTensor::ExpAvg, it->first, it->second.exp_avg->data.data(), it->second.exp_avg->data.size());
  }
  for (auto it = model.rbegin(); it != model.rend(); ++it)
    w.write(CheckpointTensor::Model, it->first, it->second->data.data(), it->second->data.size());
  return keep ? w.commit() : "";
}

}  // namespace

// CheckpointWriter: the folder's every file is byte for byte write_checkpoint's.
TEST(Checkpoint, WrittenTensorByTensorItIsByteForByteTheSame) {
  ScratchDir dir;
  Sample s;
  CheckpointData d = s.data(9);
  d.hf_config = "{\"model_type\": \"gpt2\"}\n";
  d.files = {{"tokenizer.json", "{}"}};
  d.state.note = "a note";
  d.state.shuffle = ShufflePosition{100, 8, 12, 0, 5};
  const std::string whole = write_checkpoint(dir.file("whole"), d);
  const std::string streamed = stream_checkpoint(dir.file("streamed"), d, true);
  EXPECT_EQ(streamed, checkpoint_path(dir.file("streamed"), 9));
  const auto want = folder_bytes(whole);
  EXPECT_EQ(want.size(), 5u);  // the two safetensors files, state.json, config.json, tokenizer.json
  EXPECT_EQ(folder_bytes(streamed), want);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.file("streamed")), fs::directory_iterator()), 1)
      << "nothing but checkpoint-9 is left";
}

// Not committed (the caller found a value it will not call good): the old checkpoint of that step
// stays, and no temporary folder is left.
TEST(Checkpoint, AWriterNotCommittedLeavesEveryCheckpointAsItWas) {
  ScratchDir dir;
  Sample s;
  const std::string run = dir.file("run");
  const std::string old = write_checkpoint(run, s.data(4));
  const auto before = folder_bytes(old);
  CheckpointData d = s.data(4);
  d.optimizer_step = 99;
  stream_checkpoint(run, d, false);
  EXPECT_EQ(folder_bytes(old), before);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"checkpoint-4"});
  // A tensor never written is an error at the commit, which leaves nothing either.
  CheckpointData e = s.data(5);
  e.model.clear();
  e.optimizer.clear();
  {
    CheckpointWriter w(run, e, {{"wte.weight", {5, 2}}});
    w.write(CheckpointTensor::Model, "wte.weight", s.wte.data.data(), 10);
    w.write(CheckpointTensor::ExpAvg, "wte.weight", s.m_wte.data.data(), 10);
    expect_error([&] { w.commit(); }, {"optimizer.safetensors", "tensor 'wte.weight.exp_avg_sq' was never written"});
  }
  EXPECT_EQ(find_latest_checkpoint(run), old);
  EXPECT_EQ(std::distance(fs::directory_iterator(run), fs::directory_iterator()), 1);
}
