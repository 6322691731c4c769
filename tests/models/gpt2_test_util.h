// Shared helpers of the GPT-2 model tests: the reference-file reader (format in
// tools/gen_gpt2_reference.py), a pipeline stage replicated over emulated TP ranks with the
// all-reduce protocol of models/stage.h, and comparison helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "models/gpt2_stage.h"

namespace stp::test {

struct RefTensor {
  Shape shape;
  std::vector<float> data;
};

inline std::map<std::string, RefTensor> read_reference(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STP_CHECK(f.good(), "cannot open reference file ", path, " (regenerate with tools/gen_gpt2_reference.py)");
  char magic[8];
  f.read(magic, 8);
  STP_CHECK(f.good() && std::memcmp(magic, "STPREF01", 8) == 0, path, ": not an STPREF01 file");
  auto u32 = [&] {
    std::uint32_t v = 0;
    f.read(reinterpret_cast<char*>(&v), 4);
    return v;
  };
  std::map<std::string, RefTensor> out;
  std::uint32_t count = u32();
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string name(u32(), '\0');
    f.read(name.data(), static_cast<std::streamsize>(name.size()));
    RefTensor t;
    t.shape.resize(u32());
    f.read(reinterpret_cast<char*>(t.shape.data()), static_cast<std::streamsize>(8 * t.shape.size()));
    t.data.resize(static_cast<std::size_t>(numel(t.shape)));
    f.read(reinterpret_cast<char*>(t.data.data()), static_cast<std::streamsize>(4 * t.data.size()));
    STP_CHECK(f.good(), path, ": truncated at tensor ", name);
    out[name] = std::move(t);
  }
  return out;
}

inline const std::map<std::string, RefTensor>& reference() {
  static const auto ref = read_reference(std::string(STP_SOURCE_DIR) + "/tests/models/data/gpt2_tiny_ref.bin");
  return ref;
}

inline GPT2Config reference_config() {
  const auto& c = reference().at("config").data;
  GPT2Config cfg;
  cfg.n_layer = static_cast<int>(c[0]);
  cfg.n_head = static_cast<int>(c[1]);
  cfg.n_embd = static_cast<int>(c[2]);
  cfg.vocab_size = static_cast<int>(c[3]);
  cfg.seq_len = static_cast<int>(c[4]);
  return cfg;
}
inline int reference_batch() { return static_cast<int>(reference().at("config").data[5]); }

// max_i |a_i - b_i| / max_i |b_i|: the error relative to the tensor's scale. (Per-element
// relative error is meaningless for entries that are zero up to rounding.)
inline double scaled_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

inline std::vector<float> host_copy(const Tensor& t, Stream& s) {
  s.synchronize();
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  std::memcpy(v.data(), t.raw(), t.bytes());  // CPU device memory is host memory
  return v;
}

inline void fill_ids(const Tensor& t, const std::vector<float>& ids) {
  auto* p = t.data<std::int32_t>();
  for (std::size_t i = 0; i < ids.size(); ++i) p[i] = static_cast<std::int32_t>(ids[i]);
}

// One pipeline stage on `tp` emulated devices, driven from the test thread. The all-reduce of a
// returned tensor runs on each rank's "tp-comm" stream: record after the producing unit on
// compute, comm waits, all_reduce_sum, record on comm; compute waits before the next unit of the
// same pass (here: right away, since the tests run one pass at a time per microbatch).
class TpStage {
 public:
  TpStage(const GPT2Config& cfg, GPT2StageSpec spec, int tp) {
    devices_ = make_cpu_devices(tp);
    comms_ = make_host_comms(tp);
    for (int r = 0; r < tp; ++r) {
      Device& d = *devices_[static_cast<std::size_t>(r)];
      allocs_.push_back(std::make_unique<DeviceAllocator>(d));
      compute_.push_back(d.create_stream("compute"));
      comm_.push_back(d.create_stream("tp-comm"));
      produced_.push_back(d.create_event());
      spec.tp_rank = r;
      spec.tp_size = tp;
      stages_.push_back(std::make_unique<GPT2Stage>(cfg, spec, *allocs_.back()));
    }
  }
  ~TpStage() {
    for (auto& s : compute_) s->synchronize();
    for (auto& s : comm_) s->synchronize();
  }

  int tp() const { return static_cast<int>(stages_.size()); }
  GPT2Stage& stage(int r = 0) { return *stages_[static_cast<std::size_t>(r)]; }
  Stream& compute(int r = 0) { return *compute_[static_cast<std::size_t>(r)]; }
  int num_units() { return stage().num_units(); }

