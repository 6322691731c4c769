// Op vocabulary of every pipeline schedule: what one rank runs next, as plain data.
//
// An op is one compute instruction of one rank. It holds one or two *parts*; a part is one pass (F, B or W)
// of one local chunk for one microbatch. Two parts make a braided block whose units interleave on the compute
// stream so that each TP all-reduce of one part hides under a unit of the other (docs/schedules.md, STP op lists):
//
//   kind  parts        op string (design.md)      meaning
//   F     F            F0.3                      forward of local chunk 0, microbatch 3 (microbatches are 1-based)
//   B     B            B1.4 / B1.4*              backward; `*` = weight gradient deferred (a later W consumes it)
//   W     W            W1.4                      the deferred weight gradient of B1.4*
//   FB    F, B         F1.5&B1.4 / F1.5&B1.4*    braided forward and backward (any chunks, different microbatches)
//   FW    F, W         F0.9&W1.2                 forward braided with the deferred W of B1.2*
//   FF    F, F         F0.7+F0.8                 two forwards of the same chunk, braided
//
// A W names the chunk and microbatch it consumes, so a W op is self-describing: the executor needs no
// FIFO bookkeeping of its own, and the validator checks that every deferred W is consumed exactly once.
//
// Offload markers (docs/schedules.md, STP op lists, Offload markers) ride on the op: `Part::offload` on a forward part
// says "move this forward's saved activations to host as they are produced"; `Op::reload` lists the chunk-microbatch
// activation sets whose host-to-device copy starts right before this op (one op ahead of the backward that needs them).
// They are hints for the offload engine; a run without offload ignores them, and they never change the op order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stp::sched {

enum class Pass : std::uint8_t { F, B, W };

struct Part {
  Pass pass = Pass::F;
  int chunk = 0;         // local chunk on this rank (0 or 1 for two-chunk schedules)
  int mb = 0;            // microbatch, 1-based
  bool defer_w = false;  // B only: the weight gradient is deferred to a later W / F&W
  bool offload = false;  // F only: offload this forward's activations to host
  bool operator==(const Part&) const = default;
};

enum class OpKind : std::uint8_t { F, B, W, FB, FW, FF };

struct ChunkMb {
  int chunk = 0;
  int mb = 0;
  bool operator==(const ChunkMb&) const = default;
};

struct Op {
  OpKind kind = OpKind::F;
  Part a;                       // the F of F/FB/FW/FF, the B of B, the W of W
  Part b;                       // FB: the B; FW: the W; FF: the second F; unused for single-part ops
  std::vector<ChunkMb> reload;  // activation sets to start reloading before this op (offload hint)

  static Op f(int chunk, int mb);
  static Op bwd(int chunk, int mb, bool defer_w);
  static Op w(int chunk, int mb);
  static Op fb(int f_chunk, int f_mb, int b_chunk, int b_mb, bool defer_w);
  static Op fw(int f_chunk, int f_mb, int w_chunk, int w_mb);
  static Op ff(int chunk, int mb1, int mb2);

  int n_parts() const { return kind == OpKind::F || kind == OpKind::B || kind == OpKind::W ? 1 : 2; }
  const Part& part(int i) const { return i == 0 ? a : b; }
  Part& part(int i) { return i == 0 ? a : b; }
  bool braided() const { return n_parts() == 2; }
};

// "F0.3", "B1.4*", "F1.5&B1.4", "F0.9&W1.2", "F0.7+F0.8" (markers are not part of the string).
std::string to_string(const Op& op);
std::string to_string(const Part& part);
// Parses an op string; throws stp::Error naming the text on anything malformed.
Op parse_op(std::string_view text);
// Ops of one rank separated by spaces, e.g. "F0.1 F0.2 F1.1&B1.1".
std::string join_ops(const std::vector<Op>& ops);
std::vector<Op> parse_ops(std::string_view text);

}  // namespace stp::sched
