#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/trace_names.h"
#include "core/cpu/cpu_device.h"
#include "core/tensor.h"
#include "formats/checkpoint.h"
#include "formats/tensor_values.h"
#include "models/registry.h"
#include "train/hf_convert.h"
#include "train/stage_layout.h"

namespace fs = std::filesystem;

namespace stp {

namespace {

Config stored_config(const std::string& dir, const CheckpointState& state) {
  // "RUN/checkpoint-3/" as a shell completes it: its parent is RUN, not the folder itself.
  fs::path folder(dir);
  while (!folder.has_filename() && folder.has_relative_path()) folder = folder.parent_path();
  fs::path own = folder / "config.yaml";
  fs::path run = folder.parent_path() / "config.yaml";
  std::error_code ec;
  fs::path path = fs::is_regular_file(own, ec) ? own : run;
  STP_CHECK(fs::is_regular_file(path, ec), "checkpoint '", dir, "': no config.yaml in it or in its run folder (",
            run.string(), "); the model's shape comes from the run's config");
  Config cfg = load_config(path.string());
  std::string fp = config_fingerprint(cfg);
  STP_CHECK(state.config_fingerprint.empty() || state.config_fingerprint == fp, "checkpoint '", dir,
            "': ", path.string(), " describes another model (fingerprint ", fp, ", the checkpoint's ",
            state.config_fingerprint, ")");
  return cfg;
}

}  // namespace

struct Generator::Impl {
  std::string dir;  // the checkpoint, for messages
  Config config;
  std::unique_ptr<CpuDevice> device;  // before the stage, which frees into it
  std::unique_ptr<Stream> compute;
  std::unique_ptr<DeviceAllocator> alloc;
  std::unique_ptr<Stage> stage;
  // Work still queued on the stream (sample() leaving by an error right after it enqueued a
  // zeroing of the records) must finish before the stage frees what it writes into.
  ~Impl() {
    if (!compute) return;
    try {
      compute->synchronize();
    } catch (...) {  // a destructor cannot throw; the caller sees the error that ended sample()
    }
  }
};

Generator::Generator(const std::string& dir) : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  STP_CHECK(fs::is_directory(dir, ec), "checkpoint '", dir, "' is not a folder (give output.dir/checkpoint-STEP)");
  Checkpoint ck = read_checkpoint(dir);
  Impl& m = *impl_;
  m.dir = dir;
  m.config = stored_config(dir, ck.state);
  Config one = m.config;  // one device, one sequence, f32
  one.parallel.tp = one.parallel.pp = one.parallel.dp = 1;
  one.parallel.schedule = "gpipe";
  one.train.micro_batch_size = 1;
  one.train.microbatches = 1;
  one.train.precision = "f32";
  ModelSpec model = model_spec_of(one);
  StageSpec spec;
  spec.layer_begin = 0;
  spec.layer_end = model.n_layer;
  spec.micro_batch_size = 1;
  validate_model(model, spec);
  m.device = std::make_unique<CpuDevice>(0, CpuDeviceOptions{});
  m.compute = m.device->create_stream(trace::stream::kCompute);
  m.alloc = std::make_unique<DeviceAllocator>(*m.device);
  std::unique_ptr<Stage> stage = make_stage(model, spec, *m.alloc);
  ck.model = from_hf(hf_tensor_rules(model), ck.model, dir + "/model.safetensors");
  for (ParamInfo& p : stage->params()) {
    auto it = ck.model.find(p.name);
    STP_CHECK(it != ck.model.end(), "checkpoint '", dir, "': tensor '", p.name, "' is missing");
    STP_CHECK(it->second.shape == p.full_shape, "checkpoint '", dir, "': tensor '", p.name, "' has shape ",
              to_string(it->second.shape), ", the model needs ", to_string(p.full_shape));
    stage->load_full(p.name, it->second.data, *m.compute);
  }
  stage->zero_grads(*m.compute);  // also makes the GEMM copies of the weights
  m.compute->synchronize();
  m.stage = std::move(stage);
}

