// The knob registry (the one table of every configuration key) and what is derived from it
// without parsing: defaults, lookup, to_yaml, the fingerprint and the Markdown reference.
// Parsing lives in config_parse.cpp, consistency checks in config_validate.cpp.
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdio>

#include "base/error.h"

namespace stp {

#define STP_FIELD(path) [](Config& c) -> KnobField { return &c.path; }

// clang-format off
static const std::vector<Knob> kKnobs = {
  // key                        type              default           choices                                   doc
  {"model.arch",             KnobType::Choice, "gpt2",           "gpt2|llama", "model family: gpt2 = HF GPT-2 semantics (learned positions, pre-LN, tanh GELU, tied head); llama = HF LlamaForCausalLM / Qwen2ForCausalLM (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention). docs/model.md", STP_FIELD(model.arch)},
  {"model.n_layer",          KnobType::Int,    "4",              "", "transformer blocks", STP_FIELD(model.n_layer)},
  {"model.n_head",           KnobType::Int,    "4",              "", "attention heads per block; divisible by parallel.tp", STP_FIELD(model.n_head)},
  {"model.n_embd",           KnobType::Int,    "128",            "", "embedding width C; divisible by model.n_head", STP_FIELD(model.n_embd)},
  {"model.vocab_size",       KnobType::Int,    "256",            "", "token vocabulary (>= 2; >= 256 for data.format text)", STP_FIELD(model.vocab_size)},
  {"model.seq_len",          KnobType::Int,    "128",            "", "tokens per sequence T (also the number of learned positions)", STP_FIELD(model.seq_len)},
  {"model.n_kv_head",        KnobType::Int,    "0",              "", "llama: key/value heads (grouped-query attention), dividing n_head and divisible by parallel.tp; 0 = n_head", STP_FIELD(model.n_kv_head)},
  {"model.intermediate_size", KnobType::Int,   "0",              "", "llama: MLP width (gate, up and down projections), divisible by parallel.tp; required", STP_FIELD(model.intermediate_size)},
  {"model.rope_theta",       KnobType::Float,  "10000",          "", "llama: base of the rotary position frequencies", STP_FIELD(model.rope_theta)},
  {"model.norm_eps",         KnobType::Float,  "1.0e-5",         "", "llama: RMSNorm epsilon", STP_FIELD(model.norm_eps)},
  {"model.qkv_bias",         KnobType::Bool,   "false",          "", "llama: the q, k and v projections have biases (true for Qwen2)", STP_FIELD(model.qkv_bias)},
  {"model.tie_embeddings",   KnobType::Choice, "auto",           "auto|true|false", "the LM head is the token embedding; auto = true for gpt2 (always tied), false for llama", STP_FIELD(model.tie_embeddings)},
  {"model.attention",        KnobType::Choice, "fused",          "fused|naive", "fused: tiled causal attention with an online softmax, activation memory linear in seq_len (keeps the output and one log-sum-exp per query row); naive: the (B, H, T, T) probabilities are kept, the reference. docs/model.md, Attention", STP_FIELD(model.attention)},
  {"model.loss_chunk_tokens", KnobType::String, "auto",         "", "the LM head and cross-entropy in chunks of this many tokens of a microbatch's micro_batch_size x seq_len, forward and backward fused in the head's F, so at most one chunk's logits exist (docs/memory.md, Chunked loss head): a positive integer (need not divide the tokens; the last chunk is shorter), none = the whole microbatch's logits kept from F to B, or auto = none while the memory plan fits memory.device_budget, else the largest of tokens/2, tokens/4, ... of at least 128 tokens whose plan fits (none when a microbatch has fewer than 256 tokens)", STP_FIELD(model.loss_chunk_tokens)},
  {"model.init_from",        KnobType::Path,   "null",           "", "a Hugging Face model folder (config.json + model.safetensors or a sharded model.safetensors.index.json; every checkpoint folder is one) whose config.json fills the model keys the YAML leaves out, or a single .safetensors file; HF or stp tensor names, F32/BF16/F16. docs/model.md, Hugging Face models; null = seeded random init", STP_FIELD(model.init_from)},
  {"data.path",              KnobType::String, "/usr/share/games/fortunes", "", "a token file, a folder of them or a glob (data/x_train_*.bin): the files concatenated in name order (docs/config.md, Data paths and shards)", STP_FIELD(data.path)},
  {"data.format",            KnobType::Choice, "text",           "text|u16|llmc|tok32", "text: bytes are tokens (vocab 256); u16: raw little-endian uint16; llmc: llm.c header + uint16; tok32: stp header + uint32", STP_FIELD(data.format)},
  {"data.sampling",          KnobType::Choice, "random",         "random|sequential|shuffle", "sequence b starts at (b*T) mod (N-T) (sequential), hash(seed, b) mod (N-T) (random), or (shuffle) at window perm(seed, epoch)(b mod W) * T of the W = (N-1)/T sequence-aligned windows, epoch = b / W: every window once per epoch, in a seeded order of its own per epoch (docs/config.md, Data sampling)", STP_FIELD(data.sampling)},
  {"data.mask_path",         KnobType::Path,   "null",           "", "the loss mask of data.path (the .mask file stp tokenize writes beside the tokens: one byte per token, 1 = that token counts as a target): a masked target is left out of the loss and of its mean, which divides by the counted targets of the global batch. docs/config.md, Loss masks; null = every target counts", STP_FIELD(data.mask_path)},
  {"data.val_mask_path",     KnobType::Path,   "null",           "", "the loss mask of data.val_path, read as data.mask_path; the validation loss is the mean over its counted targets. null = every target counts", STP_FIELD(data.val_mask_path)},
  {"data.val_path",          KnobType::Path,   "null",           "", "held-out tokens for the validation loss, in data.format (a file, a folder or a glob, as data.path); null = no validation", STP_FIELD(data.val_path)},
  {"data.tokenizer",         KnobType::Path,   "null",           "", "the BPE tokenizer the token data was made with (a tokenizer.json, or a folder as for stp tokenize): every checkpoint carries its files (tokenizer.json, or vocab.json + merges.txt, with tokenizer_config.json), so stp generate needs no --tokenizer and the folder is complete for transformers; null = model.init_from's tokenizer when that HF folder holds one, else none. Not with data.format text", STP_FIELD(data.tokenizer)},
  {"train.steps",            KnobType::Int,    "200",            "", "optimizer steps", STP_FIELD(train.steps)},
  {"train.micro_batch_size", KnobType::Int,    "4",              "", "sequences per microbatch", STP_FIELD(train.micro_batch_size)},
  {"train.microbatches",     KnobType::Int,    "8",              "", "microbatches per step on each data-parallel replica (global batch = micro_batch_size x microbatches x dp)", STP_FIELD(train.microbatches)},
  {"train.lr",               KnobType::Float,  "3.0e-4",         "", "peak learning rate; at most FLT_MAX / (2 max(1 / (1 - beta1), R, weight_decay)), the largest whose AdamW update stays finite in float32 (1.7e37 with the default optim keys; docs/config.md, Non-finite steps and health metrics)", STP_FIELD(train.lr)},
  {"train.lr_schedule",      KnobType::Choice, "cosine",         "cosine|constant", "after linear warm-up: cosine decay to min_lr at the last step, or constant", STP_FIELD(train.lr_schedule)},
  {"train.warmup_steps",     KnobType::Int,    "10",             "", "linear warm-up steps (lr * s / warmup_steps for step s <= warmup_steps)", STP_FIELD(train.warmup_steps)},
  {"train.min_lr",           KnobType::Float,  "3.0e-5",         "", "final learning rate of the cosine schedule", STP_FIELD(train.min_lr)},
  {"train.grad_clip",        KnobType::Float,  "1.0",            "", "global gradient-norm clipping threshold; 0 = off", STP_FIELD(train.grad_clip)},
  {"train.seed",             KnobType::Int,    "1234",           "", "seed of the model init and of random and shuffle sampling", STP_FIELD(train.seed)},
  {"train.resume",           KnobType::Path,   "null",           "", "a checkpoint folder to continue from; null = start fresh", STP_FIELD(train.resume)},
  {"train.precision",        KnobType::Choice, "f32",            "f32|bf16", "bf16: mixed precision (bf16 activations and GEMM operands, f32 master weights, optimizer state, reductions and residual stream); emulated bit for bit on the CPU backend. docs/model.md, Precision", STP_FIELD(train.precision)},
  {"train.eval_every",       KnobType::Int,    "0",              "", "validation loss every N steps (and after the last step); 0 = never. Needs data.val_path", STP_FIELD(train.eval_every)},
  {"train.eval_batches",     KnobType::Int,    "2",              "", "validation size in global batches: the first eval_batches x micro_batch_size x microbatches x dp sequences of data.val_path, read in order; the same at every evaluation and under every layout with that global batch", STP_FIELD(train.eval_batches)},
  {"train.max_skipped_steps", KnobType::Int,   "5",              "", "a step whose loss or gradient norm is not finite is skipped (no update); after this many consecutive skips the run stops (exit status 5)", STP_FIELD(train.max_skipped_steps)},
  {"train.peak_flops",       KnobType::Float,  "0",              "", "peak FLOP/s of one device, for the mfu metric (model FLOPs per token x tokens/s / (peak_flops x devices)); 0 = no mfu", STP_FIELD(train.peak_flops)},
  {"optim.name",             KnobType::Choice, "adamw",          "adamw", "optimizer (torch.optim.AdamW semantics)", STP_FIELD(optim.name)},
  {"optim.beta1",            KnobType::Float,  "0.9",            "", "first-moment decay", STP_FIELD(optim.beta1)},
  {"optim.beta2",            KnobType::Float,  "0.95",           "", "second-moment decay", STP_FIELD(optim.beta2)},
  {"optim.eps",              KnobType::Float,  "1.0e-8",         "", "added to sqrt of the bias-corrected second moment", STP_FIELD(optim.eps)},
  {"optim.weight_decay",     KnobType::Float,  "0.1",            "", "decoupled weight decay, on tensors with two or more dimensions only", STP_FIELD(optim.weight_decay)},
  {"parallel.backend",       KnobType::Choice, "cpu",            "cpu|cuda", "cpu: emulated devices in one process (the oracle); cuda: GPUs", STP_FIELD(parallel.backend)},
  {"parallel.dp",            KnobType::Int,    "1",              "", "data-parallel replicas, each reading its share of the global batch (threads of one process, or processes under mpirun; docs/scale-out.md)", STP_FIELD(parallel.dp)},
  {"parallel.dp_bucket",     KnobType::Bytes,  "4MiB",           "", "gradient bytes per data-parallel all-reduce (a chunk's gradients are cut into buckets of at most this size); null = one bucket per chunk", STP_FIELD(parallel.dp_bucket)},
  {"parallel.vocab_parallel", KnobType::Bool,  "true",           "", "with tp > 1, each TP rank holds V_pad/tp rows of the token embedding and of the LM head and computes the cross-entropy from its shard of the logits (Megatron style; V is padded to a multiple of tp: docs/model.md, Vocab parallelism); false: both are replicated on every TP rank", STP_FIELD(parallel.vocab_parallel)},
  {"parallel.distributed_optimizer", KnobType::Bool, "false",    "", "ZeRO-1: each data-parallel replica keeps and updates 1/dp of the AdamW state (and, in bf16, of the GEMM weights' f32 masters); gradients are reduce-scattered and the updated parameters all-gathered (bf16 copies in bf16) (docs/memory.md); a no-op with dp = 1", STP_FIELD(parallel.distributed_optimizer)},
  {"parallel.host_collectives", KnobType::Choice, "auto",       "auto|staged", "how the data-parallel reductions (all-reduce, or the distributed optimizer's reduce-scatter and all-gather) and the tied embedding's gradient sum read a streamed chunk's buffers, which live in pinned host memory (memory.param_offload): auto = in place where the communicator reads host memory (the cpu backend), else staged; staged = through one device piece at a time (a dp bucket: parallel.dp_bucket), copied up, reduced and copied back, as on the cuda backend, where NCCL cannot read host memory (selectable on the cpu backend to run that path; the same bits either way) (docs/memory.md, Parameter streaming)", STP_FIELD(parallel.host_collectives)},
  {"parallel.tp",            KnobType::Int,    "2",              "", "tensor-parallel ranks per stage; divides model.n_head", STP_FIELD(parallel.tp)},
  {"parallel.pp",            KnobType::Int,    "2",              "", "pipeline-parallel ranks", STP_FIELD(parallel.pp)},
  {"parallel.schedule",      KnobType::Choice, "stp",            "gpipe|1f1b|1f1b-i|zb-h1|zb-v|stp", "pipeline schedule", STP_FIELD(parallel.schedule)},
  {"parallel.tp_link_bandwidth", KnobType::Rate, "0",           "", "CPU backend: emulated TP all-reduce link rate (a rank's bytes / rate per all-reduce), e.g. 2GB/s; 0 or null = unlimited", STP_FIELD(parallel.tp_link_bandwidth)},
  {"parallel.cpu_threads",   KnobType::Int,    "0",              "", "OpenBLAS / oneTBB threads of the process; 0 = the number of processors", STP_FIELD(parallel.cpu_threads)},
  {"memory.device_budget",   KnobType::Bytes,  "256MiB",         "", "memory per device; null = the device's capacity", STP_FIELD(memory.device_budget)},
  {"memory.host_budget",     KnobType::BytesOrAuto, "auto",      "", "pinned host memory for the whole process (activation pools, host-placed model states); auto = this process's share of what the machine has (the smaller of MemTotal and the cgroup limit, divided among the job's processes on this host) less a reserve of 10% of it, at least 4 GiB and at most half (docs/memory.md, Host memory); a size larger than that share is an error before step 1; null = unlimited", STP_FIELD(memory.host_budget)},
  {"memory.offload",         KnobType::Choice, "auto",           "auto|none|all", "activation offload to pinned host memory", STP_FIELD(memory.offload)},
  {"memory.optimizer_offload", KnobType::Choice, "none",     "auto|none|all", "AdamW state (and, under bf16 without the distributed optimizer, the f32 masters of the GEMM weights) in pinned host memory, updated by the CPU AdamW while the device computes; auto: per (rank, chunk), chosen with the activation levers, only for the chunks the device budget needs moved (docs/memory.md, Optimizer offload)", STP_FIELD(memory.optimizer_offload)},
  {"memory.optimizer_overlap", KnobType::Choice, "none",     "auto|none|all", "the CPU AdamW of a host chunk (memory.optimizer_offload) whose gradients are final before the end of the backward runs at once, overlapping the backward of later chunks, as a speculation on the clip coefficient being 1 and the step not being skipped: committed when it is, redone from the kept state when not (bitwise either way); it takes 8 more pinned host bytes per parameter of such a chunk (12 with its f32 master on the host); all: every such chunk; auto: all when the pinned total with them fits memory.host_budget, else none (docs/memory.md, Optimizer overlap)", STP_FIELD(memory.optimizer_overlap)},
  {"memory.param_offload",   KnobType::Choice, "none",           "auto|none|all", "compute weights and gradients of a chunk in pinned host memory, streamed through the device unit by unit (a layer's attention or MLP branch, the embedding, the head) before each pass that reads them; needs memory.optimizer_offload (the CPU AdamW updates them in place); auto: the planner streams the chunks (per pipeline rank and chunk) the budget needs (docs/memory.md, Parameter streaming)", STP_FIELD(memory.param_offload)},
  {"memory.recompute",       KnobType::Choice, "auto",           "auto|none|selective|full", "activation recomputation", STP_FIELD(memory.recompute)},
  {"memory.unit_tiles",      KnobType::String, "auto",           "", "the backward of every attention / MLP unit under full recompute in this many groups of a microbatch's sequences, one group's re-forward, backward and weight gradients at a time, so a unit's backward holds about 1/N of its working set (docs/memory.md, Tiled unit backward): auto (the default) = 1 while the memory plan fits memory.device_budget, else the fewest tiles (2, 4, ... up to micro_batch_size) whose plan fits (the most when none does), or a positive integer that divides train.micro_batch_size (1: untiled)", STP_FIELD(memory.unit_tiles)},
  {"memory.link_bandwidth",  KnobType::Rate,   "0",              "", "D2H/H2D link rate, e.g. 12GB/s: the CPU backend's emulated link (0 or null = unlimited) and, on every backend, the planner's (0 or null = nominal: 8 GB/s CPU, the GPU's row of docs/memory.md's table)", STP_FIELD(memory.link_bandwidth)},
  {"memory.copy_engine_cpus", KnobType::Int,   "0",              "", "CPU backend: the last N CPUs run only the D2H/H2D copy streams (an emulated copy engine, as a GPU's DMA engines do not take compute); 0 = copies share every CPU", STP_FIELD(memory.copy_engine_cpus)},
  {"output.dir",             KnobType::String, "runs/tiny",      "", "run folder: metrics.jsonl, config.yaml, checkpoints, trace.json", STP_FIELD(output.dir)},
  {"output.log_every",       KnobType::Int,    "1",              "", "write a metrics.jsonl line every N steps", STP_FIELD(output.log_every)},
  {"output.checkpoint_every", KnobType::Int,   "0",              "", "write output.dir/checkpoint-STEP every N steps; 0 = only at the end (a run stopped by SIGINT, SIGTERM or SIGHUP writes one too)", STP_FIELD(output.checkpoint_every)},
  {"output.trace",           KnobType::Bool,   "false",          "", "write output.dir/trace.json for `stp profile`", STP_FIELD(output.trace)},
};
// clang-format on

#undef STP_FIELD

const std::vector<Knob>& config_knobs() { return kKnobs; }

const std::vector<std::string>& config_sections() {
  static const std::vector<std::string> sections = {"model", "data", "train", "optim", "parallel", "memory", "output"};
  return sections;
}

const Knob* find_knob(const std::string& key) {
  for (const Knob& k : kKnobs)
    if (key == k.key) return &k;
  return nullptr;
}

const char* to_string(KnobType type) {
  switch (type) {
    case KnobType::Int: return "int";
    case KnobType::Float: return "float";
    case KnobType::Bool: return "bool";
    case KnobType::String: return "string";
    case KnobType::Choice: return "choice";
    case KnobType::Path: return "path or null";
    case KnobType::Bytes: return "bytes or null";
    case KnobType::BytesOrAuto: return "bytes, auto or null";
    case KnobType::Rate: return "bytes/s";
  }
  return "?";
}

namespace {

std::string format_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return std::string(buf, r.ptr);
}

std::string format_bytes_knob(std::uint64_t b) {
  static const struct {
    std::uint64_t unit;
    const char* name;
  } units[] = {{1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (const auto& u : units)
    if (b >= u.unit && b % u.unit == 0) return std::to_string(b / u.unit) + u.name;
  return std::to_string(b);
}

// The knob's current value as YAML scalar text; nullopt = null.
std::optional<std::string> knob_value_text(const Knob& k, const Config& cfg) {
  KnobField f = k.field(const_cast<Config&>(cfg));
  if (k.type == KnobType::Bytes || k.type == KnobType::BytesOrAuto) {
    auto* b = std::get<std::optional<std::uint64_t>*>(f);
    if (!b->has_value()) return std::nullopt;
    if (k.type == KnobType::BytesOrAuto && **b == kAutoBytes) return "auto";
    return format_bytes_knob(**b);
  }
  if (k.type == KnobType::Path && std::get<std::string*>(f)->empty()) return std::nullopt;
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>) return format_double(*p);
        else if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return *p;
        else if constexpr (std::is_same_v<T, std::optional<std::uint64_t>>) return "";  // handled above
        else return std::to_string(*p);
      },
      f);
}

}  // namespace

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const std::string& section : config_sections()) {
    out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const Knob& k : kKnobs) {
      std::string key = k.key;
      if (key.compare(0, section.size() + 1, section + ".") != 0) continue;
      out << YAML::Key << key.substr(section.size() + 1) << YAML::Value;
      auto text = knob_value_text(k, *this);
      if (!text) out << YAML::Null;
      else if (k.type == KnobType::String || k.type == KnobType::Path) out << YAML::DoubleQuoted << *text;
      else out << *text;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

namespace {
bool llama_only_key(const std::string& key) {
  return key == "model.n_kv_head" || key == "model.intermediate_size" || key == "model.rope_theta" ||
         key == "model.norm_eps" || key == "model.qkv_bias" || key == "model.tie_embeddings";
}
}  // namespace

std::string config_fingerprint(const Config& cfg) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (const Knob& k : kKnobs) {
    std::string key = k.key;
    // model.loss_chunk_tokens is how the loss is computed, not what the model is: a run may resume
    // across it, and fingerprints stay what they were before the key.
    if (key.rfind("model.", 0) != 0 || key == "model.init_from" || key == "model.loss_chunk_tokens") continue;
    // GPT-2 ignores the llama keys: its fingerprints stay what they were before those keys.
    if (cfg.model.arch == "gpt2" && llama_only_key(key)) continue;
    std::string line = key + "=" + knob_value_text(k, cfg).value_or("null") + "\n";
    for (unsigned char c : line) h = (h ^ c) * 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string config_knob_table_markdown() {
  std::string md = "| key | type | default | description |\n|---|---|---|---|\n";
  for (const Knob& k : kKnobs) {
    std::string type = to_string(k.type);
    if (k.type == KnobType::Choice) {
      type = "";
      std::string choices = k.choices;
      std::size_t start = 0;
      // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict overlap for
      // "`" + std::string temporary.
      for (std::size_t bar; (bar = choices.find('|', start)) != std::string::npos; start = bar + 1)
        type.append("`").append(choices, start, bar - start).append("`, ");
      type.append("`").append(choices, start).append("`");
    }
    md += str("| `", k.key, "` | ", type, " | `", k.default_value, "` | ", k.doc, " |\n");
  }
  return md;
}

}  // namespace stp
