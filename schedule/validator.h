// Proves a schedule runnable. validate() throws stp::Error with a one-line message naming the first
// offending op (rank, index and op string) or stage; it returns normally only if all of these hold:
//
//   1. placement   every stage sits on exactly one (rank, chunk);
//   2. parts       chunks and microbatches in range; `*` only on a B;
//   3. counts      per stage, exactly one F and one B for each microbatch 1..m (so m of each);
//   4. order       on its rank, each B runs after its F;
//   5. W           each deferred B (B*) is consumed by exactly one later W or F&W on its rank, and no W
//                  names a B that did not defer;
//   6. channels    on every directed rank→rank channel, the sender's message sequence equals the
//                  receiver's (messages have one shape, so a mismatch would be silent data corruption);
//   7. deadlock    the dependency walk (dataflow.h) runs every op.
#pragma once

#include "schedule/schedule.h"

namespace stp::sched {

void validate(const Schedule& s);

}  // namespace stp::sched
