// Executor: walks one rank's op list (schedule/) against that rank's stages (models/stage.h).
// One executor per rank, each driven by its own host thread; all work goes onto these streams:
//
//   compute  — every unit's F, B, W, in the order the op list and the braiding rules give;
//   tp-comm  — the TP all-reduce after each unit that returns a tensor (stage.h protocol);
//   p2p      — pipeline sends and receives to neighbouring ranks, one stream per channel.
//
// Braiding (docs/schedules.md, STP op lists, Units and braided blocks): a two-part op (F&B, F&W, F+F) alternates one
// step of each part on the compute stream. A step is one unit (an F unit; a B unit followed by its W when W is fused; a
// W unit). After a step whose unit returned a tensor, the all-reduce is enqueued on tp-comm right away (tp-comm waits
// on an event recorded after the unit); the *next step of the same part* waits on the all-reduce's event (a stream
// wait, never a host wait), while the other part's next step runs meanwhile. A one-part op therefore exposes each
// all-reduce, except that a fused W runs between a B unit and the wait, hiding that B's all-reduce under W (Megatron's
// async input-grad all-reduce).
//
// Pipeline messages (schedule::op_messages) travel on channels (schedule/p2p_groups.h): one per
// direction and message kind between two ranks, each its own 2-rank communicator and p2p stream.
// The receives of op k are issued on their channels' streams before op k's compute (compute waits
// on those streams); op k's sends after its compute and its last all-reduces (each sending
// channel's stream waits on compute). No communicator group is ever left open, so TP and DP
// all-reduces are enqueued when they are issued. The posting rules are schedule/p2p_groups.h:
// `stp sim --check-deadlock` replays the same code. Stage-to-stage hand-overs on the same rank
// (the V's turn) are device copies on compute. Every message carries a tag (pass, source stage,
// microbatch) that HostComm checks, so a channel-order mismatch is an error, never silent
// corruption.
//
// Data parallelism: once the last op that runs a backward of a chunk is enqueued, the executor
// reports that chunk's gradients final (RankResources::grads_final), after that op's sends, and
// the chunk's data-parallel all-reduce starts behind the compute stream (optim/dp_grad_sync.h).
//
// Parameters: before the compute of the first op of a step that runs a part of a chunk, the
// executor calls RankResources::params_needed(chunk) (an offloaded optimizer's last uploads of
// that chunk and the distributed optimizer's all-gathers are waited for there, a stream wait;
// optim/host_update.h, optim/distributed_optimizer.h).
//
// Parameter streaming (offload/param_streamer.h): each unit pass of a streamed chunk asks
// RankResources::params for its weights (and gradients) before it, has the weights of the same
// part's next unit prefetched while it computes (a lookahead of one unit), and hands them back
// after it. A W pass moves only the gradients it writes (Stage::pass_grads): one that writes none
// (its unit's B or the head's F computed the weight gradients) moves nothing.
//
// Memory plan (memory/plan.h): after each F unit the plan offloads, the unit's records go to host
// on the D2H stream (offload/offload_engine.h); before op k the sets the plan lists for k start
// their prefetch on the H2D stream; the first B unit of a chunk-microbatch waits for its reload
// (a stream wait). When the schedule defers that set's W, the records only W reads are filed
// apart (OffloadEngine weight key), and after each B unit what is left for W (records W reads,
// the gradients B saved for it) joins them: they come back before the set's first W unit, so
// they do not occupy the device from B to W. Recompute needs nothing here: the stage re-runs
// forwards itself.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/comm.h"
#include "core/device.h"
#include "memory/plan.h"
#include "models/stage.h"
#include "offload/offload_engine.h"
#include "offload/param_streamer.h"
#include "schedule/p2p_groups.h"
#include "schedule/schedule.h"

