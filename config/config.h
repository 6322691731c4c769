// The run configuration: one struct per YAML section (docs/design.md, Configuration) and ONE registry of
// knobs (config_knobs()) that drives defaults, parsing, `--set` overrides, validation of types
// and choices, Config::to_yaml() and the reference page docs/config.md. Adding a knob = adding
// a field below and one row to the table in config/config.cpp (tests/config/config_docs_test.cpp
// then asks for docs/config.md to be regenerated).
//
// Usage:
//   stp::Config cfg = stp::load_config("configs/tiny.yaml", {"parallel.tp=2", "train.steps=10"});
//   cfg.model.n_layer; cfg.memory.device_budget.value_or(capacity); cfg.to_yaml();
//
// Errors (stp::Error, one line each):
//   * missing / unparsable file: the path, and yaml-cpp's line:column and message; a second YAML
//     document in the text (after a `---` line), which would otherwise be ignored;
//   * unknown key at any level (file or --set): the key and the valid keys of its section;
//   * wrong type: the key, the value and the expected type; bad choice: the valid choices;
//   * an empty value: `--set KEY=` (an unset shell variable) for any key, `key: ""` for a path;
//     none is written null;
//   * inconsistent values (validate_config): the keys involved and what to change, and which of
//     them model.init_from's config.json gave (with_init_from_sources, config/hf_config.h).
//
// Byte sizes (memory.device_budget, memory.host_budget): an integer number of bytes, or a
// number with a unit: B; KiB, MiB, GiB, TiB (powers of 1024); KB (also kB), MB, GB, TB (powers
// of 1000, SI). Fractions are allowed ("1.5GiB") and rounded to the nearest byte.
// memory.host_budget also takes `auto` (kAutoBytes in the Config; train/memory_settings.h turns
// it into bytes: what this machine has, less a reserve). Rates
// (memory.link_bandwidth) are the same with an optional "/s": "12GB/s" = 12e9 bytes per second.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace stp {

struct ModelConfig {
  std::string arch;
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;
  int seq_len = 0;
  // llama only (gpt2 ignores them; docs/model.md):
  int n_kv_head = 0;           // key/value heads; 0 = n_head
  int intermediate_size = 0;   // MLP width; required (> 0) for llama
  double rope_theta = 0;       // RoPE base
  double norm_eps = 0;         // RMSNorm epsilon
  bool qkv_bias = false;       // q, k, v projections have biases (Qwen2)
  std::string tie_embeddings;  // auto | true | false; auto = true for gpt2, false for llama
  std::string attention;       // fused | naive
  std::string init_from;       // "" = null: seeded random init
  // auto | none | a positive integer: tokens per chunk of the loss head (train/loss_chunk.h)
  std::string loss_chunk_tokens;
  // Not YAML keys: bos_token_id / eos_token_id of model.init_from's config.json as JSON text
  // ("" = absent), written back into exported config.json files (config/hf_config.h).
  std::string hf_bos_token_id;
  std::string hf_eos_token_id;
  // Not YAML keys: the model keys whose values model.init_from's config.json gave (the YAML and
  // --set left them out), named as the source in messages about them (config/hf_config.h).
  std::set<std::string> init_from_keys;
};

struct DataConfig {
  std::string path;
  std::string format;     // text | u16 | llmc | tok32
  std::string sampling;   // random | sequential | shuffle
  std::string val_path;   // "" = null: no validation
  std::string tokenizer;  // "" = null: model.init_from's, or none (data/tokenizer_files.h)
  // The loss masks of data.path and data.val_path (data/loss_mask.h); "" = null: every target counts.
  std::string mask_path;
  std::string val_mask_path;
};

struct TrainConfig {
  std::int64_t steps = 0;
  int micro_batch_size = 0;
  int microbatches = 0;
  double lr = 0;
  std::string lr_schedule;  // cosine | constant
  std::int64_t warmup_steps = 0;
  double min_lr = 0;
  double grad_clip = 0;  // 0 = off
  std::uint64_t seed = 0;
  std::string resume;                  // "" = null
  std::string precision;               // f32 | bf16
  std::int64_t eval_every = 0;         // 0 = never
  std::int64_t eval_batches = 0;       // global batches of held-out sequences
  std::int64_t max_skipped_steps = 0;  // consecutive non-finite steps before the run stops
  double peak_flops = 0;               // per device; 0 = no MFU
};

struct OptimConfig {
  std::string name;  // adamw
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
};

struct ParallelConfig {
  std::string backend;  // cpu | cuda
  int dp = 0, tp = 0, pp = 0;
  std::optional<std::uint64_t> dp_bucket;  // bytes per DP all-reduce; nullopt = one bucket per chunk
  bool vocab_parallel = true;              // embedding and LM head split over TP ranks by vocabulary rows
  bool distributed_optimizer = false;      // ZeRO-1 over the dp replicas (no-op with dp = 1)
  std::string schedule;                    // gpipe | 1f1b | 1f1b-i | zb-h1 | zb-v | stp
  double tp_link_bandwidth = 0;            // CPU backend: emulated TP all-reduce rate, bytes/s; 0 = unlimited
  int cpu_threads = 0;                     // after load_config: >= 1 (0 in the file = the number of processors)
  std::string host_collectives;            // auto | staged (stages_host_collectives)
};

