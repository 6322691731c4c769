// The rank layout of a training job: dp × pp × tp ranks, numbered with TP innermost (a TP group
// is tp consecutive ranks, so it stays inside a node when processes are placed in rank order),
// then PP, then DP:
//
//   global = (dp_rank · pp + pp_rank) · tp + tp_rank
//
// (with dp = 1 this is the single-replica numbering pp_rank · tp + tp_rank). A job is one process
// driving every rank as threads, or — launched by MPI with several processes — one rank per
// process, process g driving global rank g (docs/scale-out.md).
#pragma once

#include <vector>

namespace stp {

struct Config;

struct RankLayout {
  int dp = 1, pp = 1, tp = 1;

  static RankLayout of(const Config& config);
  int size() const { return dp * pp * tp; }
  int replica_size() const { return pp * tp; }  // ranks of one data-parallel replica
  int global(int dp_rank, int pp_rank, int tp_rank) const { return (dp_rank * pp + pp_rank) * tp + tp_rank; }
  int dp_rank(int global) const { return global / (pp * tp); }
  int pp_rank(int global) const { return global / tp % pp; }
  int tp_rank(int global) const { return global % tp; }

  // The global ranks process `process` of `processes` drives: all of them for one process, else
  // exactly rank `process` (check_processes must have passed).
  std::vector<int> ranks_of_process(int process, int processes) const;
};

// Throws stp::Error, naming both numbers and what to change, when a job of `processes` processes
// cannot drive the layout: several processes must be exactly one per rank.
void check_processes(const RankLayout& layout, int processes);

}  // namespace stp
