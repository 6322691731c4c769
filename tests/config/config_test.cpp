#include <cmath>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "config/config.h"
#include "base/error.h"
#include "tests/support/files.h"

using namespace stp;
using stp::testing::expect_error;

namespace {

// docs/design.md, Configuration, verbatim: every key with its documented default.
const char* kDesignYaml = R"(
model:
  arch: gpt2              # gpt2 (HF GPT-2 semantics: learned positions, pre-LN, tanh GELU, tied head)
  n_layer: 4
  n_head: 4
  n_embd: 128
  vocab_size: 256
  seq_len: 128
  init_from: null         # a .safetensors file with HF GPT-2 tensor names; null = seeded random init
data:
  path: /usr/share/games/fortunes   # a file or a folder of files
  format: text            # text (bytes, vocab 256) | u16 (raw little-endian uint16) | llmc (llm.c header + uint16)
  sampling: random        # random (seeded) | sequential | shuffle (every window once per epoch)
  tokenizer: null         # the tokenizer of the token data; every checkpoint carries its files
train:
  steps: 200
  micro_batch_size: 4     # sequences per microbatch
  microbatches: 8         # microbatches per step on each data-parallel replica
                          # (global batch = micro_batch_size x microbatches x dp)
  lr: 3.0e-4
  lr_schedule: cosine     # cosine | constant
  warmup_steps: 10
  min_lr: 3.0e-5
  grad_clip: 1.0          # global-norm clipping; 0 = off
  seed: 1234
  resume: null            # a checkpoint folder to continue from
optim:
  name: adamw
  beta1: 0.9
  beta2: 0.95
  eps: 1.0e-8
  weight_decay: 0.1       # on tensors with two or more dimensions only
parallel:
  backend: cpu            # cpu | cuda
  dp: 1                   # data-parallel replicas (multi-process runs)
  tp: 2
  pp: 2
  schedule: stp
memory:
  device_budget: 256MiB   # per device: bytes or KiB/MiB/GiB; null = the device's capacity
  host_budget: auto       # pinned host memory per process; auto = the machine less a reserve
  offload: auto           # auto | none | all
  recompute: auto         # auto | none | selective | full
output:
  dir: runs/tiny
  log_every: 1
  checkpoint_every: 0     # steps; 0 = only at the end
  trace: false            # write output.dir/trace.json for `stp profile`
)";

Config load(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return load_config_from_string(yaml, "test.yaml", overrides);
}

}  // namespace

TEST(Config, DesignExampleParsesAndEqualsTheDefaults) {
  Config design = load(kDesignYaml);
  Config defaults = load("");
  EXPECT_EQ(design.to_yaml(), defaults.to_yaml());
  const Config& c = defaults;
  EXPECT_EQ(c.model.arch, "gpt2");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.seq_len, 128);
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_EQ(c.data.path, "/usr/share/games/fortunes");
  EXPECT_EQ(c.data.format, "text");
  EXPECT_EQ(c.data.sampling, "random");
  EXPECT_EQ(c.train.steps, 200);
  EXPECT_EQ(c.train.micro_batch_size, 4);
  EXPECT_EQ(c.train.microbatches, 8);
  EXPECT_DOUBLE_EQ(c.train.lr, 3.0e-4);
  EXPECT_EQ(c.train.lr_schedule, "cosine");
  EXPECT_EQ(c.train.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 3.0e-5);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 1234u);
  EXPECT_EQ(c.train.resume, "");
  EXPECT_EQ(c.train.precision, "f32");
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1.0e-8);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_EQ(c.parallel.backend, "cpu");
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.parallel.dp_bucket, std::optional<std::uint64_t>(4u << 20));
  EXPECT_FALSE(c.parallel.distributed_optimizer);
  EXPECT_TRUE(c.parallel.vocab_parallel);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.schedule, "stp");
  EXPECT_EQ(c.parallel.cpu_threads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(c.memory.device_budget, std::optional<std::uint64_t>(256ull << 20));
  EXPECT_EQ(c.memory.host_budget, std::optional<std::uint64_t>(kAutoBytes));
  EXPECT_EQ(c.memory.offload, "auto");
  EXPECT_EQ(c.memory.recompute, "auto");
  EXPECT_EQ(c.memory.link_bandwidth, 0.0);
  EXPECT_EQ(c.output.dir, "runs/tiny");
  EXPECT_EQ(c.output.log_every, 1);
  EXPECT_EQ(c.output.checkpoint_every, 0);
  EXPECT_FALSE(c.output.trace);
}