struct MemoryConfig {
  // The planner, the trainer and `stp plan` read these four through train/memory_settings.h,
  // which turns the budgets into bytes (memory.host_budget: auto too) and the policies into enums
  // (memory/policy.h).
  std::optional<std::uint64_t> device_budget;  // bytes per device; nullopt = the device's capacity
  std::optional<std::uint64_t> host_budget;    // pinned host bytes per process; nullopt: unlimited; kAutoBytes: auto
  std::string offload;                         // auto | none | all
  std::string recompute;                       // auto | none | selective | full
  std::string unit_tiles;         // auto | a positive integer dividing micro_batch_size (train/unit_tiles.h)
  std::string optimizer_offload;  // auto | none | all: AdamW state on the host
  std::string optimizer_overlap;  // auto | none | all: the CPU AdamW speculates during the backward
  std::string param_offload;      // auto | none | all: weights and gradients streamed from the host
  double link_bandwidth = 0;      // bytes/s of the D2H/H2D link (CPU: emulated; planner: all backends)
  int copy_engine_cpus = 0;       // CPU backend: CPUs reserved for the D2H/H2D stream threads; 0 = shared
};

struct OutputConfig {
  std::string dir;
  std::int64_t log_every = 0;
  std::int64_t checkpoint_every = 0;  // 0 = only at the end
  bool trace = false;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  MemoryConfig memory;
  OutputConfig output;

  // The resolved configuration as YAML (every knob, in registry order); load_config() of this
  // text gives back the same Config.
  std::string to_yaml() const;
};

// ---- The knob registry -------------------------------------------------------------------

enum class KnobType {
  Int,          // integer
  Float,        // number
  Bool,         // true | false
  String,       // any string
  Choice,       // one of Knob::choices
  Path,         // a non-empty string, or null (""): none
  Bytes,        // byte size or null (see above)
  BytesOrAuto,  // byte size, auto (kAutoBytes) or null: memory.host_budget
  Rate,         // bytes per second; 0 or null = unlimited
};

// The value of a KnobType::BytesOrAuto knob set to `auto` (no byte size reaches it: 16 EiB).
inline constexpr std::uint64_t kAutoBytes = UINT64_MAX;

using KnobField =
    std::variant<int*, std::int64_t*, std::uint64_t*, double*, bool*, std::string*, std::optional<std::uint64_t>*>;

struct Knob {
  const char* key;  // dotted path: "section.name"
  KnobType type;
  const char* default_value;  // YAML scalar text
  const char* choices;        // KnobType::Choice: "a|b|c"; otherwise ""
  const char* doc;            // one line
  KnobField (*field)(Config&);
};

const std::vector<Knob>& config_knobs();            // registry order = YAML order
const std::vector<std::string>& config_sections();  // model, data, train, optim, parallel, memory, output
const Knob* find_knob(const std::string& key);      // nullptr when unknown
const char* to_string(KnobType type);               // "int", "float", ... (as in docs/config.md)

// ---- Loading -----------------------------------------------------------------------------

// Every knob at its registry default (cpu_threads left at 0 = unresolved).
Config default_config();

// Reads `path` (YAML; an empty file = all defaults), applies `overrides` ("KEY=VALUE", the value
// a YAML scalar parsed with the key's type) in order, resolves parallel.cpu_threads = 0 to the
// number of processors, and validates (validate_config).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// The same from YAML text; `source` names it in messages (a path, "<string>").
Config load_config_from_string(const std::string& yaml, const std::string& source,
                               const std::vector<std::string>& overrides = {});

// Applies one "KEY=VALUE" override to `cfg` (no validation).
void apply_override(Config& cfg, const std::string& assignment);

// Consistency checks that need only the config (ranges, divisibility, backend/precision).
// Whether the schedule can place model.n_layer on parallel.pp ranks is checked by schedule/.
void validate_config(const Config& cfg);

// Whether the collectives over a streamed chunk's pinned host buffers (the dp reductions, the tied
// embedding's gradient sum) go through a device staging piece (optim/staged_comm.h):
// parallel.host_collectives staged, or auto on the cuda backend, whose NCCL cannot read host memory.
inline bool stages_host_collectives(const Config& c) {
  return c.parallel.host_collectives == "staged" || c.parallel.backend == "cuda";
}

// The largest train.lr whose AdamW update is finite in f32 for every finite gradient history
// from zero moments (the derivation is at its definition, config/config_validate.cpp, and in
// docs/config.md, Non-finite steps and health metrics): FLT_MAX / (2 · max(1 / (1 − beta1), R,
// weight_decay)), R = adamw_update_bound(optim). validate_config refuses a larger train.lr.
double max_finite_lr(const OptimConfig& optim);

// R: the bound on |m̂ / (sqrt(v̂) + eps)| of every AdamW step from zero moments with finite
// gradients, (1 − beta1) / sqrt((1 − beta2) · (1 − beta1² / beta2)), when beta1² < beta2; 0 when
// there is none (beta1² >= beta2: the ratio grows without bound with the steps).
double adamw_update_bound(const OptimConfig& optim);

// "256MiB" -> 268435456, "4GB" -> 4000000000, "1024" -> 1024. Throws stp::Error naming `key`.
std::uint64_t parse_byte_size(const std::string& text, const std::string& key);
// "12GB/s" -> 12e9 (bytes per second); "0" -> 0.
double parse_byte_rate(const std::string& text, const std::string& key);

// A 16-hex-digit fingerprint of the model-shape knobs (model.* except init_from): a
// checkpoint saved under one fingerprint fits a model built under the same fingerprint.
std::string config_fingerprint(const Config& cfg);

// The knob reference as a Markdown table (the generated part of docs/config.md).
std::string config_knob_table_markdown();

}  // namespace stp
