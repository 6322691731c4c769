// Building a training process: config checks that need the schedule and model together, the
// devices and ranks, the parameters' first values. The communicators are made in
// train/trainer_comms.cpp, each rank's streams, memory, optimizer, stages and executor in
// train/trainer_rank.cpp.
#include <cblas.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/backend.h"
#include "core/gpu_logic.h"
#include "base/error.h"
#include "base/fs_error.h"
#include "config/hf_config.h"
#include "data/bpe_tokenizer.h"
#include "formats/checkpoint.h"
#include "memory/numa.h"
#include "models/registry.h"
#include "train/memory_planning.h"
#include "train/memory_settings.h"
#include "train/stage_layout.h"
#include "train/trainer_impl.h"

extern "C" void openblas_set_num_threads(int);

namespace stp {

Trainer::Impl::Impl(const Config& cfg, TrainerOptions opts) : config(cfg), options(opts) {
  layout = RankLayout::of(config);
  if (options.dry_run) {  // one replica: the others are identical; never across processes
    layout.dp = 1;
    options.processes = nullptr;
  }
  fault = FaultHook::from_env();
  check_config();
  // Checked before the data is read, and in a dry run too, so that `stp plan` refuses what
  // `stp train` would.
  if (config.memory.copy_engine_cpus > 0) {
    CpuSplit split = split_cpus_for_copies(config.memory.copy_engine_cpus);
    if (!options.dry_run) cpus = std::move(split);
  }
  if (config.parallel.distributed_optimizer && config.parallel.dp == 1)
    warnings.push_back(
        "parallel.distributed_optimizer: true does nothing with parallel.dp = 1 (one replica holds the whole "
        "optimizer state; there is nothing to shard it over)");
  if (options.plan) {
    plan = *options.plan;
  } else {
    plan = make_memory_plan(config);
    check_plan(plan, config);
  }
  // The machine this run is on holds the plan's host memory (`stp plan` only notes it).
  if (!options.dry_run) check_host_machine(plan, config, memory_settings(config));
  if (memory_settings(config).optimizer_overlap == OffloadPolicy::All && !plan.optimizer_overlap)
    warnings.push_back(
        "memory.optimizer_overlap: all does nothing here: no chunk's optimizer is on the host with gradients final "
        "early (it needs memory.optimizer_offload and a host chunk without the tied embedding)");
  // parallel.cpu_threads is the process's CPU budget. Every rank runs its GEMMs concurrently on
  // its own stream thread, so each OpenBLAS call gets an equal share: oversubscribing the cores
  // (4 ranks x 2 threads on 2 cores) costs about 4x on the CPU backend. A dry run runs no GEMM
  // and leaves the setting alone (a real trainer makes one to prepare its GEMMs: prepare_gemms).
  int ranks_in_process = multi_process() ? 1 : layout.size();
  if (!options.dry_run) openblas_set_num_threads(std::max(1, config.parallel.cpu_threads / ranks_in_process));
  if (!options.dry_run) load_data();  // a dry run reads no data
  lr_schedule = LrSchedule::from_config(config.train);
  if (config.output.trace) trace = std::make_unique<TraceRecorder>();
  if (!cpus.compute.empty()) {
    // Every thread made from here on (stream workers, oneTBB and OpenBLAS workers, the per-step
    // rank threads) inherits the compute CPUs; build_offload moves the copy streams off them.
    bind_current_thread_to_cpus(cpus.compute);
  }
  build_devices();
  // What the communicators take outside the budget (NCCL connects while they are made:
  // core/cuda/nccl_comm.cu), measured before the arenas reserve it.
  std::vector<std::optional<std::size_t>> free_before;
  for (auto& r : ranks) free_before.push_back(r->device->physical_free_bytes());
  build_communicators();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::optional<std::size_t> after = ranks[i]->device->physical_free_bytes();
    if (free_before[i] && after && *free_before[i] > *after) ranks[i]->communicator_bytes = *free_before[i] - *after;
  }
  for (int g = 0; g < static_cast<int>(devices.size()); ++g) build_rank(*ranks[static_cast<std::size_t>(g)]);
  initialize_parameters();
  prepare_gemms();
}

// data.path and data.val_path with their loss masks, and the tokenizer the checkpoints carry.
void Trainer::Impl::load_data() {
  dataset = load_dataset("data.path", DataOptions::from_config(config));
  if (!config.data.val_path.empty()) {
    DataOptions val = DataOptions::from_config(config);
    val.path = config.data.val_path;
    val.mask_path = config.data.val_mask_path;
    val.sampling = "sequential";  // the held-out set is its first sequences, in order
    try {
      val_dataset = std::make_unique<TokenDataset>(val);
    } catch (const std::filesystem::filesystem_error& e) {
      throw Error(str("data.val_path '", val.path, "': cannot read it: ", filesystem_reason(e, val.path)));
    } catch (const Error& e) {
      throw Error(str("data.val_path: ", e.what()));
    }
    check_validation_size();
  }
  load_tokenizer();
}

std::unique_ptr<TokenDataset> Trainer::Impl::load_dataset(const char* key, const DataOptions& o) {
  try {
    return std::make_unique<TokenDataset>(o);
  } catch (const std::filesystem::filesystem_error& e) {  // e.g. a folder that may not be listed
    throw Error(str(key, " '", o.path, "': cannot read it: ", filesystem_reason(e, o.path)));
  }
}