TEST(Config, RegistryCoversEveryFieldOnceAndDefaultsAreValid) {
  std::set<std::string> keys;
  for (const Knob& k : config_knobs()) {
    EXPECT_TRUE(keys.insert(k.key).second) << "duplicate knob " << k.key;
    EXPECT_NE(std::string(k.doc), "") << k.key;
    EXPECT_EQ(find_knob(k.key), &k);
  }
  EXPECT_EQ(keys.size(), 67u);  // 37 keys of docs/design.md's example + precision, link_bandwidth, tp_link_bandwidth,
                                // cpu_threads, copy_engine_cpus, dp_bucket, distributed_optimizer, ..., val_path,
                                // eval_every, eval_batches, max_skipped_steps, peak_flops, the six llama model keys,
                                // vocab_parallel, optimizer_offload, mask_path, val_mask_path, optimizer_overlap,
                                // param_offload, loss_chunk_tokens, host_collectives, unit_tiles (update on purpose)
  EXPECT_NO_THROW(validate_config(default_config()));
}

TEST(Config, UnknownKeysNameTheKeyAndListTheSection) {
  expect_error([] { load("model:\n  n_layers: 4\n"); },
               {"unknown key 'model.n_layers'", "test.yaml:2:3", "valid keys of 'model'", "n_layer", "seq_len"});
  expect_error([] { load("modle:\n  n_layer: 4\n"); }, {"unknown section 'modle'", "valid sections", "model, data"});
  expect_error([] { load("train:\n  steps: 3\n  schedule: stp\n"); },
               {"unknown key 'train.schedule'", "test.yaml:3:3"});
  // A nested map under a knob is a type error naming the knob.
  expect_error([] { load("model:\n  n_layer:\n    x: 1\n"); }, {"model.n_layer", "expected a int value, got a map"});
  expect_error([] { load("model: 4\n"); }, {"section 'model' must be a map"});
  // parallel.vocab_parallel is a bool: anything else names the key, the value and what is expected.
  expect_error([] { load("parallel:\n  vocab_parallel: sometimes\n"); },
               {"parallel.vocab_parallel", "'sometimes' is not a bool (true or false)"});
  expect_error([] { load("parallel:\n  vocab_parallel: 2\n"); }, {"parallel.vocab_parallel", "'2' is not a bool"});
  expect_error([] { load("- 1\n- 2\n"); }, {"top level must be a map"});
  for (const char* bad : {"0", "-3", "12x", "half", "1e3"})
    expect_error([bad] { validate_config(load(std::string("model:\n  loss_chunk_tokens: ") + bad + "\n")); },
                 {"model.loss_chunk_tokens", "auto, none or a positive integer", std::string("'") + bad + "'"});
  for (const char* good : {"auto", "none", "1", "4096"})
    EXPECT_NO_THROW(validate_config(load(std::string("model:\n  loss_chunk_tokens: ") + good + "\n"))) << good;
  // memory.unit_tiles: auto or a divisor of train.micro_batch_size (4 by default).
  for (const char* bad : {"0", "3", "8", "-2", "two"})
    expect_error([bad] { validate_config(load(std::string("memory:\n  unit_tiles: ") + bad + "\n")); },
                 {"memory.unit_tiles", "divides train.micro_batch_size (4)", std::string("'") + bad + "'"});
  for (const char* good : {"auto", "1", "2", "4"})
    EXPECT_NO_THROW(validate_config(load(std::string("memory:\n  unit_tiles: ") + good + "\n"))) << good;
  expect_error([] { load("model:\n  n_layer: 4\n  n_layer: 5\n"); }, {"model.n_layer", "twice"});
}

TEST(Config, WrongTypesNameKeyValueAndExpectedType) {
  expect_error([] { load("model:\n  n_layer: four\n"); }, {"model.n_layer", "'four'", "an integer", "test.yaml:2:12"});
  expect_error([] { load("model:\n  n_layer: 4.5\n"); }, {"model.n_layer", "'4.5'", "integer"});
  expect_error([] { load("train:\n  lr: fast\n"); }, {"train.lr", "'fast'", "number"});
  expect_error([] { load("output:\n  trace: maybe\n"); }, {"output.trace", "'maybe'", "bool"});
  expect_error([] { load("train:\n  seed: -1\n"); }, {"train.seed", "'-1'", "non-negative integer"});
  expect_error([] { load("model:\n  n_layer: 99999999999\n"); }, {"model.n_layer", "out of range"});
  expect_error([] { load("data:\n  path: null\n"); }, {"data.path", "non-empty string"});
  expect_error([] { load("memory:\n  device_budget: 12 furlongs\n"); },
               {"memory.device_budget", "'12 furlongs'", "byte size", "KiB"});
  expect_error([] { load("parallel:\n  tp: [1, 2]\n"); }, {"parallel.tp", "got a list"});
}

