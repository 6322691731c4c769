// Trainer internals shared by trainer.cpp (steps), trainer_setup.cpp (building the ranks) and
// trainer_checkpoint.cpp (gathering shards, checkpoints). Not a public header.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/comm.h"
#include "config/config.h"
#include "process/process.h"
#include "base/trace.h"
#include "memory/numa.h"
#include "data/data.h"
#include "data/tokenizer_files.h"
#include "formats/checkpoint.h"
#include "formats/tensor_values.h"
#include "models/hf_names.h"
#include "optim/lr_schedule.h"
#include "schedule/schedule.h"
#include "train/fault_hook.h"
#include "train/rank.h"
#include "train/rank_layout.h"
#include "train/host_needs.h"
#include "train/trainer.h"

namespace stp {

struct CommGroup;  // one communicator group while the trainer is built (train/trainer_setup.cpp)

struct Trainer::Impl {
  Impl(const Config& config, TrainerOptions options);

  // Per rank (global order) after rank_step: whether it updated, its grad norm and clip coefficient.
  struct Health {
    bool updated = true;
    double grad_norm = 0, clip_coef = 1;
  };

  // Setup (trainer_setup.cpp, trainer_comms.cpp, trainer_rank.cpp).
  void check_config() const;
  // data.path or data.val_path (`key`) read; a filesystem error names the key.
  static std::unique_ptr<TokenDataset> load_dataset(const char* key, const DataOptions& o);
  void load_data();  // dataset, val_dataset and the tokenizer files (not in a dry run)
  // The tokenizer the run's checkpoints carry (Trainer::tokenizer_source), read once.
  void load_tokenizer();
  // Warns when train.eval_batches reads more sequences than data.val_path holds.
  void check_validation_size();
  void build_devices();
  std::vector<CommGroup> comm_groups() const;
  void build_communicators();
  void build_split_communicators(const std::vector<CommGroup>& groups);
  std::vector<Communicator*> build_world_communicator(const std::vector<CommGroup>& groups);
  // A rank, in named steps: streams, memory (arena, offload engine), optimizer, stages, executor.
  void build_rank(Rank& r);
  void build_streams(Rank& r);
  void build_memory(Rank& r);
  void build_offload(Rank& r);
  void build_param_stream(Rank& r, const RankPlan& rank_plan);
  void record_param_stream(StepResult& out);
  void build_optimizer(Rank& r);
  void build_stages(Rank& r);
  void build_executor(Rank& r);
  void initialize_parameters();
  // Every GEMM shape a step runs, prepared on each rank's compute stream (train/trainer_gemms.cpp).
  void prepare_gemms();

  // Steps (trainer.cpp).
  bool multi_process() const { return options.processes && options.processes->size() > 1; }
  Rank* local_rank(int global) const;  // nullptr when another process drives it
  void run_on_ranks(const std::function<void(Rank&)>& fn);
  void upload_batch(Rank& r, std::int64_t step);
  void sum_tied_grads(Rank& r);
  void poison_gradient(Rank& r);
  void rank_step(Rank& r, std::int64_t step, float lr);
  void begin_rank_step(Rank& r, std::int64_t step, float lr);  // gradients zeroed, batch uploaded
  Health rank_health(Rank& r);                                 // the step's losses and the non-finite guard
  void apply_update(Rank& r, float lr);                        // clipping and the optimizer step
  void rank_evaluate(Rank& r);
  // Copies microbatches 1..m of inputs/targets to the stages; mb's rows are sequences b0(mb) + r.
  void upload_rows(Rank& r, const TokenDataset* data, const std::function<std::uint64_t(int mb)>& b0);
  double read_step_loss();
  // The targets of global batch `what` (G = dp · m · B sequences from b0) that count in the loss:
  // a loss mask leaves some out (data/data.h); every one without data (a dry run). An stp::Error
  // naming `what` and `mask_key` when none counts: the mean would be 0/0.
  std::uint64_t global_batch_targets(const TokenDataset* data, std::uint64_t b0, const std::string& what,
                                     const char* mask_key) const;
  std::uint64_t global_batch_positions() const;  // G · T, every target of a global batch