Generator::~Generator() = default;

const Config& Generator::config() const { return impl_->config; }

std::int32_t sample_token(const std::vector<float>& logits, double temperature, int top_k, std::uint64_t draw) {
  const int V = static_cast<int>(logits.size());
  std::vector<int> ids(static_cast<std::size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  if (temperature == 0)
    return *std::max_element(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] < logits[b]; });
  if (top_k > 0 && top_k < V) {
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    ids.resize(static_cast<std::size_t>(top_k));
    std::sort(ids.begin(), ids.end());
  }
  double top = -INFINITY;
  for (int i : ids) top = std::max(top, static_cast<double>(logits[i]));
  std::vector<double> p;
  double total = 0;
  for (int i : ids) {
    p.push_back(std::exp((logits[i] - top) / temperature));
    total += p.back();
  }
  const double u = static_cast<double>(draw >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (std::size_t k = 0; k < ids.size(); ++k) {
    acc += p[k];
    if (acc > u) return ids[k];
  }
  return ids.back();
}

std::vector<std::int32_t> Generator::sample(const std::vector<std::int32_t>& prompt, const SampleOptions& o,
                                            const std::function<void(std::int32_t)>& on_token) {
  Impl& m = *impl_;
  const int T = m.config.model.seq_len, V = m.config.model.vocab_size;
  STP_CHECK(!prompt.empty(), "the prompt is empty (give at least one token)");
  STP_CHECK(static_cast<int>(prompt.size()) <= T, "the prompt is ", prompt.size(),
            " tokens, longer than the model's context of model.seq_len = ", T, " tokens; shorten it");
  for (std::int32_t t : prompt)
    STP_CHECK(t >= 0 && t < V, "prompt token ", t, " is outside the model's vocabulary (model.vocab_size = ", V, ")");
  STP_CHECK(o.tokens >= 1, "--tokens must be at least 1, got ", o.tokens);
  STP_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), "--temperature must be >= 0, got ", o.temperature);
  STP_CHECK(o.top_k >= 0, "--top-k must be >= 0 (0 = every token), got ", o.top_k);

  Stage& st = *m.stage;
  const int U = st.num_units();
  std::mt19937_64 rng(o.seed);
  std::vector<std::int32_t> context = prompt, out;
  std::vector<std::int32_t> window(static_cast<std::size_t>(T));
  for (int n = 0; n < o.tokens; ++n) {
    const std::size_t len = std::min<std::size_t>(context.size(), static_cast<std::size_t>(T));
    std::fill(window.begin(), window.end(), 0);
    std::copy(context.end() - static_cast<std::ptrdiff_t>(len), context.end(), window.begin());
    m.compute->copy(st.tokens(1).raw(), window.data(), window.size() * 4);
    m.compute->copy(st.targets(1).raw(), window.data(), window.size() * 4);  // the loss is not used
    for (int u = 0; u < U; ++u) st.forward(u, 1, *m.compute);
    RecordSet* rec = st.record_set(U - 1, 1);
    STP_ASSERT(rec && rec->has("logits"), "the last unit kept no logits record");
    std::vector<float> all = download(rec->get("logits"), *m.compute);  // (1, T, V), synchronizes
    std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>((len - 1) * V),
                           all.begin() + static_cast<std::ptrdiff_t>(len * V));
    st.zero_grads(*m.compute);  // drops the records and the microbatch
    // Finite weights can still overflow in the forward; a token drawn from NaNs would be noise.
    const std::string problem = value_problem(row, ValueRule::Finite);
    STP_CHECK(problem.empty(), "checkpoint '", m.dir, "': the logits for new token ", n + 1,
              " are not finite: their row over the vocabulary ", problem,
              ". The model's forward overflows float32 with these parameters, so it cannot be sampled; use an "
              "earlier checkpoint");
    std::int32_t next = sample_token(row, o.temperature, o.top_k, rng());
    context.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  m.compute->synchronize();
  return out;
}

}  // namespace stp
