// The trace vocabulary, defined once: every name that the writers of a trace (the streams of a
// rank, the arena and pinned pool counters, the offload engine, the executor, the optimizers, the
// schedule's own trace renderer) and its readers (`stp profile`, profile/) must agree on. The
// exported format itself is base/trace.h's (docs/design.md, Files); what `stp profile` reads from it
// is docs/profile.md.
//
// A name is a constant `const char` array (or a reference to one): it converts to std::string and
// std::string_view and compares by value with either. No stream or counter-track name is spelled
// in any other source file outside tests/: tools/checks/check_trace_names.py (CTest
// tools.trace_names_test) reads the stream and track blocks below and reports any such spelling.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stp::trace {

// Streams: the name a device stream is created with (Device::create_stream) and the stream a span
// is recorded on ("tid": Stream::set_trace). The first five have fixed tids 1..5 in this order
// (known_stream_tid, base/trace.h); `stp profile` analyses those five and keeps the others.
namespace stream {
inline constexpr char kCompute[] = "compute";             // units, ops, steps
inline constexpr char kTpComm[] = "tp-comm";              // TP all-reduces
inline constexpr char kP2p[] = "p2p";                     // pipeline sends and receives, every channel
inline constexpr char kD2h[] = "d2h";                     // activation offload
inline constexpr char kH2d[] = "h2d";                     // activation reload
inline constexpr char kDpComm[] = "dp-comm";              // data-parallel all-reduce, reduce-scatter, all-gather
inline constexpr char kOptimizerD2h[] = "optimizer-d2h";  // CPU AdamW: gradients down
inline constexpr char kOptimizerH2d[] = "optimizer-h2d";  // CPU AdamW: parameters up
inline constexpr char kOptimizerCpu[] = "optimizer-cpu";  // CPU AdamW: the update
inline constexpr char kParamCopy[] = "param-copy";        // parameter streaming: weights up, gradients both ways
}  // namespace stream

// The device stream of one pipeline channel, "p2p <channel>" (e.g. "p2p activations 0->1"); its
// spans are recorded on stream::kP2p.
inline std::string p2p_channel_stream(std::string_view channel) {
  return std::string(stream::kP2p) + ' ' + std::string(channel);
}

// Counter tracks ("C" events, TraceCounter::name).
namespace track {
inline constexpr char kDeviceMemory[] = "device memory";  // BlockArena: live device bytes by category
inline constexpr char kPinnedMemory[] = "pinned memory";  // PinnedPool: live pinned bytes by category
}  // namespace track

// The series of both memory tracks: one per MemoryCategory, in its order (memory/block_arena.h).
inline constexpr const char* kMemorySeries[] = {"weights", "gradients", "optimizer_state", "activations", "buffers"};

// Span categories ("cat"). `stp profile` tells compute spans apart by them: F, B, W units, ops
// (the units of one op nest inside it) and steps.
namespace cat {
inline constexpr char kForward[] = "F";            // a unit's forward
inline constexpr char kBackward[] = "B";           // a unit's input-gradient backward
inline constexpr char kWeight[] = "W";             // a unit's weight-gradient backward
inline constexpr char kOp[] = "op";                // one op of the rank's op list
inline constexpr char kStep[] = "step";            // one training step on the device
inline constexpr char kParams[] = "params";        // a chunk's parameters made ready before its first op
inline constexpr char kOptimizer[] = "optimizer";  // the CPU AdamW's download, update and upload
// Spans on the communication and copy streams take their stream's name as category.
inline constexpr const auto& kTpComm = stream::kTpComm;
inline constexpr const auto& kP2p = stream::kP2p;
inline constexpr const auto& kD2h = stream::kD2h;
inline constexpr const auto& kH2d = stream::kH2d;
inline constexpr const auto& kDpComm = stream::kDpComm;
}  // namespace cat

// Span names that a reader parses: "step <n>" on compute, "send <message>" and "recv <message>" on
// p2p (<message> as sched::to_string prints it).
namespace span {
inline constexpr char kStep[] = "step";
inline constexpr char kSend[] = "send";
inline constexpr char kRecv[] = "recv";
}  // namespace span
inline std::string step_span(std::int64_t step) { return std::string(span::kStep) + ' ' + std::to_string(step); }
inline std::string send_span(std::string_view message) { return std::string(span::kSend) + ' ' + std::string(message); }
inline std::string recv_span(std::string_view message) { return std::string(span::kRecv) + ' ' + std::string(message); }

// Span argument keys ("args", TraceArgs in base/trace.h).
namespace arg {
inline constexpr char kPart[] = "part";      // string: the op part of a unit or TP all-reduce ("F0.3", "B1.2*")
inline constexpr char kUnit[] = "unit";      // integer: the unit within its chunk
inline constexpr char kMb[] = "mb";          // integer: the microbatch
inline constexpr char kChunk[] = "chunk";    // integer: the model chunk
inline constexpr char kPass[] = "pass";      // string: F, B or W
inline constexpr char kBytes[] = "bytes";    // integer: bytes copied or reduced
inline constexpr char kWeight[] = "weight";  // bool: a unit's W-only records (offload and reload)
inline constexpr char kGroup[] = "group";    // integer: the CPU AdamW's group (a chunk)
}  // namespace arg

}  // namespace stp::trace