  // Full tensors <-> shards (trainer_checkpoint.cpp).
  // The full f32 tensors of replica `replica`'s shards `pick(r, i)` (the device tensor of r.params()[i]: the
  // parameter, or a moment), one at a time: `each(p, full)` once per distinct parameter p (a tied
  // table once), in the order of the stages (pp rank, then chunk) and of their parameter tables, on
  // process 0 only; the other processes send it their shards in params() order. At most one full
  // tensor and one shard are held at once; `meter` counts them.
  using FullTensorFn = std::function<void(const ParamInfo&, std::vector<float>& full)>;
  void gather_each(const std::function<Tensor(Rank&, std::size_t)>& pick, int replica, const FullTensorFn& each,
                   PageableMeter& meter);
  // The same over the optimizer's checkpoint views (RankOptimizer::full_parameters, full_moments).
  void gather_views_each(const std::function<std::vector<Tensor>(RankOptimizer&)>& views, int replica,
                         const FullTensorFn& each, PageableMeter& meter);
  std::map<std::string, HostTensor> gather_views(const std::function<std::vector<Tensor>(RankOptimizer&)>& views,
                                                 int replica = 0);
  // A shard of `p` from replica 0's rank `src` (replica communicator rank) received by process 0, on host.
  std::vector<float> receive_shard(const ParamInfo& p, int src, std::uint32_t index, PageableMeter& meter);
  // What a checkpoint of the current state writes besides its tensors (CheckpointWriter).
  CheckpointData checkpoint_info(const std::string& note) const;
  void load_init_from(const std::string& source);
  // Loading (train/trainer_load.cpp): every parameter of every stage is one of the model's tensors
  // with its full shape (errors name `source`).
  void check_loadable(const std::vector<HfTensorRule>& rules, const std::string& source);
  // Each of the model's tensors read from `tensors` (HF or stp names), checked by `rule`, handed to
  // `each` in turn and freed before the next is read.
  void load_each(const TensorSource& tensors, const std::string& source, ValueRule rule,
                 const std::function<void(const std::string&, const std::vector<float>&)>& each);
  void load_parameters(const TensorSource& tensors, const std::string& source);
  void load_moments(const CheckpointReader& ck, const std::string& dir);  // and the optimizer's step
  // data.sampling shuffle: the checkpoint's data position is the one this run continues from.
  void check_shuffle_position(const std::string& dir, const CheckpointState& state) const;
  void resume(const std::string& dir);
  void record_health(StepResult& out);  // the skip decision of the step just run
  void record_device_stats(StepResult& out, const std::vector<std::uint64_t>& launches_before);
  // Where the last good state is, a sentence for messages (CheckpointSave::problem).
  std::string last_good_state() const;

  Config config;
  TrainerOptions options;
  MemoryPlan plan;
  CpuSplit cpus;  // memory.copy_engine_cpus: compute and copy-engine CPUs (empty: shared)
  // The layout this process builds: the config's, except that a dry run builds one replica.
  RankLayout layout;
  FaultHook fault;
  sched::Schedule schedule;
  std::unique_ptr<TokenDataset> dataset;
  LrSchedule lr_schedule;
  std::unique_ptr<TraceRecorder> trace;
  std::vector<std::unique_ptr<Device>> devices;  // [local rank]
  CommunicatorList comms;                    // every communicator (owned here; children destroyed before their parents)
  std::vector<std::unique_ptr<Rank>> ranks;  // the ranks this process drives, global order
  std::int64_t steps_done = 0;
  std::uint64_t step_targets = 0;              // the counted targets of the step being run (global_batch_targets)
  std::unique_ptr<TokenDataset> val_dataset;   // data.val_path (null: no validation, or a dry run)
  std::string tokenizer_source;                // Trainer::tokenizer_source
  std::vector<TokenizerFile> tokenizer_files;  // its files, as every checkpoint carries them
  std::int64_t skipped_steps = 0, consecutive_skips = 0;
  std::vector<Health> health;
  // The newest state known good: the last checkpoint written (its state was checked first), else
  // the train.resume checkpoint (its values were checked on import); path "" while there is none.
  std::string last_good_path;
  std::int64_t last_good_step = 0;
  bool last_good_resumed = false;
  PageableMeter load_meter;           // model.init_from's or train.resume's tensors (Trainer::load_pageable_peak_bytes)
  std::vector<std::string> warnings;  // Trainer::warnings
};

}  // namespace stp
