// A pipeline schedule as plain data: per rank, the ordered list of ops it runs, plus the placement of
// pipeline stages on (rank, local chunk). Generated once, validated (validator.h), simulated (simulator.h);
// an executor only walks `ranks[r]` in order.
//
// Placement (docs/design.md, Op strings):
//   interleaved  local chunk c on rank r is stage c·p + r (one chunk: stage r)
//   V            chunk 0 is stage r, chunk 1 is stage 2p−1−r (the loss stage 2p−1 is on rank 0)
//
// Data flow between stages (the same DAG in every schedule):
//   F(s, j) needs F(s−1, j);  B(s, j) needs B(s+1, j), or F(S−1, j) on the loss stage;  W(s, j) needs B(s, j).
// A dependency between stages on different ranks is a P2P message on the directed channel (src → dst);
// stages on the same rank hand over locally (V: chunk 0 → chunk 1 on rank p−1, and the loss on rank 0).
//
// Usage:
//   Schedule s = generate("stp", /*pp=*/4, /*microbatches=*/12);   // throws stp::Error below the minimum m
//   validate(s);                                                   // throws stp::Error naming the bad op
//   SimResult r = simulate(s, Costs{});
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedule/op.h"

namespace stp::sched {

enum class Placement : std::uint8_t { Interleaved, V };

struct Schedule {
  std::string name;
  int pp = 0;            // pipeline ranks p
  int microbatches = 0;  // m
  int chunks = 1;        // local chunks per rank (v)
  Placement placement = Placement::Interleaved;
  std::vector<std::vector<int>> stage_of;  // [rank][chunk] -> stage; filled by make_schedule()
  std::vector<std::vector<Op>> ranks;      // [rank] -> ops in execution order

  int n_stages() const { return pp * chunks; }
  int stage(int rank, int chunk) const { return stage_of[rank][chunk]; }
  std::size_t n_ops() const;
};

// An empty schedule with its placement table filled in.
Schedule make_schedule(std::string name, int pp, int microbatches, int chunks, Placement placement);

// Schedule names in the order `stp sim --compare` and the docs list them.
const std::vector<std::string>& schedule_names();
// Smallest m the named generator supports for pp ranks (stp: 2p). Throws on an unknown name.
int min_microbatches(std::string_view name, int pp);
// Generates the named schedule. Throws stp::Error on an unknown name, pp < 1, or m below the minimum
// (the message names the minimum). The result always passes validate().
Schedule generate(std::string_view name, int pp, int microbatches);

// One P2P message: the output of pass `pass` (F = activation, B = input gradient) of stage `from_stage` for
// microbatch `mb`, going to stage `to_stage`, from rank `src` to rank `dst`.
struct Message {
  Pass pass = Pass::F;
  int from_stage = 0;
  int to_stage = 0;
  int mb = 0;
  int src = 0;
  int dst = 0;
  bool operator==(const Message&) const = default;
};
std::string to_string(const Message& msg);

// Where a part reads its input from and where its output goes (stage −1: none / local loss).
int input_stage(const Schedule& s, int rank, const Part& part);   // F: s−1; B: s+1 (own stage at the loss); W: own
int output_stage(const Schedule& s, int rank, const Part& part);  // F: s+1; B: s−1; W: −1
int rank_of_stage(const Schedule& s, int stage);

// The P2P messages one op receives before it runs and sends after it ends, in part order.
struct OpMessages {
  std::vector<Message> recv;
  std::vector<Message> send;
};
OpMessages op_messages(const Schedule& s, int rank, const Op& op);

// The message sequence of one directed channel, as each end sees it: `sent` in the sender's op order,
// `received` in the receiver's. A valid schedule has sent == received on every channel; `*_op` hold the
// index of the op that sends/receives each message.
struct Channel {
  int src = 0;
  int dst = 0;
  std::vector<Message> sent, received;
  std::vector<int> sent_op, received_op;
};
std::vector<Channel> channels(const Schedule& s);

}  // namespace stp::sched
