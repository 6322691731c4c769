// StageBase: the Stage machinery (models/stage.h) every architecture shares, so an architecture
// only supplies its units' math and its parameter store.
//
// Units, in forward order (U = 1 + 2 * layers + (last ? 1 : 0)):
//   u = 0            "embed" on the first stage (tokens -> x0), "input" on the others (x0 is
//                    input_activation; F does nothing). Its B finalizes unit 1's norm and
//                    produces the embedding's output gradient (first stage, kept for W as record
//                    "dx") or grad_input (other stages).
//   u = 1 + 2k       "h.{i}.attn" for layer i = layer_begin + k
//   u = 2 + 2k       "h.{i}.mlp"
//   u = U - 1        "head" on the last stage (final norm, LM head, loss)
// Attn and mlp units are *branches*: x -> x + branch(norm(x)), cut at their TP all-reduce. When
// tp > 1, F of a branch returns this rank's partial of the next residual stream and B returns this
// rank's partial gradient w.r.t. the branch's norm output; the norm's backward runs after that
// all-reduce, at the start of the previous unit's B (finalize_norm; models/gpt2_units.h, Notes
// [Residual folded into rank 0's partial] and [LayerNorm after the all-reduce]). Input units return
// nothing; embed and head units return nothing when the vocabulary is replicated. Vocab-parallel
// (StageSpec::vocab_sharded, docs/model.md, Vocab parallelism), F of the embed unit returns this
// rank's partial of x0 and B of the head returns this rank's partial of the gradient w.r.t. its
// input (the head keeps its small all-reduces inside the unit, over StageSpec::vocab_comm: F's two
// statistics and B's final norm weight gradients).
//
// What the base keeps: the per-microbatch state (I/O buffers, the residual stream between F
// units, the gradient between B units, the F/B order checks), the record set of every (unit, mb)
// (dropping empty ones), forward-only mode, the recompute policy per unit (F drops the policy's
// records, B regenerates them first), zero_grads / release_microbatch, and the ParamStore.
// What an architecture implements: the hooks below, each called with the unit's own record set
// and the call's scope; none of them touches the microbatch state. BranchedStage
// (models/branched_stage.h) implements the branch hooks from tables of unit functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/model_spec.h"
#include "models/param_store.h"
#include "models/unit_common.h"
#include "models/stage.h"

namespace stp {

class StageBase : public Stage {
 public:
  int num_units() const override { return static_cast<int>(units_.size()); }
  std::string unit_name(int u) const override;
  UnitKind unit_kind(int u) const override { return unit_at(u).kind; }
  bool is_first() const override { return spec_.layer_begin == 0; }
  bool is_last() const override { return spec_.layer_end == n_layer_; }

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
  void set_loss_chunk_tokens(std::int64_t tokens) override;
  std::int64_t loss_chunk_tokens() const override { return loss_chunk_tokens_; }
  void set_unit_tiles(int tiles) override;
  int unit_tiles() const override { return unit_tiles_; }

  std::vector<ParamInfo>& params() override { return params_.list(); }
  std::vector<ParamInfo*> unit_params(int u) override { return unit_params_.at(static_cast<std::size_t>(u)); }
  std::vector<ParamInfo*> pass_grads(int u, bool weight) override;
  StreamedBytes streamed_bytes() const override { return params_.streamed_bytes(); }
  Tensor flat_params() const override { return params_.flat_params(); }
  Tensor flat_grads() const override { return params_.flat_grads(); }
  Tensor flat_copies() const override { return params_.flat_copies(); }
  void init_random(std::uint64_t seed, Stream& s) override { params_.init_random(seed, s); }
  void load_full(const std::string& name, const std::vector<float>& full, Stream& s) override {
    params_.load_full(name, full, s);
  }
  void zero_grads(Stream& s) override;
  void zero_grads_keep_copies(Stream& s) override;
  void refresh_compute(Stream& s, bool host_masters) override { params_.refresh_compute(s, host_masters); }
  void release_microbatch(int mb, Stream& s) override;

  ParamStore& param_store() { return params_; }

 protected:
  // n_layer: the model's layers; dims: the sizes (the I/O activations are (B, T, C)); params: the
  // stage's parameters (the hooks may keep pointers into params_.list(): the store is not resized
  // after construction).
  StageBase(const StageSpec& spec, int n_layer, const UnitDims& dims, ParamStore params, Allocator& alloc);

  static bool is_branch(UnitKind k) { return k == UnitKind::Attn || k == UnitKind::Mlp; }
  int unit_layer(int u) const { return unit_at(u).layer; }  // attn / mlp: the model's layer index

