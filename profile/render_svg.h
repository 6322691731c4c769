// `stp profile --svg`: one step of a traced run as a timeline picture in the visual language of
// the paper's schedule figures (schedule/svg_style.h). Per rank, rows for
//   compute   unit spans coloured by chunk and pass; each op outlined, braided blocks showing their
//             interleaved units, labelled like the paper ("5", "5&4", "9&w", "7+8", "4*");
//   TP        all-reduces, coloured by the part that produced them;
//   P2P       sends (dark) and receives (light; a receive's span includes its wait for the sender);
//   D2H, H2D  offload and reload copies;
//   memory    live device bytes stacked by category (the allocator's counters), peak marked;
// on one time axis (ms from the step's first compute unit); legend at the bottom.
// Readable for 4 ranks × 16 microbatches (~100 ops per rank over 1400 px).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profile/timeline.h"

namespace stp::profile {

// `step`: the step to draw (must be in the trace); `title`: the headline (e.g. run, schedule);
// `tp` > 0 labels each rank with its pp and tp rank (global rank = pp · tp + tp rank).
std::string render_timeline_svg(const Trace& trace, const std::vector<RankTimeline>& ranks, std::int64_t step,
                                const std::string& title, int tp = 0);

}  // namespace stp::profile
