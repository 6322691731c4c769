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
  // Per group g: a record set holding the group's rows of the kept input, the recompute, B and W on
  // the group's sizes (B/tiles sequences), the group's rows of the returned gradient and of the
  // records left for B(u-1) (the norm statistics) copied into whole tensors; the group's scope then
  // frees its records and temporaries, so the next group reuses their bytes.
  Tensor branch_backward_tiled(int u, const Tensor& dy, int tiles, RecordSet& rec, CallScope& cs) final {
    const Ops& o = ops(u);
    Dims dg = dims_;
    dg.B = dims_.B / tiles;
    const std::int64_t rows = dg.N(), C = dims_.C;
    const Tensor x = rec.get("ln.x");
    Tensor dnorm = cs.keep({dims_.B, dims_.T, C});
    std::vector<ActivationRecord> left;  // whole tensors of the records the groups leave for B(u-1)
    for (int g = 0; g < tiles; ++g) {
      CallScope gs(cs.allocator(), cs.stream());
      RecordSet grec;
      grec.save("ln.x", x.view(g * rows * C, {dg.B, dg.T, C}), RecordReader::BPrev);
      o.recompute(dg, branch(u), Recompute::Full, grec, gs);
      Tensor part = o.backward_input(dg, branch(u), dy.view(g * rows * C, {dg.B, dg.T, C}), grec, gs);
      o.backward_weight(dg, branch(u), grec, gs);
      copy_rows(dnorm, part, g, gs);
      gs.release(std::move(part));
      std::size_t i = 0;
      for (ActivationRecord& r : grec.mutable_list()) {
        if (r.name == "ln.x") continue;
        if (g == 0) left.push_back(ActivationRecord{r.name, whole_of(r.tensor, tiles, cs), 0, r.reader, r.saved_by});
        STP_ASSERT(i < left.size() && left[i].name == r.name, "tiled B of ", unit_name(u), ": group ", g,
                   " left record ", r.name, " that group 0 did not");
        copy_rows(left[i++].tensor, r.tensor, g, gs);
        gs.release(std::move(r.tensor));
      }
    }
    for (ActivationRecord& r : left) rec.save(r.name, std::move(r.tensor), r.reader, r.saved_by);
    return dnorm;
  }
  // A tensor of `tiles` times t's rows (its first dimension), for the copies of each group's rows.
  static Tensor whole_of(const Tensor& t, int tiles, CallScope& cs) {
    Shape shape = t.shape();
    shape[0] *= tiles;
    return cs.keep(std::move(shape), t.dtype());
  }
  // Group g's rows of `whole`, from `part` (one group's worth), in stream order.
  static void copy_rows(const Tensor& whole, const Tensor& part, int g, CallScope& cs) {
    cs.stream().copy(static_cast<char*>(whole.raw()) + static_cast<std::size_t>(g) * part.bytes(), part.raw(),
                     part.bytes());
  }
  std::vector<RecomputedRecord> branch_recomputed_records(int u, Recompute r) const final {
    return ops(u).recomputed_records(dims_, r);
  }
  double branch_recompute_cost(int u, Recompute r) const final { return ops(u).recompute_cost(dims_, r); }

  Ops attn_, mlp_;
  std::vector<Branch> branches_;  // [unit]; attn / mlp units only
};

}  // namespace stp
