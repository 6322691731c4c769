// GPT2Stage: a GPT-2 chunk on one TP rank, implementing the Stage contract (models/stage.h).
//
// Units, in forward order (U = 1 + 2 * layers + (last ? 1 : 0)):
//   u = 0            "embed" on the first stage (tokens -> x0), "input" on the others (x0 is
//                    input_activation; F does nothing). Its B finalizes unit 1's LayerNorm and
//                    produces the embedding's output gradient (first stage, kept for W) or
//                    grad_input (other stages).
//   u = 1 + 2k       "h.{i}.attn" for layer i = layer_begin + k
//   u = 2 + 2k       "h.{i}.mlp"
//   u = U - 1        "head" on the last stage (ln_f, tied LM head, loss)
// F of attn/mlp returns this rank's partial of the next residual stream when tp > 1; B of
// attn/mlp returns this rank's partial gradient w.r.t. the unit's LayerNorm output when tp > 1
// (models/gpt2_units.h, Notes [Residual folded into rank 0's partial] and [LayerNorm after the
// all-reduce]). Embed, input and head units return nothing (they are replicated).
// Recompute (models/stage.h): attn/mlp units drop their policy's records at the end of F and
// regenerate them at the start of B (models/gpt2_units.h lists the records per policy).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/gpt2_config.h"
#include "models/gpt2_params.h"
#include "models/gpt2_units.h"
#include "models/stage.h"

namespace stp {

class GPT2Stage final : public Stage {
 public:
  // alloc: the device allocator for parameters, records and temporaries (must outlive the stage).
  GPT2Stage(const GPT2Config& config, const GPT2StageSpec& spec, Allocator& alloc);

  int num_units() const override { return static_cast<int>(units_.size()); }
  std::string unit_name(int u) const override;
  bool is_first() const override { return spec_.layer_begin == 0; }
  bool is_last() const override { return spec_.layer_end == config_.n_layer; }

  Tensor tokens(int mb) override;
  Tensor targets(int mb) override;
  Tensor input_activation(int mb, Stream* writer = nullptr) override;
  Tensor output_activation(int mb) override;
  Tensor grad_output(int mb, Stream* writer = nullptr) override;
  Tensor grad_input(int mb) override;
  Tensor loss(int mb) override;
  void set_loss_scale(float scale) override { loss_scale_ = scale; }
  float loss_scale() const override { return loss_scale_; }

  Tensor forward(int u, int mb, Stream& s) override;
  Tensor backward_input(int u, int mb, Stream& s) override;
  void backward_weight(int u, int mb, Stream& s) override;

  std::vector<ActivationRecord> activation_records(int u, int mb) const override;
  std::size_t live_record_bytes() const override;
  RecordSet* record_set(int u, int mb) override;

  void set_recompute(int u, Recompute r) override;
  Recompute recompute(int u) const override;
  double recompute_cost(int u, Recompute r) const override;
  std::size_t recompute_saving(int u, Recompute r) const override;

  void set_forward_only(bool on) override;

  std::vector<ParamInfo>& params() override { return params_.list(); }
  Tensor flat_params() const override { return params_.flat_params(); }
  Tensor flat_grads() const override { return params_.flat_grads(); }
  void init_random(std::uint64_t seed, Stream& s) override { params_.init_random(seed, s); }
  void load_full(const std::string& name, const std::vector<float>& full, Stream& s) override {
    params_.load_full(name, full, s);
  }
  void zero_grads(Stream& s) override;
  void release_microbatch(int mb, Stream& s) override;

  GPT2Params& param_store() { return params_; }
  const GPT2Dims& dims() const { return dims_; }

 private:
  enum class Kind { EMBED, INPUT, ATTN, MLP, HEAD };
  struct Unit {
    Kind kind;
    std::string name;                       // "embed", "input", "h.3.attn", "h.3.mlp", "head"
    BranchParams branch;                    // ATTN / MLP
    Recompute recompute = Recompute::None;  // ATTN / MLP only
  };
  // Per-microbatch state between calls (besides the records). Tensors are handles, not copies.
  struct Microbatch {
    Tensor tokens, targets, input, output, grad_output, grad_input, loss;
    Tensor fwd_x;        // residual stream entering the next F unit
    Tensor bwd_dy;       // gradient w.r.t. the output of the unit whose B runs next
    Tensor bwd_pending;  // all-reduced LN-output gradient of the last B'd TP unit (finalized next)
    int next_f = 0;      // next F unit
    int next_b = -1;     // next B unit (-1: backward not started)
  };

  Microbatch& mb_state(int mb);
  RecordSet& records(int u, int mb);
  void drop_empty_records(int u, int mb);
  Tensor io_buffer(Tensor& slot, Shape shape, Stream* writer = nullptr);
  Tensor finalize_next(int u, int mb, Microbatch& m, CallScope& cs);
  const Unit& unit_at(int u) const;
  // The records of unit u that policy r drops (empty for None and for units without a policy).
  std::vector<RecomputedRecord> recomputed_records(int u, Recompute r) const;

  GPT2Config config_;
  GPT2StageSpec spec_;
  Allocator& alloc_;
  GPT2Dims dims_;
  GPT2Params params_;
  std::vector<Unit> units_;
  float loss_scale_ = 1.0f;
  bool forward_only_ = false;
  std::map<int, Microbatch> mbs_;
  std::vector<std::map<int, RecordSet>> records_;  // [unit][mb]
};

}  // namespace stp
