// BranchedStage<Dims, Branch>: a StageBase (models/stage_base.h) whose attention and MLP units are
// given as two tables of unit functions (BranchOps) over the architecture's sizes (Dims, extending
// UnitDims) and the parameters of one branch (Branch), one per attn / mlp unit. An architecture
// then writes only its embedding, the norm finalize and the head as overrides.
#pragma once

#include <vector>

#include "models/stage_base.h"
#include "models/unit_common.h"

namespace stp {

// The passes of one kind of branch (models/stage_base.h, the branch hooks, say what each returns).
template <class Dims, class Branch>
struct BranchOps {
  Tensor (*forward)(const Dims&, const Branch&, const Tensor& x, RecordSet&, CallScope&);
  Tensor (*backward_input)(const Dims&, const Branch&, const Tensor& dy, RecordSet&, CallScope&);
  void (*backward_weight)(const Dims&, const Branch&, RecordSet&, CallScope&);
  void (*recompute)(const Dims&, const Branch&, Recompute, RecordSet&, CallScope&);
  std::vector<RecomputedRecord> (*recomputed_records)(const Dims&, Recompute);
  double (*recompute_cost)(const Dims&, Recompute);
};

template <class Dims, class Branch>
class BranchedStage : public StageBase {
 public:
  const Dims& dims() const { return dims_; }

 protected:
  using Ops = BranchOps<Dims, Branch>;

  // dims: the shared part of dims_ (unit_dims); the subclass's constructor fills the rest and
  // branch(u) of every attn / mlp unit.
  BranchedStage(const StageSpec& spec, int n_layer, const UnitDims& dims, ParamStore params, Allocator& alloc,
                const Ops& attn, const Ops& mlp)
      : StageBase(spec, n_layer, dims, std::move(params), alloc),
        attn_(attn),
        mlp_(mlp),
        branches_(static_cast<std::size_t>(num_units())) {
    static_cast<UnitDims&>(dims_) = dims;
  }

  Branch& branch(int u) { return branches_[static_cast<std::size_t>(u)]; }
  const Branch& branch(int u) const { return branches_[static_cast<std::size_t>(u)]; }

  Dims dims_;

 private:
  const Ops& ops(int u) const { return unit_kind(u) == UnitKind::Attn ? attn_ : mlp_; }

  Tensor branch_forward(int u, const Tensor& x, RecordSet& rec, CallScope& cs) final {
    return ops(u).forward(dims_, branch(u), x, rec, cs);
  }
  Tensor branch_backward_input(int u, const Tensor& dy, RecordSet& rec, CallScope& cs) final {
    return ops(u).backward_input(dims_, branch(u), dy, rec, cs);
  }
  void branch_backward_weight(int u, RecordSet& rec, CallScope& cs) final {
    ops(u).backward_weight(dims_, branch(u), rec, cs);
  }
  void branch_recompute(int u, Recompute r, RecordSet& rec, CallScope& cs) final {
    ops(u).recompute(dims_, branch(u), r, rec, cs);
  }
  std::vector<RecomputedRecord> branch_recomputed_records(int u, Recompute r) const final {
    return ops(u).recomputed_records(dims_, r);
  }
  double branch_recompute_cost(int u, Recompute r) const final { return ops(u).recompute_cost(dims_, r); }

  Ops attn_, mlp_;
  std::vector<Branch> branches_;  // [unit]; attn / mlp units only
};

}  // namespace stp