TEST(Config, BadChoicesListTheValidOnes) {
  expect_error([] { load("parallel:\n  schedule: pipedream\n"); },
               {"parallel.schedule", "'pipedream'", "gpipe,1f1b,1f1b-i,zb-h1,zb-v,stp"});
  expect_error([] { load("parallel:\n  backend: tpu\n"); }, {"parallel.backend", "'tpu'", "cpu,cuda"});
  expect_error([] { load("memory:\n  offload: some\n"); }, {"memory.offload", "auto,none,all"});
  expect_error([] { load("memory:\n  recompute: half\n"); }, {"memory.recompute", "auto,none,selective,full"});
  expect_error([] { load("train:\n  lr_schedule: linear\n"); }, {"train.lr_schedule", "cosine,constant"});
  expect_error([] { load("data:\n  sampling: shuffled\n"); }, {"data.sampling", "random,sequential"});
  expect_error([] { load("data:\n  format: u32\n"); }, {"data.format", "text,u16,llmc"});
  expect_error([] { load("train:\n  precision: fp16\n"); }, {"train.precision", "f32,bf16"});
  for (const char* s : {"gpipe", "1f1b", "1f1b-i", "zb-h1", "zb-v", "stp"})
    EXPECT_EQ(load("", {std::string("parallel.schedule=") + s}).parallel.schedule, s);
}

TEST(Config, ConsistencyChecksNameTheKeys) {
  expect_error([] { load("parallel:\n  tp: 3\n"); }, {"parallel.tp (3) must divide model.n_head (4)"});
  expect_error([] { load("model:\n  n_embd: 130\n"); }, {"model.n_embd (130)", "divisible by model.n_head (4)"});
  EXPECT_EQ(load("train:\n  precision: bf16\n").train.precision, "bf16");  // the CPU backend emulates it
  EXPECT_EQ(load("train:\n  precision: bf16\nparallel:\n  backend: cuda\n").train.precision, "bf16");
  expect_error([] { load("model:\n  vocab_size: 100\n"); }, {"model.vocab_size (100)", ">= 256", "text"});
  EXPECT_EQ(load("model:\n  vocab_size: 100\ndata:\n  format: u16\n").model.vocab_size, 100);
  // Bytes need no tokenizer: data.tokenizer is for token files.
  expect_error([] { load("data:\n  tokenizer: gpt2/\n"); }, {"data.tokenizer 'gpt2/'", "data.format text"});
  EXPECT_EQ(load("data:\n  format: llmc\n  tokenizer: gpt2/\n").data.tokenizer, "gpt2/");
  expect_error([] { load("model:\n  vocab_size: 1\ndata:\n  format: u16\n"); }, {"model.vocab_size must be >= 2"});
  for (const char* key : {"parallel.tp", "parallel.pp", "parallel.dp", "train.micro_batch_size", "train.microbatches",
                          "train.steps", "model.seq_len", "model.n_layer"})
    expect_error([&] { load("", {std::string(key) + "=0"}); }, {key, ">= 1"});
  expect_error([] { load("train:\n  min_lr: 1.0\n"); }, {"train.min_lr", "train.lr"});
  expect_error([] { load("optim:\n  beta2: 1.0\n"); }, {"optim.beta2", "[0, 1)"});
  expect_error([] { load("memory:\n  device_budget: 0\n"); }, {"memory.device_budget must be > 0"});
  expect_error([] { load("", {"parallel.dp_bucket=2"}); }, {"parallel.dp_bucket must be at least 4 bytes"});
  EXPECT_FALSE(load("", {"parallel.dp_bucket=null"}).parallel.dp_bucket.has_value());
}

