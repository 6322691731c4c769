// Checkpoints on disk (docs/design.md, Files): output.dir/checkpoint-STEP/ holds
//
//   config.json            the model's Hugging Face config (config/hf_config.h), so the folder is
//                          an HF model folder (model.init_from, transformers' from_pretrained)
//   model.safetensors      full tensors, HF names and layouts (models/hf_names.h: "wte.weight",
//                          "h.0.attn.c_attn.weight" [C, 3C], "model.layers.0.self_attn.q_proj.weight" [HD, C], ...)
//   optimizer.safetensors  "NAME.exp_avg" and "NAME.exp_avg_sq" per model tensor (the same names and layouts),
//                          metadata {"step": optimizer steps taken}
//   state.json             {"format": "stp-checkpoint-1", "step": S, "data_position": B,
//                           "shuffle": {"tokens": N, "seq_len": T, "windows": W, "epoch": E,
//                                       "index": I} (only under data.sampling: shuffle),
//                           "rng": {"seed": "...", "offset": "..."}, "config_fingerprint": "...",
//                           "note": "..." (optional: e.g. the state after a stop on non-finite steps)}
//                          (rng values are decimal strings: exact 64-bit integers)
//   tokenizer files        the tokenizer the run was trained with, when it had one
//                          (data/tokenizer_files.h: tokenizer.json, or vocab.json + merges.txt,
//                          with tokenizer_config.json ...), so the folder is complete for
//                          transformers and `stp generate` needs no --tokenizer
//
// Atomicity: everything is written into output.dir/.checkpoint-STEP.tmp/ (synced to disk) and
// the folder is then renamed to checkpoint-STEP, so a crash (kill -9, or the immediate exit of a
// second stop signal, tools/cli/stop_signals.h) never leaves a checkpoint-STEP that is half
// written; stale .tmp folders are ignored by find_latest_checkpoint() and replaced by the next
// write of that step. An existing checkpoint-STEP being replaced is first renamed to
// .checkpoint-STEP.old: a crash between the two renames leaves that step without a checkpoint
// (the old one complete under .old), never with a broken one.
//
// Reading validates presence and completeness: a missing or truncated file is an stp::Error
// naming the file; every model tensor must have both optimizer moments of its shape. Names may
// carry a "transformer." prefix (HF checkpoints do); it is stripped on load.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/safetensors.h"
#include "formats/safetensors_reader.h"
#include "formats/safetensors_writer.h"
#include "formats/tensor_source.h"

