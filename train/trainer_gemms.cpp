// Trainer::Impl::prepare_gemms and the GEMM-shape accessors of Trainer (train/trainer.h).
#include <set>

#include "base/error.h"
#include "train/rank.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"

namespace stp {

// One step of this job on dry-run devices runs the same host program as a real step (the executor,
// the stages, their allocations in the same order and sizes: core/cpu/dry_stream.h), so the GEMMs
// its compute streams enqueue are the shapes, and, with every allocation 256-byte aligned on every
// backend, the operand alignments of a real step (core/gemm_shape.h). Each real rank prepares those
// of the dry rank in its place (one replica: the others run the same shapes), so a step chooses
// no algorithm (the cuBLASLt heuristic) on its critical path. An evaluation adds its forward
// shapes when the run validates.
void Trainer::Impl::prepare_gemms() {
  if (options.dry_run) return;
  Config dry_config = config;
  dry_config.output.trace = false;
  TrainerOptions o;
  o.dry_run = true;
  o.plan = &plan;
  Trainer dry(dry_config, o);
  dry.impl_->fault = FaultHook{};  // a test's injected fault belongs to the real step
  std::vector<GemmLog> logs(dry.impl_->ranks.size());
  for (std::size_t i = 0; i < logs.size(); ++i) dry.impl_->ranks[i]->compute->set_gemm_log(&logs[i]);
  dry.step();
  if (!config.data.val_path.empty()) dry.evaluate();
  for (auto& r : ranks) {
    std::set<GemmShape> shapes;
    for (std::size_t i = 0; i < logs.size(); ++i) {
      const Rank& d = *dry.impl_->ranks[i];
      if (d.pp_rank == r->pp_rank && d.tp_rank == r->tp_rank) shapes = logs[i].distinct();
    }
    for (const GemmShape& s : shapes) r->compute->prepare_gemm(s);
    r->prepared_gemms.assign(shapes.begin(), shapes.end());
    r->late_gemm_choices_before = r->device->late_gemm_choices();
  }
}

std::vector<std::vector<GemmShape>> Trainer::prepared_gemms() const {
  std::vector<std::vector<GemmShape>> out;
  for (const auto& r : impl_->ranks) out.push_back(r->prepared_gemms);
  return out;
}

void Trainer::set_gemm_logs(const std::vector<GemmLog*>& logs) {
  STP_ASSERT(logs.size() == impl_->ranks.size(), "Trainer::set_gemm_logs: ", logs.size(), " logs for ",
             impl_->ranks.size(), " devices");
  for (std::size_t i = 0; i < logs.size(); ++i) impl_->ranks[i]->compute->set_gemm_log(logs[i]);
}

}  // namespace stp
