// Proves a schedule runnable. validate() throws stp::Error with a one-line message naming the first
// offending op (rank, index and op string) or stage; it returns normally only if all of these hold:
//
//   1. placement   every stage sits on exactly one (rank, chunk);
//   2. parts       chunks and microbatches in range; `*` only on a B;
//   3. counts      per stage, exactly one F and one B for each microbatch 1..m (so m of each);
//   4. order       on its rank, each B runs after its F;
//   5. W           each deferred B (B*) is consumed by exactly one later W or F&W on its rank, and no W
//                  names a B that did not defer;
//   6. channels    on every directed rank→rank channel, the sequence of messages the sender sends equals the
//                  sequence the receiver consumes (messages have one shape, so a mismatch would be silent data
//                  corruption). See Note [Channel lanes] for what "channel" means;
//   7. deadlock    the dependency walk (dataflow.h) runs every op.
#pragma once

#include "schedule/schedule.h"

namespace stp::sched {

// Note [Channel lanes]
// A directed rank pair carries activations (F outputs) and input gradients (B outputs). With
// ChannelModel::Lanes (the default) each kind is its own FIFO lane — the executor keeps them apart with two
// tags or communicators — and the check compares each lane's sequence. With ChannelModel::SharedFifo both
// kinds share one FIFO and the mixed sequence must agree. STP, GPipe, 1F1B and ZB-H1 satisfy both, for every
// p and m we sweep. Two need lanes:
//   * ZB-V's handcrafted order once m > p: on rank 0 → rank 1 (p=4, m=8) it sends F0.7's activation (op 6)
//     before B1.1's gradient (op 8), while rank 1 consumes the gradient at op 8 and the activation at op 16;
//   * 1F1B-I with p = 2 and odd m (a shape Megatron-LM once got wrong): rank 1 → rank 0 carries
//     both chunk-0 → chunk-1 activations and gradients, in different orders at the two ends.
enum class ChannelModel : std::uint8_t { Lanes, SharedFifo };

void validate(const Schedule& s, ChannelModel channel_model = ChannelModel::Lanes);

}  // namespace stp::sched