// The tokenizer travels with the model: its files are read now, so that every checkpoint carries
// the tokenizer as it was when the run started, and a wrong one is an error before the first step.
void Trainer::Impl::load_tokenizer() {
  if (config.data.format == "text") return;  // bytes: no tokenizer (validate_config refuses data.tokenizer)
  std::string key = "data.tokenizer";
  tokenizer_source = config.data.tokenizer;
  if (tokenizer_source.empty() && holds_tokenizer(config.model.init_from)) {
    key = "model.init_from's tokenizer";
    tokenizer_source = config.model.init_from;
  }
  if (tokenizer_source.empty() && holds_tokenizer(config.train.resume)) {
    key = "train.resume's tokenizer";
    tokenizer_source = config.train.resume;
  }
  if (tokenizer_source.empty()) return;
  tokenizer_files = read_tokenizer_files(tokenizer_source, key);
  // A tokenizer stp's BPE reader does not support (a SentencePiece-style tokenizer.json of an HF
  // model, say) still travels: transformers reads it. Only its size cannot be checked.
  std::int32_t ids = 0;
  try {
    ids = BpeTokenizer::load(tokenizer_source).vocab_size();
  } catch (const Error& e) {
    warnings.push_back(str(key, " '", tokenizer_source, "': stp cannot read it (", e.what(),
                           "); the checkpoints carry its files for other tools, but stp generate cannot use them"));
    return;
  }
  STP_CHECK(ids <= config.model.vocab_size, key, " '", tokenizer_source, "' has ", ids, " ids but model.vocab_size is ",
            config.model.vocab_size,
            ": it is not the tokenizer of this model's data; name the one the data was made with");
}

// The evaluation reads train.eval_batches global batches of data.val_path in order; past its last
// whole sequence the offsets wrap around (data/data.h, Sampling) and sequences are read again, so
// the validation loss weighs some of them more than once. Allowed (a small held-out set still
// tells something), but said.
void Trainer::Impl::check_validation_size() {
  const TrainConfig& t = config.train;
  const std::uint64_t T = static_cast<std::uint64_t>(config.model.seq_len);
  const std::uint64_t held = (val_dataset->num_tokens() - 1) / T;  // N >= T + 1 (data/data.h)
  const std::uint64_t per_batch = static_cast<std::uint64_t>(config.parallel.dp) *
                                  static_cast<std::uint64_t>(t.microbatches) *
                                  static_cast<std::uint64_t>(t.micro_batch_size);
  const std::uint64_t need = static_cast<std::uint64_t>(t.eval_batches) * per_batch;
  if (need <= held) return;
  const std::string fix =
      held >= per_batch ? str("use train.eval_batches: at most ", held / per_batch, ", or a longer validation set")
                        : str("one global batch alone reads ", per_batch, ": use a validation set of at least ",
                              per_batch * T + 1, " tokens");
  warnings.push_back(str(
      "data.val_path '", config.data.val_path, "' holds ", held, " sequences of model.seq_len + 1 = ", T + 1,
      " tokens, but train.eval_batches = ", t.eval_batches, " global batches read ", need, " sequences (x parallel.dp ",
      config.parallel.dp, " x train.microbatches ", t.microbatches, " x train.micro_batch_size ", t.micro_batch_size,
      "): each evaluation reads sequences again, and the validation loss "
      "weighs them more than once; ",
      fix));
}

// Checks that need more than one section of the config (the rest is validate_config's job).
void Trainer::Impl::check_config() const {
  const Config& c = config;
  if (multi_process()) check_processes(layout, options.processes->size());
  try {
    auto s = sched::generate(c.parallel.schedule, c.parallel.pp, c.train.microbatches);
    int stages = s.n_stages();
    STP_CHECK(c.model.n_layer % stages == 0, "model.n_layer = ", c.model.n_layer, " cannot be split evenly into ",
              stages, " pipeline stages (parallel.pp = ", c.parallel.pp, " x ", s.chunks,
              " chunk(s) per rank for schedule ", c.parallel.schedule, "); use a multiple of ", stages);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("model.n_layer", 0) == 0) throw Error(with_init_from_sources(c, what));
    throw Error(str("train.microbatches / parallel.pp: ", what));
  }
}

void Trainer::Impl::build_devices() {
  schedule = sched::generate(config.parallel.schedule, config.parallel.pp, config.train.microbatches);
  BackendOptions o;
  o.kind = config.parallel.backend == "cuda" ? DeviceKind::Cuda : DeviceKind::Cpu;
  const std::vector<int> mine = multi_process()
                                    ? layout.ranks_of_process(options.processes->rank(), options.processes->size())
                                    : layout.ranks_of_process(0, 1);
  o.count = static_cast<int>(mine.size());
  o.first = multi_process() ? options.processes->node_rank() : 0;
  o.capacity = memory_settings(config).device_budget;
  o.link_bytes_per_s = config.memory.link_bandwidth;
  o.dry_run = options.dry_run;
  devices = make_devices(o);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto r = std::make_unique<Rank>();
    r->global = mine[i];
    r->dp_rank = layout.dp_rank(mine[i]);
    r->pp_rank = layout.pp_rank(mine[i]);
    r->tp_rank = layout.tp_rank(mine[i]);
    r->device = devices[i].get();
    ranks.push_back(std::move(r));
  }
}

Rank* Trainer::Impl::local_rank(int global) const {
  for (auto& r : ranks)
    if (r->global == global) return r.get();
  return nullptr;
}

void Trainer::Impl::initialize_parameters() {
  if (options.dry_run) return;
  if (!config.train.resume.empty()) {
    resume(config.train.resume);
    return;
  }
  if (!config.model.init_from.empty()) {
    load_init_from(config.model.init_from);
    return;
  }
  run_on_ranks([&](Rank& r) {
    for (auto& s : r.stages) s->init_random(config.train.seed, *r.compute);
    r.optimizer->parameters_loaded();  // e.g. the sharded masters' draws wait in the gradients
  });
}

}  // namespace stp
