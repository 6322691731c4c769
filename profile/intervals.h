// Time sets as sorted, disjoint [a, b) intervals — the algebra the overlap report is made of:
// "exposed all-reduce time" is |allreduce \ compute|, "hidden copy time" is |copy ∩ compute|, and
// so on. Every operation is linear in its inputs (after unite's sort).
#pragma once

#include <vector>

namespace stp::profile {

struct Interval {
  double a = 0, b = 0;  // a <= b
};
using Intervals = std::vector<Interval>;  // sorted by a, disjoint, no empty interval

Intervals unite(std::vector<Interval> v);                 // any intervals -> canonical
Intervals unite(const Intervals& x, const Intervals& y);  // canonical inputs
Intervals intersect(const Intervals& x, const Intervals& y);
Intervals subtract(const Intervals& x, const Intervals& y);  // x \ y
Intervals clip(const Intervals& x, double a, double b);      // x ∩ [a, b)
double length(const Intervals& x);
// |x ∩ [a, b)| without building the clipped set (binary search, then the overlapping intervals).
double covered(const Intervals& x, double a, double b);

}  // namespace stp::profile