// A learning rate whose AdamW step overflows float32 is refused, naming the limit: with the default
// optim keys FLT_MAX / 20 (the step size lr / (1 - beta1) of step 1; docs/config.md, Non-finite
// steps and health metrics). 1e38, 1e39 and 1e300 are finite doubles, so the type check passes them.
TEST(Config, LearningRateWhoseUpdateOverflowsIsRefused) {
  for (const char* lr : {"1e38", "1e39", "1e300", "1.71e37"})
    expect_error([&] { load("", {std::string("train.lr=") + lr}); },
                 {"train.lr", "must be at most 1.70141e+37", "finite in float32", "optim.beta1 0.9"});
  EXPECT_EQ(load("", {"train.lr=1.7e37"}).train.lr, 1.7e37);
  // beta1 = 0: the step size is lr itself, and the update is bounded by lr / sqrt(1 - beta2).
  expect_error(
      [] {
        load("", {"optim.beta1=0", "optim.beta2=0.9999", "train.lr=1e37"});
      },
      {"train.lr", "must be at most 1.70141e+36"});
  // A weight decay beyond 1 / (1 - beta1) bounds it by the decay factor 1 - lr * weight_decay.
  expect_error(
      [] {
        load("", {"optim.weight_decay=1e20", "train.lr=1e19"});
      },
      {"train.lr", "must be at most 1.70141e+18"});
}

TEST(Config, SetOverridesByDottedPath) {
  Config c =
      load("parallel:\n  tp: 2\n", {"parallel.tp=4", "train.lr=1e-3", "memory.device_budget=1.5GiB",
                                    "memory.host_budget=null", "model.init_from=w.safetensors", "output.trace=true",
                                    "memory.link_bandwidth=12GB/s", "parallel.cpu_threads=3"});
  EXPECT_EQ(c.parallel.tp, 4);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.memory.device_budget, std::optional<std::uint64_t>(3ull << 29));
  EXPECT_FALSE(c.memory.host_budget.has_value());
  EXPECT_EQ(c.model.init_from, "w.safetensors");
  EXPECT_TRUE(c.output.trace);
  EXPECT_DOUBLE_EQ(c.memory.link_bandwidth, 12e9);
  EXPECT_EQ(c.parallel.cpu_threads, 3);
  // The last override wins; the overrides are validated like the file.
  EXPECT_EQ(load("", {"train.steps=5", "train.steps=7"}).train.steps, 7);
  expect_error([] { load("", {"parallel.tp=3"}); }, {"parallel.tp (3) must divide"});
}

TEST(Config, SetRejectsUnknownKeysAndBadValues) {
  expect_error([] { load("", {"parallel.tpp=2"}); },
               {"unknown key 'parallel.tpp'", "--set parallel.tpp=2", "valid keys of 'parallel'", "tp"});
  expect_error([] { load("", {"paralel.tp=2"}); }, {"unknown section 'paralel'"});
  expect_error([] { load("", {"model.n_layer.x=2"}); }, {"unknown key 'model.n_layer.x'", "valid keys of 'model'"});
  expect_error([] { load("", {"model=2"}); }, {"unknown key 'model'"});
  expect_error([] { load("", {"parallel.tp"}); }, {"KEY=VALUE", "'parallel.tp'"});
  expect_error([] { load("", {"parallel.tp=two"}); }, {"parallel.tp", "'two'", "integer", "--set"});
  expect_error([] { load("", {"parallel.tp={"}); }, {"parallel.tp", "cannot parse"});
  expect_error([] { load("", {"parallel.tp=[2]"}); }, {"parallel.tp", "got a list"});
}

TEST(Config, ByteSizesAndRates) {
  EXPECT_EQ(parse_byte_size("1024", "k"), 1024u);
  EXPECT_EQ(parse_byte_size("0", "k"), 0u);
  EXPECT_EQ(parse_byte_size("17B", "k"), 17u);
  EXPECT_EQ(parse_byte_size("2KiB", "k"), 2048u);
  EXPECT_EQ(parse_byte_size("256MiB", "k"), 256ull << 20);
  EXPECT_EQ(parse_byte_size("4GiB", "k"), 4ull << 30);
  EXPECT_EQ(parse_byte_size("1TiB", "k"), 1ull << 40);
  EXPECT_EQ(parse_byte_size("1.5GiB", "k"), 3ull << 29);
  EXPECT_EQ(parse_byte_size("12 KB", "k"), 12000u);
  EXPECT_EQ(parse_byte_size("3kB", "k"), 3000u);
  EXPECT_EQ(parse_byte_size("4GB", "k"), 4000000000u);
  EXPECT_EQ(parse_byte_size("2TB", "k"), 2000000000000u);
  for (const char* bad : {"", "-1", "1.5 furlongs", "MiB", "4 GiBs", "4gib", " 4", "1e400"})
    expect_error([&] { parse_byte_size(bad, "memory.host_budget"); }, {"memory.host_budget", "byte size"});
  EXPECT_DOUBLE_EQ(parse_byte_rate("12GB/s", "k"), 12e9);
  EXPECT_DOUBLE_EQ(parse_byte_rate("1GiB/s", "k"), 1073741824.0);
  EXPECT_DOUBLE_EQ(parse_byte_rate("5e9", "k"), 5e9);
  expect_error([] { parse_byte_rate("12GB/h", "memory.link_bandwidth"); }, {"memory.link_bandwidth", "byte rate"});
  expect_error([] { parse_byte_size("12GB/s", "memory.device_budget"); }, {"memory.device_budget"});
  EXPECT_EQ(load("memory:\n  link_bandwidth: null\n").memory.link_bandwidth, 0.0);
  EXPECT_FALSE(load("memory:\n  device_budget: null\n").memory.device_budget.has_value());
  EXPECT_FALSE(load("memory:\n  device_budget: ~\n").memory.device_budget.has_value());
}