  // ---- the architecture's units -------------------------------------------------------------------
  // Embed: x0 from the (B, T) tokens; its W from the records F saved plus "dx" (the gradient w.r.t.
  // x0, saved by B).
  virtual Tensor embed_forward(const Tensor& tokens, RecordSet& rec, CallScope& cs) = 0;
  virtual void embed_backward_weight(RecordSet& rec, CallScope& cs) = 0;
  // Branch u (attn or mlp): F returns x + branch(norm(x)) (this rank's partial when tp > 1); B
  // returns the gradient w.r.t. the norm output (partial when tp > 1) for the gradient dy w.r.t. the
  // unit's output; finalize_norm(u, ...) turns the all-reduced one into the gradient w.r.t. the
  // unit's input (dy is the residual part), reading unit u's records.
  virtual Tensor branch_forward(int u, const Tensor& x, RecordSet& rec, CallScope& cs) = 0;
  virtual Tensor branch_backward_input(int u, const Tensor& dy, RecordSet& rec, CallScope& cs) = 0;
  virtual void branch_backward_weight(int u, RecordSet& rec, CallScope& cs) = 0;
  virtual Tensor finalize_norm(int u, const Tensor& dy, const Tensor& dnorm, RecordSet& rec, CallScope& cs) = 0;
  // Recompute of branch u: the records policy r drops (empty for None), its share of F's FLOPs, and
  // the regeneration of the dropped records at the start of B.
  virtual std::vector<RecomputedRecord> branch_recomputed_records(int u, Recompute r) const = 0;
  virtual double branch_recompute_cost(int u, Recompute r) const = 0;
  virtual void branch_recompute(int u, Recompute r, RecordSet& rec, CallScope& cs) = 0;
  // B of branch u under Recompute::Full tiled over `tiles` groups of sequences (Stage::set_unit_tiles):
  // per group the recompute, B and W of the group's rows; returns what branch_backward_input returns
  // (the whole (B, T, C) gradient) and leaves in rec what B(u-1) reads, as B then W untiled would.
  virtual Tensor branch_backward_tiled(int u, const Tensor& dy, int tiles, RecordSet& rec, CallScope& cs) = 0;
  // Head: final norm, LM head and the mean token cross-entropy into `loss`; B returns the gradient
  // w.r.t. the head's input for the seed loss_scale (vocab-parallel: this rank's partial, whole once
  // all-reduced; models/unit_common.h, head_norm_grad_partials).
  // c: chunked or not, and with gradients or not (models/unit_common.h, LossChunking).
  virtual void head_forward(const Tensor& x, const Tensor& targets, const Tensor& loss, const LossChunking& c,
                            RecordSet& rec, CallScope& cs) = 0;
  virtual Tensor head_backward_input(float loss_scale, RecordSet& rec, CallScope& cs) = 0;
  virtual void head_backward_weight(RecordSet& rec, CallScope& cs) = 0;

  // The architecture's constructor names each unit's parameters (Stage::unit_params) and, among
  // them, those whose gradients a B writes (Stage::pass_grads): `norm`, a branch's norm, which B(u-1)
  // finalizes; `backward`, those B(u) writes itself (a GPT-2 branch's c_proj bias, the head's final
  // norm). W(u) writes the others.
  void set_unit_params(int u, std::vector<ParamInfo*> params, std::vector<ParamInfo*> norm = {},
                       std::vector<ParamInfo*> backward = {}) {
    const auto i = static_cast<std::size_t>(u);
    unit_params_.at(i) = std::move(params);
    unit_norm_.at(i) = std::move(norm);
    unit_backward_.at(i) = std::move(backward);
  }

  Allocator& alloc_;
  ParamStore params_;

 private:
  struct Unit {
    UnitKind kind;
    std::string name;  // "embed", "input", "h.3.attn", "h.3.mlp", "head"
    int layer = -1;    // attn / mlp
    Recompute recompute = Recompute::None;
  };
  // Per-microbatch state between calls (besides the records). Tensors are handles, not copies.
  struct Microbatch {
    Tensor tokens, targets, input, output, grad_output, grad_input, loss;
    Tensor fwd_x;        // residual stream entering the next F unit
    Tensor bwd_dy;       // gradient w.r.t. the output of the unit whose B runs next
    Tensor bwd_pending;  // all-reduced norm-output gradient of the last B'd branch (finalized next)
    int next_f = 0;      // next F unit
    int next_b = -1;     // next B unit (-1: backward not started)
  };

  Microbatch& mb_state(int mb);
  RecordSet& records(int u, int mb);
  void drop_empty_records(int u, int mb);
  Tensor io_buffer(Tensor& slot, Shape shape, Stream* writer = nullptr);
  Tensor finalize_next(int u, int mb, Microbatch& m, CallScope& cs);
  const Unit& unit_at(int u) const;
  // The records of unit u that policy r drops (empty for None and for units that are not branches).
  std::vector<RecomputedRecord> recomputed_records(int u, Recompute r) const;
  // Unit u's B runs tiled, with its W in it (Stage::set_unit_tiles).
  bool tiled(int u) const;

  StageSpec spec_;
  int n_layer_;
  std::int64_t B_, T_, C_;
  std::vector<Unit> units_;
  float loss_scale_ = 1.0f;
  bool forward_only_ = false;
  std::int64_t loss_chunk_tokens_ = 0;
  int unit_tiles_ = 1;
  std::map<int, Microbatch> mbs_;
  std::vector<std::map<int, RecordSet>> records_;       // [unit][mb]
  std::vector<std::vector<ParamInfo*>> unit_params_;    // [unit]
  std::vector<std::vector<ParamInfo*>> unit_norm_;      // [unit] written by B(unit - 1)
  std::vector<std::vector<ParamInfo*>> unit_backward_;  // [unit] written by B(unit)
};

}  // namespace stp
