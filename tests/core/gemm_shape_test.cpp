// GEMM shapes (core/gemm_shape.h): the descriptor a GEMM's algorithm is chosen for, the stream
// hook that records them (Stream::set_gemm_log) and the late choices a device counts for shapes
// nobody prepared (Device::late_gemm_choices), on the CPU backend and its dry run.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/gemm_shape.h"

namespace {

void* at(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

TEST(GemmShape, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(stp::gemm_alignment(nullptr), 256u);  // a prepared shape: the arena's alignment
  EXPECT_EQ(stp::gemm_alignment(at(0x10000)), 256u);
  EXPECT_EQ(stp::gemm_alignment(at(0x10080)), 128u);
  EXPECT_EQ(stp::gemm_alignment(at(0x10040)), 64u);
  EXPECT_EQ(stp::gemm_alignment(at(0x10002)), 2u);
  EXPECT_EQ(stp::gemm_alignment(at(0x10001)), 1u);
}

TEST(GemmShape, DescribesEverythingButScalarsAndAddresses) {
  stp::GemmArgs g;
  g.trans_b = true;
  g.m = 2, g.n = 3, g.k = 4;
  g.lda = 4, g.ldb = 4, g.ldc = 3;
  g.a = at(0x20000), g.b = at(0x20100 + 8), g.c = at(0x30000 + 64);
  g.alpha = 0.5f;
  const stp::GemmShape s = stp::gemm_shape_of(g);
  EXPECT_EQ(stp::to_string(s), "m 2 n 3 k 4 lda 4 ldb 4 ldc 3 NT f32->f32 align 256/8/64");
  stp::GemmArgs h = g;
  h.alpha = 2.0f, h.beta = 1.0f;
  h.a = at(0x50000);  // another address with the same alignment
  EXPECT_EQ(stp::gemm_shape_of(h), s);
  h.c = at(0x30000 + 128);
  EXPECT_FALSE(stp::gemm_shape_of(h) == s);
}

TEST(GemmShape, EveryDeviceAllocationIsAlignedAsCudaMallocs) {
  for (bool dry : {false, true}) {
    stp::CpuDeviceOptions o;
    o.dry_run = dry;
    stp::CpuDevice dev(0, o);
    std::vector<void*> ptrs;
    for (std::size_t bytes : {1, 3, 100, 257, 4096}) {
      ptrs.push_back(dev.allocate(bytes));
      EXPECT_EQ(stp::gemm_alignment(ptrs.back()), 256u) << (dry ? "dry run, " : "") << bytes << " bytes";
    }
    for (void* p : ptrs) dev.deallocate(p);
  }
}

// A GEMM of m x n x k f32 on `s` over buffers of `dev` (values irrelevant: zeros).
struct Buffers {
  stp::Device& dev;
  void *a, *b, *c;
  Buffers(stp::Device& d, int m, int n, int k)
      : dev(d),
        a(d.allocate(sizeof(float) * static_cast<std::size_t>(m * k + 1))),
        b(d.allocate(sizeof(float) * static_cast<std::size_t>(k * n + 1))),
        c(d.allocate(sizeof(float) * static_cast<std::size_t>(m * n + 1))) {}
  ~Buffers() {
    dev.deallocate(a);
    dev.deallocate(b);
    dev.deallocate(c);
  }
};

stp::GemmArgs product(const Buffers& buf, int m, int n, int k) {
  stp::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.lda = k, g.ldb = n, g.ldc = n;
  g.a = buf.a, g.b = buf.b, g.c = buf.c;
  return g;
}

TEST(GemmShape, StreamsRecordTheGemmsThatReachTheLibrary) {
  for (bool dry : {false, true}) {
    stp::CpuDeviceOptions o;
    o.dry_run = dry;
    stp::CpuDevice dev(0, o);
    auto s = dev.create_stream("compute");
    Buffers buf(dev, 4, 4, 4);
    for (void* p : {buf.a, buf.b, buf.c}) s->zero(p, sizeof(float) * 17);
    stp::GemmLog log;
    s->gemm(product(buf, 4, 4, 4));  // before the log is set: not recorded
    s->set_gemm_log(&log);
    s->gemm(product(buf, 4, 4, 4));
    s->gemm(product(buf, 2, 4, 4));
    s->gemm(product(buf, 4, 4, 0));  // k 0: C scaled by beta, no library GEMM
    s->gemm(product(buf, 0, 4, 4));  // nothing to do
    stp::GemmArgs offset = product(buf, 4, 4, 4);
    offset.a = static_cast<const float*>(buf.a) + 1;  // 4-byte aligned
    s->gemm(offset);
    s->gemm(product(buf, 4, 4, 4));
    s->set_gemm_log(nullptr);
    s->gemm(product(buf, 3, 4, 4));
    s->synchronize();
    const std::vector<stp::GemmShape> got = log.shapes();
    ASSERT_EQ(got.size(), 4u) << (dry ? "dry run" : "CPU");
    EXPECT_EQ(got[0], stp::gemm_shape_of(product(buf, 4, 4, 4)));
    EXPECT_EQ(got[1].m, 2);
    EXPECT_EQ(got[2].align_a, 4u);
    EXPECT_EQ(got[3], got[0]);
    EXPECT_EQ(log.distinct().size(), 3u);
  }
}

TEST(GemmShape, ADeviceCountsTheShapesNobodyPrepared) {
  stp::CpuDevice dev(0, {});
  auto s = dev.create_stream("compute");
  auto other = dev.create_stream("other");
  Buffers buf(dev, 8, 8, 8);
  for (void* p : {buf.a, buf.b, buf.c}) s->zero(p, sizeof(float) * 65);
  s->synchronize();
  s->prepare_gemm(stp::gemm_shape_of(product(buf, 8, 8, 8)));
  s->prepare_gemm(stp::gemm_shape_of(product(buf, 4, 8, 8)));
  s->gemm(product(buf, 8, 8, 8));
  s->gemm(product(buf, 4, 8, 8));
  EXPECT_EQ(dev.late_gemm_choices(), 0u);
  s->gemm(product(buf, 2, 8, 8));  // not prepared: chosen by the GEMM itself
  EXPECT_EQ(dev.late_gemm_choices(), 1u);
  s->gemm(product(buf, 2, 8, 8));  // chosen once per device
  other->gemm(product(buf, 2, 8, 8));
  other->gemm(product(buf, 8, 8, 8));  // prepared on another stream of the device
  EXPECT_EQ(dev.late_gemm_choices(), 1u);
  stp::GemmArgs shifted = product(buf, 8, 8, 8);
  shifted.c = static_cast<float*>(buf.c) + 1;  // another alignment is another choice
  s->gemm(shifted);
  EXPECT_EQ(dev.late_gemm_choices(), 2u);
  s->synchronize();
  other->synchronize();
  EXPECT_EQ(dev.gemm_choices().chosen(), 4u);
}

}  // namespace
