// The schedule generators (one file per family). Each returns a schedule that passes validate() for every
// m ≥ min_microbatches(name, p); below it they throw stp::Error naming the minimum. Rules: docs/schedules.md.
#pragma once

#include "schedule/schedule.h"

namespace stp::sched {

Schedule generate_gpipe(int pp, int microbatches);   // generators_basic.cpp
Schedule generate_1f1b(int pp, int microbatches);    // generators_basic.cpp
Schedule generate_zb_h1(int pp, int microbatches);   // generators_basic.cpp
Schedule generate_1f1b_i(int pp, int microbatches);  // generators_interleaved.cpp (v = 2, group = p)
Schedule generate_zb_v(int pp, int microbatches);    // generators_v.cpp (handcrafted V recipe)
Schedule generate_stp(int pp, int microbatches);     // generators_stp.cpp (docs/schedules.md, STP op lists)

// STP's rule needs m ≥ 3p−1; for 2p ≤ m < 3p−1 generate_stp() truncates the 3p−1 schedule (generators_stp.cpp).
inline int stp_rule_min_microbatches(int pp) { return 3 * pp - 1; }

}  // namespace stp::sched
