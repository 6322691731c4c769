// Event-driven dependency walk (see dataflow.h).
#include "schedule/dataflow.h"

#include "base/error.h"

namespace stp::sched {

int input_key(const Schedule& s, const DataKey& key, int rank, const Part& part) {
  int in = input_stage(s, rank, part);
  if (in < 0) return -1;
  Pass pass = part.pass == Pass::F ? Pass::F : Pass::B;
  if (part.pass == Pass::B && in == s.stage(rank, part.chunk)) pass = Pass::F;  // the loss stage: its own F
  return key(pass, in, part.mb);
}

int output_key(const Schedule& s, const DataKey& key, int rank, const Part& part) {
  return key(part.pass, s.stage(rank, part.chunk), part.mb);
}

namespace {

std::string describe_key(const Schedule& s, const DataKey& key, int k) {
  static const char* kPass[] = {"F", "B", "W"};
  int mb = k % key.microbatches + 1;
  int stage = (k / key.microbatches) % key.n_stages;
  int pass = k / key.microbatches / key.n_stages;
  return str(kPass[pass], " of stage ", stage, " microbatch ", mb, " (rank ", rank_of_stage(s, stage), ")");
}

}  // namespace

void walk_dataflow(const Schedule& s, const std::function<void(int rank, int op)>& visit) {
  const DataKey key{s.n_stages(), s.microbatches};
  std::vector<char> produced(key.size(), 0);
  std::vector<int> waiter(key.size(), -1);  // the rank stalled on this output, if any
  std::vector<int> pos(s.pp, 0), waits_on(s.pp, -1);
  std::vector<int> ready;  // ranks that may make progress
  for (int r = s.pp - 1; r >= 0; --r) ready.push_back(r);

  while (!ready.empty()) {
    int r = ready.back();
    ready.pop_back();
    const auto& ops = s.ranks[r];
    while (pos[r] < static_cast<int>(ops.size())) {
      const Op& op = ops[pos[r]];
      int missing = -1;
      for (int i = 0; i < op.n_parts() && missing < 0; ++i) {
        int in = input_key(s, key, r, op.part(i));
        if (in >= 0 && !produced[in]) missing = in;
      }
      if (missing >= 0) {  // stall until `missing` is produced
        waiter[missing] = r;
        waits_on[r] = missing;
        break;
      }
      visit(r, pos[r]);
      for (int i = 0; i < op.n_parts(); ++i) {
        int out = output_key(s, key, r, op.part(i));
        produced[out] = 1;
        if (waiter[out] >= 0) ready.push_back(waiter[out]), waiter[out] = -1;
      }
      ++pos[r];
    }
  }

  std::string stalled;
  for (int r = 0; r < s.pp; ++r) {
    if (pos[r] == static_cast<int>(s.ranks[r].size())) continue;
    stalled += str(stalled.empty() ? "" : "; ", "rank ", r, " op ", pos[r], " '", to_string(s.ranks[r][pos[r]]),
                   "' waits for ", describe_key(s, key, waits_on[r]));
  }
  STP_CHECK(stalled.empty(), "schedule '", s.name, "' deadlocks: ", stalled);
}

}  // namespace stp::sched
