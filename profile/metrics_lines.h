// The lines of a run's metrics.jsonl (docs/design.md, Files), one JSON object each, for the
// readers of profile/ (`stp plot`, `stp profile`).
//
// Blank lines are skipped. A run stopped while it wrote a line (kill -9, a full disk) leaves the
// file's last line cut: no newline after it, and not a whole JSON value. That line is left out and
// its number returned, so that every line before it still counts. Anything else that does not
// read is an stp::Error naming the file and the line: malformed JSON (with its column, in stp's
// words), or the stp::Error `each` throws for a line (prefixed with the line).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace stp::profile {

// Calls `each` with every whole line, in file order; returns the number of the cut last line, or
// 0 when the file ends with a whole line.
int read_metrics_lines(const std::string& path, const std::function<void(nlohmann::json&)>& each);

}  // namespace stp::profile
