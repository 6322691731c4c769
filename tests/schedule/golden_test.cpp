// Golden op lists: STP for p=4, m=12 and p=2, m=9, which equal the paper's two schedule figures
// (docs/schedules.md, STP op lists, Worked examples); 1F1B-I and ZB-V for p=4, m=8 as published
// (docs/schedules.md, Golden values).
#include <gtest/gtest.h>

#include <cctype>
#include <sstream>

#include "schedule/schedule.h"
#include "schedule/validator.h"

using namespace stp::sched;

namespace {

std::string rank_ops(const Schedule& s, int r) { return join_ops(s.ranks[r]); }

// The paper writes a popped deferred W as bare "W"; our strings name what it consumes, in FIFO order
// (rank 0: B1.6…B1.11; rank 1: B1.5…; rank 2: B0.3, B1.5, …; rank 3: B1.4, B0.4, B1.5…).
const char* kStpP4M12[4] = {
    "F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F0.7 F1.1 F0.8 "
    "F1.2&B1.1* F0.9&W1.1 F1.3&B1.2* F0.10&W1.2 F1.4&B1.3* F0.11&W1.3 "
    "F1.5&B1.4 F0.12&B0.1 F1.6&B1.5 "
    "B0.2 F1.7&B1.6* B0.3 F1.8&B1.7* B0.4 F1.9&B1.8* B0.5 F1.10&B1.9* B0.6 F1.11&B1.10* B0.7 F1.12&B1.11* "
    "B0.8 B1.12 B0.9 W1.6 W1.7 B0.10 W1.8 W1.9 B0.11 W1.10 W1.11 B0.12",
    "F0.1 F0.2 F0.3 F0.4 F0.5 F1.1 F0.6 F1.2 F0.7+F0.8 "
    "F1.3&B1.1* F0.9&W1.1 F1.4&B1.2* F0.10&W1.2 "
    "F1.5&B1.3 F0.11&B0.1 F1.6&B1.4 F0.12&B0.2 F1.7&B1.5* "
    "B0.3 F1.8&B1.6* B0.4 F1.9&B1.7* B0.5 F1.10&B1.8* B0.6 F1.11&B1.9* B0.7 F1.12&B1.10* "
    "B0.8 B1.11 B0.9 B1.12 B0.10 W1.5 W1.6 B0.11 W1.7 W1.8 B0.12 W1.9 W1.10",
    "F0.1 F0.2 F0.3 F1.1 F0.4 F1.2 F0.5 F1.3 F0.6 F0.7+F0.8 "
    "F1.4&B1.1* F0.9&W1.1 "
    "F1.5&B1.2 F0.10&B0.1 F1.6&B1.3 F0.11&B0.2 F1.7&B1.4 F0.12&B0.3* F1.8&B1.5* "
    "B0.4 F1.9&B1.6* B0.5 F1.10&B1.7* B0.6 F1.11&B1.8* B0.7 F1.12&B1.9* "
    "B0.8 B1.10 B0.9 B1.11 B0.10 B1.12 B0.11 W0.3 W1.5 B0.12 W1.6 W1.7 W1.8 W1.9",
    "F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 F0.4 F1.4 F0.5+F0.6 F0.7+F0.8 "
    "F1.5&B1.1 F0.9&B0.1 F1.6&B1.2 F0.10&B0.2 F1.7&B1.3 F0.11&B0.3 F1.8&B1.4* F0.12&B0.4* F1.9&B1.5* "
    "B0.5 F1.10&B1.6* B0.6 F1.11&B1.7* B0.7 F1.12&B1.8* "
    "B0.8 B1.9 B0.9 B1.10 B0.10 B1.11 B0.11 B1.12 B0.12 W1.4 W0.4 W1.5 W1.6 W1.7 W1.8",
};

const char* kStpP2M9[2] = {
    "F0.1 F0.2 F0.3 F1.1 F0.4 F1.2&B1.1* F0.5&W1.1 "
    "F1.3&B1.2 F0.6&B0.1 F1.4&B1.3 F0.7&B0.2 F1.5&B1.4 F0.8&B0.3 F1.6&B1.5 F0.9&B0.4 F1.7&B1.6 "
    "B0.5 F1.8&B1.7* B0.6 F1.9&B1.8* B0.7 B1.9 B0.8 W1.7 W1.8 B0.9",
    "F0.1 F1.1 F0.2 F1.2 F0.3+F0.4 "
    "F1.3&B1.1 F0.5&B0.1 F1.4&B1.2 F0.6&B0.2 F1.5&B1.3 F0.7&B0.3 F1.6&B1.4 F0.8&B0.4 F1.7&B1.5 F0.9&B0.5 "
    "F1.8&B1.6* B0.6 F1.9&B1.7* B0.7 B1.8 B0.8 B1.9 B0.9 W1.6 W1.7",
};

// The published 1F1B-I example writes ops as F<mb>.<chunk> with 0-based microbatches.
std::string from_mb_chunk(const std::string& text) {
  std::istringstream in(text);
  std::string tok, out;
  while (in >> tok) {
    if (tok == "|") continue;
    std::size_t dot = tok.find('.');
    int mb = std::stoi(tok.substr(1, dot - 1)), chunk = std::stoi(tok.substr(dot + 1));
    out += (out.empty() ? "" : " ") + std::string(1, tok[0]) + std::to_string(chunk) + "." + std::to_string(mb + 1);
  }
  return out;
}

// The published ZB-V example writes ops as F0 (chunk 0) / f0 (chunk 1) with 0-based microbatches; every B splits.
std::string from_case(const std::string& text) {
  std::istringstream in(text);
  std::string tok, out;
  while (in >> tok) {
    char letter = static_cast<char>(std::toupper(tok[0]));
    int chunk = std::isupper(static_cast<unsigned char>(tok[0])) ? 0 : 1;
    int mb = std::stoi(tok.substr(1)) + 1;
    out += (out.empty() ? "" : " ") + std::string(1, letter) + std::to_string(chunk) + "." + std::to_string(mb) +
           (letter == 'B' ? "*" : "");
  }
  return out;
}

}  // namespace