  void load_reference_params() {
    for (auto& st : stages_)
      for (ParamInfo& p : st->params())
        st->param_store().load_full(p.name, reference().at("param." + p.name).data, compute());
  }
  void zero_grads() {
    for (int r = 0; r < tp(); ++r) stage(r).zero_grads(compute(r));
  }
  void set_loss_scale(float s) {
    for (auto& st : stages_) st->set_loss_scale(s);
  }
  void forward(int u, int mb) {
    std::vector<Tensor> t;
    for (int r = 0; r < tp(); ++r) {
      compute(r).wait(reduced(r, mb, 'F'));
      t.push_back(stage(r).forward(u, mb, compute(r)));
    }
    reduce(t, mb, 'F');
  }
  void backward_input(int u, int mb) {
    std::vector<Tensor> t;
    for (int r = 0; r < tp(); ++r) {
      compute(r).wait(reduced(r, mb, 'B'));
      t.push_back(stage(r).backward_input(u, mb, compute(r)));
    }
    reduce(t, mb, 'B');
  }
  void backward_weight(int u, int mb) {
    for (int r = 0; r < tp(); ++r) stage(r).backward_weight(u, mb, compute(r));
  }
  void sync() {
    for (int r = 0; r < tp(); ++r) {
      compute(r).synchronize();
      comm_[static_cast<std::size_t>(r)]->synchronize();
    }
  }
  // The full (unsharded) gradient of `name`, gathered over the TP ranks.
  std::vector<float> full_grad(const std::string& name) {
    sync();
    std::vector<float> full;
    for (int r = 0; r < tp(); ++r) {
      for (ParamInfo& p : stage(r).params()) {
        if (p.name != name) continue;
        if (full.empty()) full.assign(static_cast<std::size_t>(numel(p.full_shape)), 0.0f);
        std::vector<float> shard = host_copy(p.grad, compute(r));
        p.layout.gather(shard.data(), full.data());
      }
    }
    return full;
  }

 private:
  // The event that marks the last all-reduce of (rank, mb, pass) on the comm stream.
  Event& reduced(int r, int mb, char pass) {
    auto& e = reduced_[{r, mb, pass}];
    if (!e) e = devices_[static_cast<std::size_t>(r)]->create_event();
    return *e;
  }
  void reduce(const std::vector<Tensor>& t, int mb, char pass) {
    if (!t[0].defined()) {
      for (const Tensor& x : t) EXPECT_FALSE(x.defined());
      return;
    }
    for (int r = 0; r < tp(); ++r) {
      std::size_t i = static_cast<std::size_t>(r);
      compute_[i]->record(*produced_[i]);
      comm_[i]->wait(*produced_[i]);
      comms_[i]->all_reduce_sum(*comm_[i], t[i].f32(), static_cast<std::size_t>(t[i].numel()));
      comm_[i]->record(reduced(r, mb, pass));
    }
  }

  std::vector<std::unique_ptr<CpuDevice>> devices_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<DeviceAllocator>> allocs_;
  std::vector<std::unique_ptr<Stream>> compute_, comm_;
  std::vector<std::unique_ptr<Event>> produced_;
  std::map<std::tuple<int, int, char>, std::unique_ptr<Event>> reduced_;
  std::vector<std::unique_ptr<GPT2Stage>> stages_;
};

// Fills the microbatch inputs of the reference batch (rows [row0, row0 + B) of it).
inline void feed_reference_batch(TpStage& ts, int mb, int row0 = 0) {
  const auto& ref = reference();
  const int T = reference_config().seq_len;
  for (int r = 0; r < ts.tp(); ++r) {
    GPT2Stage& st = ts.stage(r);
    std::size_t n = static_cast<std::size_t>(st.dims().N());
    std::size_t off = static_cast<std::size_t>(row0 * T);
    if (st.is_first())
      fill_ids(st.tokens(mb),
               std::vector<float>(ref.at("tokens").data.begin() + off, ref.at("tokens").data.begin() + off + n));
    if (st.is_last())
      fill_ids(st.targets(mb),
               std::vector<float>(ref.at("targets").data.begin() + off, ref.at("targets").data.begin() + off + n));
  }
}

// F of all units, then B and W fused (B(u), W(u), B(u-1), ...).
inline void run_fused(TpStage& ts, int mb) {
  for (int u = 0; u < ts.num_units(); ++u) ts.forward(u, mb);
  for (int u = ts.num_units() - 1; u >= 0; --u) {
    ts.backward_input(u, mb);
    ts.backward_weight(u, mb);
  }
}

}  // namespace stp::test
