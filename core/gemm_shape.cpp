#include "core/gemm_shape.h"

#include <algorithm>

#include "base/error.h"

namespace stp {

std::uint32_t gemm_alignment(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(a & (~a + 1), 256));
}

GemmShape gemm_shape_of(const GemmArgs& g) {
  return GemmShape{
      g.trans_a,           g.trans_b,          g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.ab, g.c_type, gemm_alignment(g.a),
      gemm_alignment(g.b), gemm_alignment(g.c)};
}

std::string to_string(const GemmShape& s) {
  return str("m ", s.m, " n ", s.n, " k ", s.k, " lda ", s.lda, " ldb ", s.ldb, " ldc ", s.ldc, " ",
             s.trans_a ? "T" : "N", s.trans_b ? "T" : "N", " ", to_string(s.ab), "->", to_string(s.c_type), " align ",
             s.align_a, "/", s.align_b, "/", s.align_c);
}

void GemmLog::add(const GemmShape& s) {
  std::lock_guard<std::mutex> lock(mu_);
  shapes_.push_back(s);
}

std::vector<GemmShape> GemmLog::shapes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shapes_;
}

std::set<GemmShape> GemmLog::distinct() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {shapes_.begin(), shapes_.end()};
}

std::size_t GemmLog::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shapes_.size();
}

void GemmChoices::prepare(const GemmShape& s) {
  std::lock_guard<std::mutex> lock(mu_);
  chosen_.insert(s);
}

bool GemmChoices::run(const GemmShape& s) {
  std::lock_guard<std::mutex> lock(mu_);
  return chosen_.insert(s).second;
}

std::size_t GemmChoices::chosen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chosen_.size();
}

void Stream::note_gemm(const GemmArgs& g) {
  if (gemm_log_ && runs_library_gemm(g)) gemm_log_->add(gemm_shape_of(g));
}

}  // namespace stp
