#include "profile/intervals.h"

#include <algorithm>

namespace stp::profile {

Intervals unite(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
  Intervals out;
  for (const Interval& i : v) {
    if (i.b <= i.a) continue;
    if (!out.empty() && i.a <= out.back().b) out.back().b = std::max(out.back().b, i.b);
    else out.push_back(i);
  }
  return out;
}

Intervals unite(const Intervals& x, const Intervals& y) {
  Intervals all;
  all.reserve(x.size() + y.size());
  std::merge(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(all),
             [](const Interval& p, const Interval& q) { return p.a < q.a; });
  Intervals out;
  for (const Interval& i : all) {
    if (!out.empty() && i.a <= out.back().b) out.back().b = std::max(out.back().b, i.b);
    else out.push_back(i);
  }
  return out;
}

Intervals intersect(const Intervals& x, const Intervals& y) {
  Intervals out;
  std::size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    double a = std::max(x[i].a, y[j].a), b = std::min(x[i].b, y[j].b);
    if (a < b) out.push_back({a, b});
    if (x[i].b < y[j].b) ++i;
    else ++j;
  }
  return out;
}

Intervals subtract(const Intervals& x, const Intervals& y) {
  Intervals out;
  std::size_t j = 0;
  for (const Interval& iv : x) {
    double cur = iv.a;
    while (j < y.size() && y[j].b <= cur) ++j;
    std::size_t k = j;
    while (k < y.size() && y[k].a < iv.b) {
      if (y[k].a > cur) out.push_back({cur, y[k].a});
      cur = std::max(cur, y[k].b);
      if (cur >= iv.b) break;
      ++k;
    }
    if (cur < iv.b) out.push_back({cur, iv.b});
  }
  return out;
}

Intervals clip(const Intervals& x, double a, double b) {
  Intervals out;
  auto it = std::lower_bound(x.begin(), x.end(), a, [](const Interval& i, double t) { return i.b <= t; });
  for (; it != x.end() && it->a < b; ++it) {
    double s = std::max(it->a, a), e = std::min(it->b, b);
    if (s < e) out.push_back({s, e});
  }
  return out;
}

double length(const Intervals& x) {
  double t = 0;
  for (const Interval& i : x) t += i.b - i.a;
  return t;
}

double covered(const Intervals& x, double a, double b) {
  auto it = std::lower_bound(x.begin(), x.end(), a, [](const Interval& i, double t) { return i.b <= t; });
  double t = 0;
  for (; it != x.end() && it->a < b; ++it) t += std::min(b, it->b) - std::max(a, it->a);
  return t;
}

}  // namespace stp::profile
