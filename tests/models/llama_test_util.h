// Shared helpers of the Llama model tests: the reference files of tools/gen_llama_reference.py
// (one per variant) and a stage of any architecture replicated over emulated TP ranks, driven
// with the all-reduce protocol of models/stage.h (as gpt2_test_util.h's TpStage does for GPT-2).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm.h"
#include "core/cpu/cpu_device.h"
#include "models/registry.h"
#include "tests/models/gpt2_test_util.h"  // read_reference, RefTensor, scaled_error, host_copy, fill_ids

namespace stp::test {

using RefFile = std::map<std::string, RefTensor>;

// tests/models/data/llama_<variant>_ref without the extension (.bin, .safetensors).
inline std::string llama_reference_path(const std::string& variant) {
  return std::string(STP_SOURCE_DIR) + "/tests/models/data/llama_" + variant + "_ref";
}

inline const RefFile& llama_reference(const std::string& variant) {
  static std::map<std::string, RefFile> cache;
  auto it = cache.find(variant);
  if (it == cache.end()) it = cache.emplace(variant, read_reference(llama_reference_path(variant) + ".bin")).first;
  return it->second;
}

// The model of a reference file (config tensor layout in tools/gen_llama_reference.py).
inline ModelSpec llama_reference_model(const RefFile& ref, AttentionKernel attention = AttentionKernel::Naive) {
  const auto& c = ref.at("config").data;
  ModelSpec m;
  m.arch = "llama";
  m.n_layer = static_cast<int>(c[0]);
  m.n_head = static_cast<int>(c[1]);
  m.n_kv_head = static_cast<int>(c[2]);
  m.n_embd = static_cast<int>(c[3]);
  m.intermediate_size = static_cast<int>(c[4]);
  m.vocab_size = static_cast<int>(c[5]);
  m.seq_len = static_cast<int>(c[6]);
  m.rope_theta = c[9];
  m.norm_eps = c[10];
  m.qkv_bias = c[11] != 0;
  m.tie_embeddings = c[12] != 0;
  m.attention = attention;
  return m;
}
inline int llama_reference_batch(const RefFile& ref) { return static_cast<int>(ref.at("config").data[7]); }

// One stage (any architecture) on `tp` emulated devices, driven from the test thread.
class TpGroup {
 public:
  TpGroup(const ModelSpec& model, StageSpec spec, int tp) {
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
      stages_.push_back(make_stage(model, spec, *allocs_.back()));
    }
  }
  ~TpGroup() {
    for (auto& s : compute_) s->synchronize();
    for (auto& s : comm_) s->synchronize();
  }

  int tp() const { return static_cast<int>(stages_.size()); }
  Stage& stage(int r = 0) { return *stages_[static_cast<std::size_t>(r)]; }
  Stream& compute(int r = 0) { return *compute_[static_cast<std::size_t>(r)]; }
  int num_units() { return stage().num_units(); }

  void load(const RefFile& ref) {
    for (int r = 0; r < tp(); ++r)
      for (ParamInfo& p : stage(r).params()) stage(r).load_full(p.name, ref.at("param." + p.name).data, compute(r));
  }
  void zero_grads() {
    for (int r = 0; r < tp(); ++r) stage(r).zero_grads(compute(r));
  }
  void feed(const RefFile& ref, int mb) {
    for (int r = 0; r < tp(); ++r) {
      if (stage(r).is_first()) fill_ids(stage(r).tokens(mb), ref.at("tokens").data);
      if (stage(r).is_last()) fill_ids(stage(r).targets(mb), ref.at("targets").data);
    }
  }
  void forward(int u, int mb) { pass(u, mb, 'F'); }
  void backward_input(int u, int mb) { pass(u, mb, 'B'); }
  void backward_weight(int u, int mb) {
    for (int r = 0; r < tp(); ++r) stage(r).backward_weight(u, mb, compute(r));
  }
  void sync() {
    for (int r = 0; r < tp(); ++r) {
      compute(r).synchronize();
      comm_[static_cast<std::size_t>(r)]->synchronize();
    }
  }
  std::vector<float> full_grad(const std::string& name) {
    sync();
    std::vector<float> full;
    for (int r = 0; r < tp(); ++r)
      for (ParamInfo& p : stage(r).params()) {
        if (p.name != name) continue;
        if (full.empty()) full.assign(static_cast<std::size_t>(numel(p.full_shape)), 0.0f);
        std::vector<float> shard = host_copy(p.grad, compute(r));
        p.layout.gather(shard.data(), full.data());
      }
    return full;
  }

 private:
  Event& reduced(int r, int mb, char pass) {
    auto& e = reduced_[{r, mb, pass}];
    if (!e) e = devices_[static_cast<std::size_t>(r)]->create_event();
    return *e;
  }
  void pass(int u, int mb, char which) {
    std::vector<Tensor> t;
    for (int r = 0; r < tp(); ++r) {
      compute(r).wait(reduced(r, mb, which));
      t.push_back(which == 'F' ? stage(r).forward(u, mb, compute(r)) : stage(r).backward_input(u, mb, compute(r)));
    }
    if (!t[0].defined()) return;
    for (int r = 0; r < tp(); ++r) {
      std::size_t i = static_cast<std::size_t>(r);
      compute_[i]->record(*produced_[i]);
      comm_[i]->wait(*produced_[i]);
      comms_[i]->all_reduce_sum(*comm_[i], t[i].f32(), static_cast<std::size_t>(t[i].numel()));
      comm_[i]->record(reduced(r, mb, which));
    }
  }

  std::vector<std::unique_ptr<CpuDevice>> devices_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<DeviceAllocator>> allocs_;
  std::vector<std::unique_ptr<Stream>> compute_, comm_;
  std::vector<std::unique_ptr<Event>> produced_;
  std::map<std::tuple<int, int, char>, std::unique_ptr<Event>> reduced_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

}  // namespace stp::test
