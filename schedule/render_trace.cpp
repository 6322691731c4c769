// Chrome trace renderer (docs/design.md, Files; trace shape: pid = rank, tid = stream). One time unit = 1 ms.
#include "base/error.h"
#include "schedule/render.h"

namespace stp::sched {

std::string render_trace(const Schedule& s, const SimResult& r, const Costs& c) {
  static const char* kPass[] = {"F", "B", "W"};
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  auto event = [&](const std::string& body) {
    out += first ? "\n" : ",\n";
    out += body;
    first = false;
  };
  for (int k = 0; k < s.pp; ++k) {
    event(str("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", k, ",\"args\":{\"name\":\"rank ", k, "\"}}"));
    event(str("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", k, ",\"tid\":0,\"args\":{\"name\":\"compute\"}}"));
    event(str("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", k, ",\"tid\":1,\"args\":{\"name\":\"tp-comm\"}}"));
    for (std::size_t i = 0; i < s.ranks[k].size(); ++i) {
      const Op& op = s.ranks[k][i];
      for (const Segment& seg : op_segments(op, c, r.times[k][i].start)) {
        const Part& p = op.part(seg.part);
        std::string name = seg.stream == 0 ? str(kPass[static_cast<int>(seg.pass)], p.chunk, ".", p.mb)
                                           : str("AR ", kPass[static_cast<int>(seg.pass)], p.chunk, ".", p.mb);
        event(str("{\"name\":\"", name, "\",\"cat\":\"", to_string(op), "\",\"ph\":\"X\",\"pid\":", k,
                  ",\"tid\":", seg.stream, ",\"ts\":", format_number(seg.start * 1000),
                  ",\"dur\":", format_number((seg.end - seg.start) * 1000), "}"));
      }
    }
  }
  return out + "\n],\"displayTimeUnit\":\"ms\"}\n";
}

}  // namespace stp::sched