TEST(Golden, StpP4M12MatchesWorkedExample) {
  Schedule s = generate("stp", 4, 12);
  validate(s);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_ops(s, r), kStpP4M12[r]) << "rank " << r;
}

TEST(Golden, StpP2M9MatchesWorkedExample) {
  Schedule s = generate("stp", 2, 9);
  validate(s);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(rank_ops(s, r), kStpP2M9[r]) << "rank " << r;
}

TEST(Golden, Interleaved1F1BMatchesWorkedExample) {
  const char* expected[4] = {
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 | F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0.0 F7.1 "
      "B1.0 | B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 | F4.0 B0.1 F5.0 B1.1 F6.0 B2.1 F7.0 B3.1 F4.1 B0.0 F5.1 B1.0 F6.1 "
      "B2.0 F7.1 B3.0 | B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 | F2.1 B0.1 F3.1 B1.1 F4.0 B2.1 F5.0 B3.1 F6.0 B0.0 F7.0 B1.0 F4.1 B2.0 F5.1 "
      "B3.0 F6.1 B4.1 F7.1 B5.1 | B6.1 B7.1 B4.0 B5.0 B6.0 B7.0",
      "F0.0 F1.0 F2.0 F3.0 | F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 F6.0 B2.0 F7.0 B3.0 F4.1 "
      "B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 | B4.0 B5.0 B6.0 B7.0",
  };
  Schedule s = generate("1f1b-i", 4, 8);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_ops(s, r), from_mb_chunk(expected[r])) << "rank " << r;
}

TEST(Golden, ZbvMatchesWorkedExample) {
  const char* expected[4] = {
      "F0 F1 F2 F3 F4 F5 F6 f0 b0 w0 f1 b1 w1 f2 b2 w2 f3 b3 w3 F7 B0 W0 f4 b4 w4 B1 W1 f5 b5 w5 B2 W2 f6 b6 w6 B3 "
      "W3 f7 b7 w7 B4 W4 B5 W5 B6 W6 B7 W7",
      "F0 F1 F2 F3 F4 f0 F5 f1 b0 w0 f2 b1 w1 f3 b2 w2 F6 B0 W0 f4 b3 w3 F7 B1 W1 f5 b4 w4 B2 W2 f6 b5 w5 B3 W3 f7 "
      "b6 w6 B4 b7 B5 W4 B6 W5 B7 W6 w7 W7",
      "F0 F1 F2 f0 F3 f1 F4 f2 b0 w0 f3 b1 w1 F5 B0 W0 f4 b2 w2 F6 B1 W1 f5 b3 w3 F7 B2 W2 f6 b4 w4 B3 W3 f7 b5 w5 "
      "B4 b6 B5 b7 B6 W4 B7 W5 w6 w7 W6 W7",
      "F0 f0 F1 f1 F2 f2 F3 f3 b0 w0 F4 B0 W0 f4 b1 w1 F5 B1 W1 f5 b2 w2 F6 B2 W2 f6 b3 w3 F7 B3 W3 f7 b4 w4 B4 b5 "
      "B5 b6 B6 b7 B7 W4 w5 w6 w7 W5 W6 W7",
  };
  Schedule s = generate("zb-v", 4, 8);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rank_ops(s, r), from_case(expected[r])) << "rank " << r;
}

TEST(Golden, StpOffloadMarkersFollowTheRule) {
  // docs/schedules.md, STP op lists, Offload markers: rank 0, p=2: "F0.5&W1.1, reload 0.1, F1.3&B1.2, F0.6&B0.1";
  // chunk-0 forwards are offloaded.
  Schedule s = generate("stp", 2, 9);
  const auto& ops = s.ranks[0];
  ASSERT_EQ(to_string(ops[7]), "F1.3&B1.2");
  ASSERT_EQ(ops[7].reload.size(), 1u);
  EXPECT_EQ(ops[7].reload[0], (ChunkMb{0, 1}));
  for (const Op& op : ops) {
    if (op.a.pass != Pass::F) continue;
    EXPECT_EQ(op.a.offload, op.a.chunk == 0) << to_string(op);
  }
}
