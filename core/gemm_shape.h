// What of a GEMM decides its algorithm, and the records a trainer keeps of them.
//
// GemmShape: the descriptor cuBLASLt chooses an algorithm for (core/cuda/lt_gemm.h): the
// transposes, m, n, k, the leading dimensions, the types, and the alignment of the three pointers
// as the allocator gave them (the largest power of two up to 256 dividing the address; a null
// pointer stands for 256, the arena's alignment: memory/block_arena.h). alpha, beta and the
// addresses themselves are not part of it. Every device allocation is 256-byte aligned on every
// backend (cudaMalloc; CpuDevice and its dry run likewise), so a pointer at a given offset of an
// allocation has the same alignment in a dry run, on the CPU backend and on a GPU.
//
// GemmLog: the shapes a stream's GEMMs had, in enqueue order (Stream::set_gemm_log). Thread-safe.
//
// GemmChoices: the shapes a device has chosen an algorithm for, prepared at setup or chosen by a
// GEMM itself (a late choice). cuBLASLt's cache behaves so on a GPU; the CPU backend keeps one per
// device so that it counts exactly the late choices the GPU would make (Device::late_gemm_choices).
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"

namespace stp {

struct GemmShape {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  DType ab = DType::F32, c_type = DType::F32;
  std::uint32_t align_a = 256, align_b = 256, align_c = 256;  // bytes, powers of two up to 256
  auto tie() const { return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab, c_type, align_a, align_b, align_c); }
  bool operator<(const GemmShape& o) const { return tie() < o.tie(); }
  bool operator==(const GemmShape& o) const { return tie() == o.tie(); }
};

// The largest power of two up to 256 dividing `p`'s address; 256 for a null pointer.
std::uint32_t gemm_alignment(const void* p);
GemmShape gemm_shape_of(const GemmArgs& g);
// "m 64 n 96 k 32 lda 32 ldb 96 ldc 96 NN f32->f32 align 256/256/256", for messages and tests.
std::string to_string(const GemmShape& s);
// Whether a GEMM of `g` reaches the library (cuBLASLt): m, n and k all positive. Stream::gemm
// returns at once for m or n 0 and scales C for k 0 (core/kernels/gemm_kernels.h).
inline bool runs_library_gemm(const GemmArgs& g) { return g.m > 0 && g.n > 0 && g.k > 0; }

class GemmLog {
 public:
  void add(const GemmShape& s);
  std::vector<GemmShape> shapes() const;  // in the order added, repeats included
  std::set<GemmShape> distinct() const;
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::vector<GemmShape> shapes_;
};

class GemmChoices {
 public:
  void prepare(const GemmShape& s);  // chosen at setup (Stream::prepare_gemm)
  bool run(const GemmShape& s);      // a GEMM runs: true when its shape was not chosen yet (a late choice)
  std::size_t chosen() const;        // distinct shapes chosen so far

 private:
  mutable std::mutex mu_;
  std::set<GemmShape> chosen_;
};

}  // namespace stp
