#include "train/rank_layout.h"

#include "config/config.h"
#include "base/error.h"

namespace stp {

RankLayout RankLayout::of(const Config& c) { return RankLayout{c.parallel.dp, c.parallel.pp, c.parallel.tp}; }

std::vector<int> RankLayout::ranks_of_process(int process, int processes) const {
  if (processes <= 1) {
    std::vector<int> all(static_cast<std::size_t>(size()));
    for (int g = 0; g < size(); ++g) all[static_cast<std::size_t>(g)] = g;
    return all;
  }
  STP_ASSERT(processes == size() && process >= 0 && process < processes, "process ", process, " of ", processes,
             " for ", size(), " ranks");
  return {process};
}

void check_processes(const RankLayout& l, int processes) {
  if (processes <= 1 || processes == l.size()) return;
  throw Error(str("parallel.dp x parallel.pp x parallel.tp = ", l.dp, " x ", l.pp, " x ", l.tp, " = ", l.size(),
                  " ranks, but the MPI launcher started ", processes,
                  " processes; a multi-process job runs one rank per process: start ", l.size(),
                  " processes (mpirun -np ", l.size(), ") or set parallel.dp, pp and tp so that their product is ",
                  processes));
}

}  // namespace stp
