// Shared helpers of the model tests, for every architecture: the reference-file reader (format in
// tools/reference/gen_gpt2_reference.py and tools/reference/gen_llama_reference.py), comparison helpers, and a stage
// replicated over emulated TP ranks, driven with the all-reduce protocol of models/stage.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "models/stage.h"

namespace stp::testing {

struct RefTensor {
  Shape shape;
  std::vector<float> data;
};

inline std::map<std::string, RefTensor> read_reference(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STP_CHECK(f.good(), "cannot open reference file ", path, " (regenerate it with its generator in tools/)");
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

using RefFile = std::map<std::string, RefTensor>;

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

// The columns [v0, v0 + n) of the (rows, V) matrix `full`, as a (rows, n) matrix (the logits a
// vocab-parallel rank holds of its real vocabulary rows).
inline std::vector<float> columns(const std::vector<float>& full, std::int64_t V, std::int64_t v0, std::int64_t n) {
  const std::int64_t rows = static_cast<std::int64_t>(full.size()) / V;
  std::vector<float> out;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < n; ++j) out.push_back(full[static_cast<std::size_t>(i * V + v0 + j)]);
  return out;
}

// The logits a rank holds (rows, Vs) compared with the reference's (rows, V): the whole row when
// replicated (Vs == V), else this rank's columns (its real vocabulary rows; the padding columns
// must be exactly 0: the padding rows of the head are zero).
inline double logits_error(const std::vector<float>& ours, const std::vector<float>& ref, std::int64_t V,
                           std::int64_t Vs, int tp_rank) {
  if (Vs == V) return scaled_error(ours, ref);
  const std::int64_t v0 = tp_rank * Vs, real = std::max<std::int64_t>(0, std::min(Vs, V - v0));
  for (float x : columns(ours, Vs, real, Vs - real)) EXPECT_EQ(x, 0.0f) << "a padding column's logit";
  return scaled_error(columns(ours, Vs, 0, real), columns(ref, V, v0, real));
}

// One pipeline stage on `tp` emulated devices, driven from the test thread. The all-reduce of a
// returned tensor runs on each rank's "tp-comm" stream: record after the producing unit on
// compute, comm waits, all_reduce_sum, record on comm; compute waits before the next unit of the
// same pass (here: right away, since the tests run one pass at a time per microbatch).
// S: the stage class the tests see (Stage, or an architecture's, for its dims() and param_store()).
template <typename S>
class TpStages {
 public:
  using Factory = std::function<std::unique_ptr<S>(const StageSpec& spec, Allocator& alloc)>;

  TpStages(StageSpec spec, int tp, const Factory& make) {
    devices_ = make_cpu_devices(tp);
    comms_ = make_host_comms(tp);
    vocab_comms_ = make_host_comms(tp);  // used when spec.vocab_parallel (models/model_spec.h)
    for (int r = 0; r < tp; ++r) {
      Device& d = *devices_[static_cast<std::size_t>(r)];
      allocs_.push_back(std::make_unique<DeviceAllocator>(d));
      compute_.push_back(d.create_stream("compute"));
      comm_.push_back(d.create_stream("tp-comm"));
      produced_.push_back(d.create_event());
      spec.tp_rank = r;
      spec.tp_size = tp;
      spec.vocab_comm = vocab_comms_[static_cast<std::size_t>(r)].get();
      stages_.push_back(make(spec, *allocs_.back()));
    }
  }
  ~TpStages() {
    for (auto& s : compute_) s->synchronize();
    for (auto& s : comm_) s->synchronize();
  }

  int tp() const { return static_cast<int>(stages_.size()); }
  S& stage(int r = 0) { return *stages_[static_cast<std::size_t>(r)]; }
  Stream& compute(int r = 0) { return *compute_[static_cast<std::size_t>(r)]; }
  int num_units() { return stage().num_units(); }

  // Every rank's shard of every parameter from a reference file ("param.<name>", full tensors).
  void load(const RefFile& ref) {
    for (int r = 0; r < tp(); ++r)
      for (ParamInfo& p : stage(r).params()) stage(r).load_full(p.name, ref.at("param." + p.name).data, compute(r));
  }
  // The microbatch inputs: the reference's whole "tokens" / "targets" batch.
  void feed(const RefFile& ref, int mb) {
    for (int r = 0; r < tp(); ++r) {
      if (stage(r).is_first()) fill_ids(stage(r).tokens(mb), ref.at("tokens").data);
      if (stage(r).is_last()) fill_ids(stage(r).targets(mb), ref.at("targets").data);
    }
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
  std::vector<std::unique_ptr<Communicator>> comms_, vocab_comms_;
  std::vector<std::unique_ptr<DeviceAllocator>> allocs_;
  std::vector<std::unique_ptr<Stream>> compute_, comm_;
  std::vector<std::unique_ptr<Event>> produced_;
  std::map<std::tuple<int, int, char>, std::unique_ptr<Event>> reduced_;
  std::vector<std::unique_ptr<S>> stages_;
};

}  // namespace stp::testing
