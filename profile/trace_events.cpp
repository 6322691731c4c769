#include "profile/trace_events.h"

#include "base/trace_names.h"

namespace stp::profile {

const char* to_string(Lane lane) {
  switch (lane) {
    case Lane::Compute: return trace::stream::kCompute;
    case Lane::TpComm: return trace::stream::kTpComm;
    case Lane::P2p: return trace::stream::kP2p;
    case Lane::D2h: return trace::stream::kD2h;
    case Lane::H2d: return trace::stream::kH2d;
    case Lane::Other: break;
  }
  return "other";
}

Lane lane_of_stream(const std::string& name) {
  for (Lane l : {Lane::Compute, Lane::TpComm, Lane::P2p, Lane::D2h, Lane::H2d})
    if (name == to_string(l)) return l;
  return Lane::Other;
}

Kind kind_of_category(const std::string& cat) {
  if (cat == trace::cat::kForward) return Kind::F;
  if (cat == trace::cat::kBackward) return Kind::B;
  if (cat == trace::cat::kWeight) return Kind::W;
  if (cat == trace::cat::kOp) return Kind::Op;
  if (cat == trace::cat::kStep) return Kind::Step;
  return Kind::Other;
}

std::uint32_t Trace::find(const std::string& s) const {
  for (std::uint32_t i = 0; i < strings.size(); ++i)
    if (strings[i] == s) return i;
  return 0;
}

double Trace::total(const Counter& c) const {
  double t = 0;
  for (std::uint32_t i = c.begin; i < c.end; ++i) t += values[i].second;
  return t;
}

}  // namespace stp::profile