// What format_bytes prints (the budgets in `stp plan` and in its errors) reads back as a byte size:
// exactly in bytes, within half a last digit when Human, and never below the bytes when rounded up
// (a printed minimum budget, set as is, fits).
TEST(Config, PrintedByteSizesReadBack) {
  std::vector<std::size_t> sizes = {0, 1, 1023, 1024, 11000, 993792, 9646592, 268435456, 6180077824, 54814898688};
  for (std::size_t b = 1000; b < (std::size_t{1} << 42); b = b * 37 / 11 + 17) sizes.push_back(b);
  for (std::size_t b : sizes) {
    SCOPED_TRACE(b);
    EXPECT_EQ(parse_byte_size(format_bytes(b, ByteStyle::Exact), "k"), b);
    const std::string up = format_bytes(b, ByteStyle::Human, Rounding::Up);
    const std::uint64_t read = parse_byte_size(up, "k"), nearest = parse_byte_size(format_bytes(b), "k");
    EXPECT_GE(read, b) << up;
    EXPECT_LE(static_cast<double>(read - b), 0.01 * static_cast<double>(b) + 1) << up;  // last digit < 1%
    EXPECT_LE(std::abs(static_cast<double>(nearest) - static_cast<double>(b)), 0.005 * static_cast<double>(b) + 1)
        << format_bytes(b);
  }
}

TEST(Config, ToYamlRoundTrips) {
  Config c = load("", {"model.init_from=gpt2.safetensors", "memory.device_budget=1000", "memory.host_budget=null",
                       "train.lr=0.000123", "data.path=null.txt", "output.dir=runs/a b",
                       "memory.link_bandwidth=1.5GB/s", "train.seed=18446744073709551615"});
  std::string y = c.to_yaml();
  Config back = load(y);
  EXPECT_EQ(back.to_yaml(), y);
  EXPECT_EQ(back.model.init_from, "gpt2.safetensors");
  EXPECT_EQ(back.memory.device_budget, std::optional<std::uint64_t>(1000));
  EXPECT_FALSE(back.memory.host_budget.has_value());
  EXPECT_EQ(back.train.lr, 0.000123);
  EXPECT_EQ(back.output.dir, "runs/a b");
  EXPECT_EQ(back.train.seed, 18446744073709551615ull);
  EXPECT_NE(y.find("device_budget: 1000"), std::string::npos) << y;
  EXPECT_NE(load("").to_yaml().find("device_budget: 256MiB"), std::string::npos);
}

// memory.host_budget takes auto (the default), a size or null; auto reads and writes back as
// auto, and only this key takes it.
TEST(Config, HostBudgetTakesAuto) {
  EXPECT_EQ(load("").memory.host_budget, std::optional<std::uint64_t>(kAutoBytes));
  EXPECT_EQ(load("memory:\n  host_budget: 2GiB\n").memory.host_budget, std::optional<std::uint64_t>(2ull << 30));
  Config c = load("memory:\n  host_budget: 2GiB\n", {"memory.host_budget=auto"});
  EXPECT_EQ(c.memory.host_budget, std::optional<std::uint64_t>(kAutoBytes));
  const std::string y = c.to_yaml();
  EXPECT_NE(y.find("host_budget: auto"), std::string::npos) << y;
  EXPECT_EQ(load(y).memory.host_budget, std::optional<std::uint64_t>(kAutoBytes));
  expect_error([] { load("memory:\n  host_budget: lots\n"); }, {"memory.host_budget", "byte size", "or auto"});
  expect_error([] { load("memory:\n  device_budget: auto\n"); }, {"memory.device_budget", "byte size"});
  EXPECT_STREQ(to_string(find_knob("memory.host_budget")->type), "bytes, auto or null");
}