namespace stp {

// Where a shuffled data order stands (data.sampling: shuffle, data/window_shuffle.h): the next
// sequence, data_position = epoch * windows + index, is position `index` of epoch `epoch`, a
// permutation of the `windows` windows of `seq_len` tokens in data of `tokens` tokens.
struct ShufflePosition {
  std::uint64_t tokens = 0;
  std::uint64_t seq_len = 0;
  std::uint64_t windows = 0;
  std::uint64_t epoch = 0;
  std::uint64_t index = 0;
};

struct CheckpointState {
  std::int64_t step = 0;                   // optimizer steps completed
  std::uint64_t data_position = 0;         // sequence index b of the next sequence to read
  std::uint64_t rng_seed = 0;              // train.seed
  std::uint64_t rng_offset = 0;            // draws consumed from seeded streams (0 if none)
  std::string config_fingerprint;          // config_fingerprint() of the run (model shape)
  std::string note;                        // optional "note": why the run wrote it, when not a normal save
  std::optional<ShufflePosition> shuffle;  // present when the run sampled with data.sampling: shuffle
};

struct OptimizerMoments {
  const HostTensor* exp_avg = nullptr;
  const HostTensor* exp_avg_sq = nullptr;
};

struct CheckpointData {
  std::vector<std::pair<std::string, const HostTensor*>> model;     // full tensors
  std::vector<std::pair<std::string, OptimizerMoments>> optimizer;  // one per model tensor
  std::int64_t optimizer_step = 0;
  CheckpointState state;
  std::string hf_config;  // config.json text; "" = none written
  // More files of the folder (the tokenizer's): plain file names other than the files above, and
  // their bytes, written into the folder with the rest (so atomically with it).
  std::vector<std::pair<std::string, std::string>> files;
};

struct Checkpoint {
  std::map<std::string, HostTensor> model;
  std::map<std::string, HostTensor> exp_avg;  // keyed by model tensor name
  std::map<std::string, HostTensor> exp_avg_sq;
  std::int64_t optimizer_step = 0;
  CheckpointState state;
};

// output_dir/checkpoint-STEP
std::string checkpoint_path(const std::string& output_dir, std::int64_t step);

// Writes checkpoint-<data.state.step> atomically (see above); returns its path. An existing
// checkpoint of the same step is replaced.
std::string write_checkpoint(const std::string& output_dir, const CheckpointData& data);

// A checkpoint written one tensor at a time, so that the writer holds no more than the tensor it
// is given (the files are byte for byte those write_checkpoint writes for the same values):
//
//   CheckpointWriter w(dir, data, {{"a.weight", {4, 2}}, ...});  // every model tensor, file order
//   w.write(CheckpointTensor::Model, "a.weight", values, 8);      // each tensor of each file once,
//   w.write(CheckpointTensor::ExpAvg, "a.weight", m, 8);          // in any order
//   ...
//   std::string path = w.commit();   // checkpoint-STEP, swapped in as write_checkpoint does
//
// `data` gives everything but the tensors' values (its model and optimizer lists must be empty):
// the step, the optimizer step, config.json, the extra files and state.json, written into the
// temporary folder at once. The tensors' names and shapes give both files' headers:
// model.safetensors holds them in that order, optimizer.safetensors NAME.exp_avg and
// NAME.exp_avg_sq for each in that order. commit() is an stp::Error naming the first tensor never
// written. A writer destroyed without a commit (an error, or a state its caller decided not to
// keep) removes its temporary folder: checkpoint-STEP and every other checkpoint stay as they were.
enum class CheckpointTensor { Model, ExpAvg, ExpAvgSq };

class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& output_dir, const CheckpointData& data,
                   const std::vector<std::pair<std::string, Shape>>& tensors);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void write(CheckpointTensor which, const std::string& name, const float* values, std::size_t count);
  std::string commit();

 private:
  std::string output_dir_, tmp_, final_;
  std::int64_t step_ = 0;
  std::unique_ptr<SafetensorsWriter> model_, optimizer_;
};

// A checkpoint folder read one tensor at a time: the constructor checks everything
// read_checkpoint checks (the folder, state.json, both files' headers, the optimizer's step, every
// model tensor's two moments of its shape; the same stp::Errors) and reads no tensor value;
// tensors(which) then gives the model tensors, or one moment of each, by model tensor name
// ("transformer." dropped), read one at a time from the files.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointState& state() const { return state_; }
  std::int64_t optimizer_step() const { return optimizer_step_; }
  const TensorSource& tensors(CheckpointTensor which) const { return tensors_[static_cast<int>(which)]; }

 private:
  CheckpointState state_;
  std::int64_t optimizer_step_ = 0;
  std::unique_ptr<SafetensorsReader> model_file_, optimizer_file_;
  FileTensorSource tensors_[3];  // by CheckpointTensor
};

// Reads and validates a checkpoint folder.
Checkpoint read_checkpoint(const std::string& dir);

// Reads and validates only the state.json of a checkpoint folder (its step, without the tensors).
CheckpointState read_checkpoint_state(const std::string& dir);

// The complete checkpoint-N folder of output_dir with the largest N; "" when there is none.
std::string find_latest_checkpoint(const std::string& output_dir);

// A model .safetensors (model.init_from or a checkpoint's model file) with "transformer."
// prefixes stripped; two names that collide after stripping are an error.
std::map<std::string, HostTensor> read_model_tensors(const std::string& path);

// The tensors of an open model .safetensors under their names with the prefix dropped (the errors
// of read_model_tensors), added to `out`.
void add_model_tensors(const SafetensorsReader& file, FileTensorSource& out);

}  // namespace stp
