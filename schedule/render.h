// Renderers of a simulated schedule. Each returns the whole document as a string (the caller prints or
// writes it at once, so output is complete or absent).
//
//   render_text   summary table per rank, an ASCII Gantt chart and each rank's op list
//   render_json   docs/design.md, Files: {"schedule","pp","microbatches","makespan","ranks":[{"rank","span","busy",
//                 "pp_bubble","tp_exposed","peak_activation"}],"ops":[[op strings of rank 0], …]}
//   render_svg    one row per rank, colour per chunk and pass, braided blocks drawn as their interleaved
//                 units, TP all-reduces as a thin lane under each row, legend and time axis
//   render_trace  Chrome Trace Event Format: "X" events, pid = rank, tid 0 = compute, 1 = tp-comm
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "schedule/schedule.h"
#include "schedule/simulator.h"

namespace stp::sched {

std::string render_text(const Schedule& s, const SimResult& r, int width = 120);
std::string render_json(const Schedule& s, const SimResult& r);
std::string render_svg(const Schedule& s, const SimResult& r, const Costs& c);
std::string render_trace(const Schedule& s, const SimResult& r, const Costs& c);

// A number the way the renderers print it: integers without a fraction, others with up to 6 significant digits.
std::string format_number(double v);
// The same number as a JSON value (written with the same digits by nlohmann-json).
nlohmann::ordered_json number_json(double v);

}  // namespace stp::sched