TEST(Config, FileErrorsNameThePathAndPosition) {
  stp::testing::ScratchDir dir;
  expect_error([&] { load_config(dir.file("nope.yaml")); }, {"nope.yaml", "not found"});
  std::string bad = dir.file("bad.yaml");
  stp::testing::write_bytes(bad, "model:\n  n_layer: [1, 2\n");
  expect_error([&] { load_config(bad); }, {"bad.yaml:", "YAML error"});
  std::string good = dir.file("good.yaml");
  stp::testing::write_bytes(good, "train:\n  steps: 3\n");
  EXPECT_EQ(load_config(good, {"train.micro_batch_size=2"}).train.steps, 3);
  expect_error([&] { load_config(good, {"train.stepz=2"}); }, {"train.stepz"});
}

TEST(Config, FingerprintFollowsModelShapeOnly) {
  Config a = load("");
  EXPECT_EQ(config_fingerprint(a).size(), 16u);
  EXPECT_EQ(config_fingerprint(a), config_fingerprint(load("", {"train.steps=3", "model.init_from=x.safetensors"})));
  EXPECT_NE(config_fingerprint(a), config_fingerprint(load("", {"model.n_layer=5"})));
}

// An empty value is what an unset shell variable gives (`--set train.resume=$CKPT`): refused with
// the key named, never read as "none" (which would silently start fresh from random weights).
TEST(Config, EmptyValuesAreRefusedNotReadAsNull) {
  expect_error([] { load("", {"train.resume="}); },
               {"train.resume is empty", "--set train.resume=", "remove the --set", "train.resume=null"});
  expect_error([] { load("", {"data.val_path="}); }, {"data.val_path is empty"});
  expect_error([] { load("", {"train.steps="}); }, {"train.steps is empty", "--set train.steps="});
  expect_error([] { load("train:\n  resume: \"\"\n"); }, {"train.resume is empty", "test.yaml:2", "null"});
  // null (or ~) is the explicit way to say none, in the file and in --set.
  EXPECT_EQ(load("train:\n  resume: x\n", {"train.resume=null"}).train.resume, "");
  EXPECT_EQ(load("train:\n  resume: ~\n").train.resume, "");
  EXPECT_EQ(load("train:\n  resume:\n").train.resume, "");
}

// A loss mask of held-out data needs the held-out data; the masks are read as paths (null = none).
TEST(Config, LossMaskKeys) {
  expect_error([] { load("", {"data.val_mask_path=v.mask"}); },
               {"data.val_mask_path ('v.mask')", "data.val_path, which is null"});
  const Config c = load("", {"data.mask_path=t.mask", "data.val_path=v.bin", "data.val_mask_path=v.mask"});
  EXPECT_EQ(c.data.mask_path, "t.mask");
  EXPECT_EQ(c.data.val_mask_path, "v.mask");
  EXPECT_EQ(load("").data.mask_path, "");
}

// A config file is one YAML document: a second one (after `---`) would be ignored, so it is refused.
TEST(Config, ASecondYamlDocumentIsRefused) {
  expect_error([] { load("train:\n  steps: 3\n---\ntrain:\n  steps: 5\n"); },
               {"test.yaml:4", "second YAML document", "one document"});
  expect_error([] { load("---\ntrain: {steps: 3}\n---\noptim: {beta1: 0.8}\n"); }, {"second YAML document"});
  // A leading `---`, or a trailing one with nothing after it, holds no second document.
  EXPECT_EQ(load("---\ntrain:\n  steps: 3\n").train.steps, 3);
  EXPECT_EQ(load("train:\n  steps: 3\n---\n# nothing\n").train.steps, 3);
}

// A list or a map where a section or key name belongs is named with its position, in stp's words.
TEST(Config, ListOrMapKeysAreNamedWithTheirPosition) {
  expect_error([] { load("[train]: {steps: 3}\n"); }, {"test.yaml:1:1", "a key must be a plain name, not a list"});
  expect_error([] { load("train:\n  {steps: 1}: 3\n"); }, {"test.yaml:2:3", "a key must be a plain name, not a map"});
}
