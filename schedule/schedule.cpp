// Placement tables, the generator registry and the P2P message model shared by validator and simulator.
#include "schedule/schedule.h"

#include <map>

#include "base/error.h"
#include "schedule/generators.h"

namespace stp::sched {

std::size_t Schedule::n_ops() const {
  std::size_t n = 0;
  for (const auto& ops : ranks) n += ops.size();
  return n;
}

Schedule make_schedule(std::string name, int pp, int microbatches, int chunks, Placement placement) {
  STP_ASSERT(pp >= 1 && chunks >= 1 && (placement == Placement::Interleaved || chunks == 2), "bad placement");
  Schedule s;
  s.name = std::move(name);
  s.pp = pp;
  s.microbatches = microbatches;
  s.chunks = chunks;
  s.placement = placement;
  s.stage_of.assign(pp, std::vector<int>(chunks));
  s.ranks.assign(pp, {});
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < chunks; ++c)
      s.stage_of[r][c] = placement == Placement::V && c == 1 ? 2 * pp - 1 - r : c * pp + r;
  return s;
}

namespace {

struct Entry {
  const char* name;
  Schedule (*make)(int, int);
};

const Entry kGenerators[] = {
    {"gpipe", &generate_gpipe}, {"1f1b", &generate_1f1b}, {"1f1b-i", &generate_1f1b_i},
    {"zb-h1", &generate_zb_h1}, {"zb-v", &generate_zb_v}, {"stp", &generate_stp},
};

const Entry& find_generator(std::string_view name) {
  for (const Entry& e : kGenerators)
    if (name == e.name) return e;
  throw Error(str("unknown schedule '", name, "' (known: gpipe, 1f1b, 1f1b-i, zb-h1, zb-v, stp)"));
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const Entry& e : kGenerators) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

int min_microbatches(std::string_view name, int pp) {
  find_generator(name);
  return name == "stp" ? 2 * pp : 1;
}

Schedule generate(std::string_view name, int pp, int microbatches) {
  const Entry& e = find_generator(name);
  STP_CHECK(pp >= 1, "pipeline size must be at least 1, got --pp ", pp);
  int min_m = min_microbatches(name, pp);
  STP_CHECK(microbatches >= min_m, "schedule '", name, "' needs at least ", min_m, " microbatches for pp ", pp,
            (name == "stp" ? " (2p)" : ""), ", got ", microbatches);
  return e.make(pp, microbatches);
}

std::string to_string(const Message& msg) {
  return str(msg.pass == Pass::F ? "activation" : "gradient", " of stage ", msg.from_stage, " microbatch ", msg.mb,
             " for stage ", msg.to_stage);
}

int rank_of_stage(const Schedule& s, int stage) {
  for (int r = 0; r < s.pp; ++r)
    for (int c = 0; c < s.chunks; ++c)
      if (s.stage_of[r][c] == stage) return r;
  return -1;
}

int input_stage(const Schedule& s, int rank, const Part& part) {
  int st = s.stage(rank, part.chunk);
  if (part.pass == Pass::F) return st - 1;
  if (part.pass == Pass::B) return st == s.n_stages() - 1 ? st : st + 1;
  return st;
}

int output_stage(const Schedule& s, int rank, const Part& part) {
  int st = s.stage(rank, part.chunk);
  if (part.pass == Pass::F) return st + 1 < s.n_stages() ? st + 1 : -1;
  if (part.pass == Pass::B) return st - 1;
  return -1;
}

OpMessages op_messages(const Schedule& s, int rank, const Op& op) {
  OpMessages out;
  for (int i = 0; i < op.n_parts(); ++i) {
    const Part& p = op.part(i);
    if (p.pass == Pass::W) continue;
    int st = s.stage(rank, p.chunk);
    int in = input_stage(s, rank, p);
    if (in >= 0 && in != st) {
      int src = rank_of_stage(s, in);
      if (src != rank) out.recv.push_back(Message{p.pass, in, st, p.mb, src, rank});
    }
    int to = output_stage(s, rank, p);
    if (to >= 0) {
      int dst = rank_of_stage(s, to);
      if (dst != rank) out.send.push_back(Message{p.pass, st, to, p.mb, rank, dst});
    }
  }
  return out;
}

std::vector<Channel> channels(const Schedule& s) {
  std::map<std::pair<int, int>, Channel> by_pair;
  auto channel = [&](int src, int dst) -> Channel& {
    Channel& c = by_pair[{src, dst}];
    c.src = src;
    c.dst = dst;
    return c;
  };
  for (int r = 0; r < s.pp; ++r) {
    for (int i = 0; i < static_cast<int>(s.ranks[r].size()); ++i) {
      OpMessages msgs = op_messages(s, r, s.ranks[r][i]);
      for (const Message& m : msgs.recv) {
        Channel& c = channel(m.src, m.dst);
        c.received.push_back(m);
        c.received_op.push_back(i);
      }
      for (const Message& m : msgs.send) {
        Channel& c = channel(m.src, m.dst);
        c.sent.push_back(m);
        c.sent_op.push_back(i);
      }
    }
  }
  std::vector<Channel> out;
  for (auto& [key, c] : by_pair) out.push_back(std::move(c));
  return out;
}

}  // namespace stp::sched
