// Structural, channel and deadlock checks of a schedule (see validator.h for the list).
#include "schedule/validator.h"

#include "base/error.h"
#include "schedule/dataflow.h"

namespace stp::sched {

namespace {

std::string where(const Schedule& s, int rank, int i) {
  return str("rank ", rank, " op ", i, " '", to_string(s.ranks[rank][i]), "'");
}

// 1. every stage on exactly one (rank, chunk).
void check_placement(const Schedule& s) {
  STP_CHECK(s.pp >= 1 && s.microbatches >= 1 && s.chunks >= 1, "schedule '", s.name, "' has pp ", s.pp, ", ",
            s.microbatches, " microbatches, ", s.chunks, " chunks (each must be at least 1)");
  STP_CHECK(static_cast<int>(s.ranks.size()) == s.pp && static_cast<int>(s.stage_of.size()) == s.pp, "schedule '",
            s.name, "' has ", s.ranks.size(), " op lists for pp ", s.pp);
  std::vector<std::pair<int, int>> owner(s.n_stages(), {-1, -1});
  for (int r = 0; r < s.pp; ++r) {
    STP_CHECK(static_cast<int>(s.stage_of[r].size()) == s.chunks, "rank ", r, " places ", s.stage_of[r].size(),
              " chunks, expected ", s.chunks);
    for (int c = 0; c < s.chunks; ++c) {
      int st = s.stage_of[r][c];
      STP_CHECK(st >= 0 && st < s.n_stages(), "rank ", r, " chunk ", c, " is stage ", st, ", outside 0..",
                s.n_stages() - 1);
      STP_CHECK(owner[st].first < 0, "stage ", st, " is on two ranks: rank ", owner[st].first, " chunk ",
                owner[st].second, " and rank ", r, " chunk ", c);
      owner[st] = {r, c};
    }
  }
}

// 2. chunk and microbatch in range; flags only where they mean something.
void check_parts(const Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    for (int i = 0; i < static_cast<int>(s.ranks[r].size()); ++i) {
      const Op& op = s.ranks[r][i];
      for (int k = 0; k < op.n_parts(); ++k) {
        const Part& p = op.part(k);
        STP_CHECK(p.chunk >= 0 && p.chunk < s.chunks, where(s, r, i), ": chunk ", p.chunk, " out of range (", s.chunks,
                  " chunks per rank)");
        STP_CHECK(p.mb >= 1 && p.mb <= s.microbatches, where(s, r, i), ": microbatch ", p.mb, " out of range 1..",
                  s.microbatches);
        STP_CHECK(!p.defer_w || p.pass == Pass::B, where(s, r, i), ": only a B can defer its W");
      }
      STP_CHECK(op.kind != OpKind::FF || op.a.mb != op.b.mb, where(s, r, i), ": F+F repeats a microbatch");
    }
  }
}

// 3–5. exactly one F and one B per (stage, microbatch); B after F; each deferred W consumed once, after its B.
void check_counts_and_w(const Schedule& s) {
  const DataKey key{s.n_stages(), s.microbatches};
  std::vector<int> seen(key.size(), -1);  // op index that produced (pass, stage, mb)
  for (int r = 0; r < s.pp; ++r) {
    const auto& ops = s.ranks[r];
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      for (int k = 0; k < ops[i].n_parts(); ++k) {
        const Part& p = ops[i].part(k);
        int st = s.stage(r, p.chunk);
        int out = key(p.pass, st, p.mb);
        STP_CHECK(seen[out] < 0, where(s, r, i), " repeats ", to_string(p), " (stage ", st, "), first at op ",
                  seen[out]);
        if (p.pass == Pass::B) {
          int f = seen[key(Pass::F, st, p.mb)];
          STP_CHECK(f >= 0 && f < i, where(s, r, i), ": backward of stage ", st, " microbatch ", p.mb,
                    " runs before its forward");
        }
        if (p.pass == Pass::W) {
          int b = seen[key(Pass::B, st, p.mb)];
          STP_CHECK(b >= 0 && b < i, where(s, r, i), ": W of stage ", st, " microbatch ", p.mb, " runs before its B");
          const Op& bop = ops[b];
          const Part& bp = bop.a.pass == Pass::B ? bop.a : bop.b;
          STP_CHECK(bp.defer_w, where(s, r, i), ": '", to_string(bop), "' at op ", b, " did not defer its W");
        }
        seen[out] = i;
      }
    }
  }
  for (int r = 0; r < s.pp; ++r) {
    for (int c = 0; c < s.chunks; ++c) {
      int st = s.stage(r, c);
      for (int j = 1; j <= s.microbatches; ++j) {
        STP_CHECK(seen[key(Pass::F, st, j)] >= 0, "stage ", st, " (rank ", r, " chunk ", c, ") has no forward ",
                  "of microbatch ", j, " (each stage needs exactly ", s.microbatches, ")");
        int b = seen[key(Pass::B, st, j)];
        STP_CHECK(b >= 0, "stage ", st, " (rank ", r, " chunk ", c, ") has no backward of microbatch ", j);
        const Op& bop = s.ranks[r][b];
        bool deferred = (bop.a.pass == Pass::B ? bop.a : bop.b).defer_w;
        STP_CHECK(!deferred || seen[key(Pass::W, st, j)] >= 0, where(s, r, b), " defers its W but no W or F&W on rank ",
                  r, " consumes it");
      }
    }
  }
}

// 6. both ends of every directed channel (or lane, Note [Channel lanes]) see the same message sequence.
void check_sequence(const Schedule& s, const Channel& c, int lane) {
  auto pick = [lane](const std::vector<Message>& msgs) {
    std::vector<int> idx;
    for (int k = 0; k < static_cast<int>(msgs.size()); ++k)
      if (lane < 0 || static_cast<int>(msgs[k].pass) == lane) idx.push_back(k);
    return idx;
  };
  std::vector<int> sent = pick(c.sent), recv = pick(c.received);
  for (std::size_t k = 0; k < std::max(sent.size(), recv.size()); ++k) {
    if (k < sent.size() && k < recv.size() && c.sent[sent[k]] == c.received[recv[k]]) continue;
    std::string what = k < sent.size()
                           ? str(where(s, c.src, c.sent_op[sent[k]]), " sends the ", to_string(c.sent[sent[k]]))
                           : str("rank ", c.src, " sends nothing more");
    std::string want =
        k < recv.size() ? str(where(s, c.dst, c.received_op[recv[k]]), " expects the ", to_string(c.received[recv[k]]))
                        : str("rank ", c.dst, " expects nothing more");
    throw Error(str("channel rank ", c.src, " -> rank ", c.dst,
                    lane < 0    ? ""
                    : lane == 0 ? " (activations)"
                                : " (gradients)",
                    " disagrees at message ", k, ": ", what, " but ", want));
  }
}

void check_channels(const Schedule& s, ChannelModel model) {
  for (const Channel& c : channels(s)) {
    if (model == ChannelModel::SharedFifo) {
      check_sequence(s, c, -1);
    } else {
      check_sequence(s, c, static_cast<int>(Pass::F));
      check_sequence(s, c, static_cast<int>(Pass::B));
    }
  }
}

}  // namespace

void validate(const Schedule& s, ChannelModel channel_model) {
  check_placement(s);
  check_parts(s);
  check_counts_and_w(s);
  check_channels(s, channel_model);
  walk_dataflow(s, [](int, int) {});  // 7. no deadlock
}

}  // namespace stp::sched