namespace stp {

// One pipeline channel as a rank sees it: its communicator (2 ranks: 0 = the source, 1 = the
// destination) and this rank's stream for it (only sends, or only receives).
struct PipelineChannel {
  sched::P2pChannel channel;
  Communicator* comm = nullptr;
  Stream* stream = nullptr;
};

struct RankResources {
  const sched::Schedule* schedule = nullptr;
  int pp_rank = 0;
  std::vector<Stage*> stages;  // [local chunk]
  Device* device = nullptr;
  Stream* compute = nullptr;
  Stream* tp_comm = nullptr;
  Communicator* tp = nullptr;  // TP group; null or size 1: units return nothing to reduce
  // The pipeline channels this rank sends or receives on (sched::p2p_channels(schedule,
  // pp_rank)); empty when pp == 1.
  std::vector<PipelineChannel> channels;
  bool trace = false;  // emit op / unit / all-reduce spans (streams have a recorder)
  // Memory plan of this rank (null: keep everything) and the engine that moves offloaded records.
  const RankPlan* plan = nullptr;
  OffloadEngine* offload = nullptr;  // required when the plan offloads
  // Parameter streaming (RankPlan::param_stream): every F, B and W unit pass is bracketed by
  // begin_pass / end_pass (a B with its fused W is one pass), and the part's next pass is
  // prefetched right after begin_pass; the host copies of the gradients
  // are made ready on compute before a chunk's gradients are reported final and at the end of a
  // walk. Required when the plan streams.
  ParamStreamer* params = nullptr;
  // Called once per local chunk and step, after the compute of the last op that runs a backward
  // (B or W) of that chunk has been enqueued, after that op's sends: its gradients are final at that point of the
  // compute stream (data-parallel reduction starts there, optim/dp_grad_sync.h). Optional.
  std::function<void(int chunk)> grads_final;
  // Called once per local chunk and step, before the compute of the first op that runs a part of
  // that chunk (after its receives are posted): the step is about to read the chunk's parameters.
  // An offloaded optimizer orders compute after that chunk's upload there (a stream wait). With
  // trace, the call is a "params" span on compute. Optional.
  std::function<void(int chunk)> params_needed;
};

// The P2P tag of a message: pass, source stage and microbatch, so both ends can check it.
std::uint32_t p2p_tag(sched::Pass pass, int from_stage, int mb);

class Executor {
 public:
  explicit Executor(RankResources resources);
  ~Executor();

  // Last stage only: a (m,) device tensor that receives each microbatch's loss (copied on compute
  // right after the forward that computes it, before the stage may drop it).
  void set_loss_output(Tensor losses);

  // Enqueues every op of this rank for one step. Returns when everything is enqueued (the streams
  // may still be running); the caller synchronizes compute, tp-comm and the channel streams. The
  // stages' gradients are zero when it is called (a streamed chunk's first gradient pass of the
  // step zeroes its device buffer instead of copying the host copy up: ParamStreamer).
  void run_step();

  // Forward-only walk (evaluation): the F parts of this rank's op list in their order (B and W
  // parts dropped, braided ops reduced to their F), with the same pipeline messages and TP
  // all-reduces, no prefetches and no gradient reports. The stages must be in forward-only mode
  // (Stage::set_forward_only): every microbatch is released right after its last F, so no
  // activation record outlives its unit. Losses go to the loss output as in run_step.
  void run_forward();

 private:
  struct Cursor;
  struct EventPool {
    std::vector<std::unique_ptr<Event>> events;
    std::size_t used = 0;  // handed out during the current op
  };
  Event& new_event(Stream& stream);  // an event recorded only on `stream`
  Tensor message_buffer(const sched::Message& m, bool incoming, Stream* writer = nullptr);
  const PipelineChannel& channel(const sched::Message& m) const;
  struct Sink final : sched::P2pSink {  // the posting's waits between compute and channel streams
    explicit Sink(Executor& owner) : e(owner) {}
    void p2p_waits_for_compute(const sched::P2pChannel& c) override;
    void compute_waits_for_p2p(const sched::P2pChannel& c) override;
    Executor& e;
  };
  void post_receives(const std::vector<sched::Message>& recv);
  void local_handoffs(const sched::Op& op);
  void run_parts(const sched::Op& op);
  void step(Cursor& c);
  void trace_unit(const Cursor& c, int u, sched::Pass pass, bool begin);
  void all_reduce_after(Cursor& c, const Tensor& t, const std::string& unit);
  RecordSet* offloaded_records(int chunk, int u, int mb);
  // The offload key B's records of unit u are filed under: the unit's own under late reloads
  // (they come back unit by unit), else the whole set's.
  OffloadEngine::Key backward_key(int chunk, int u, int mb) const;
  void offload_after_forward(int chunk, int u, int mb);
  void offload_after_backward(int chunk, int u, int mb);  // deferred W: what W reads goes to host
  void copy_losses(const sched::Op& op);
  void post_sends(const std::vector<sched::Message>& send);
  void release_finished(const sched::Op& op);
  void report_grads_final();
  void need_params(const sched::Op& op);
  void walk(bool forward_only);
  Stage& stage_of_chunk(int chunk) const;
  int local_chunk_of_stage(int stage) const;

  RankResources r_;
  std::vector<std::size_t> last_backward_;  // [local chunk] index of its last op with B or W
  std::vector<int> final_pending_;          // chunks final, reported after the op's sends
  std::vector<bool> params_needed_;         // [local chunk] params_needed called this step
  std::map<Stream*, EventPool> pools_;
  Tensor losses_;  // (m,) last stage only
  Sink sink_{*this};
  std::set<std::pair<int, int>> deferred_w_;  // (local chunk, mb) whose B defers W on this rank
};

}  // namespace stp
