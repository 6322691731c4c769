// HostUpdate (optimizer offload) on the CPU backend:
//   * step() only enqueues: with the optimizer-cpu stream held by a task the test releases later,
//     step() returns, the device parameters are untouched and the upload is not done; once
//     released, settle() leaves the parameters and moments bitwise those of cpu_adamw_update run
//     directly (the device kernel's arithmetic, tests/optim/cpu_adamw_test.cpp);
//   * a host master (bf16 copy on the device) is updated in place on the host and its copy is
//     uploaded as its from_f32<bf16> rounding;
//   * the clip coefficient scales an early download (the unclipped gradient) with one multiply;
//   * speculation (set_speculative): an early group's update run at its download into shadows is
//     committed when the coefficient is 1 and discarded (the update redone from the kept state)
//     when it is not, and dropped by a skipped step; the state is bitwise cpu_adamw_update's in
//     every case, for a device master and a host master;
//   * a direct group (set_direct: parameters, gradients and bf16 copies in pinned host memory, as
//     parameter streaming keeps them) gives the same bits with and without speculation, reading
//     the clipped gradients in place, writing the bf16 rounding into the host copy, and allocating
//     and copying nothing beyond its state (and shadows).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "optim/cpu_adamw.h"
#include "optim/host_update.h"
#include "tests/support/events.h"

namespace {

using namespace std::chrono_literals;
using stp::bf16;

constexpr std::size_t kN = 100003;  // several oneTBB blocks and a tail

std::vector<float> ramp(std::size_t n, float a, float b) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = a + b * static_cast<float>((i * 7919) % 1000) / 1000.0f;
  return x;
}

// One rank: a device, its compute stream, device tensors for p and g, and a HostUpdate.
struct Rig {
  stp::CpuDevice dev{0, {}};
  std::unique_ptr<stp::Stream> compute = dev.create_stream("compute");
  stp::DeviceAllocator device_alloc{dev};
  stp::DeviceAllocator pinned_alloc{dev, /*pinned_host=*/true};
  stp::HostUpdate host{dev, *compute, 1, /*dry=*/false};

  // Copies host values into a device tensor through the compute stream.
  void put(stp::Tensor& t, const void* src) {
    compute->copy(t.raw(), src, t.bytes());
    compute->synchronize();
  }
  template <typename T>
  std::vector<T> get(const stp::Tensor& t) {
    std::vector<T> out(t.bytes() / sizeof(T));
    compute->copy(out.data(), t.raw(), t.bytes());
    compute->synchronize();
    return out;
  }
};

const stp::AdamWHyper kHyper{0.9f, 0.95f, 1e-8f, 0.1f};

TEST(HostUpdate, StepOnlyEnqueuesAndTheUpdateIsTheKernels) {
  Rig r;
  const std::vector<float> p0 = ramp(kN, -1.0f, 2.0f), g0 = ramp(kN, -0.01f, 0.02f);
  stp::Tensor p = stp::Tensor::empty(r.device_alloc, {static_cast<std::int64_t>(kN)});
  stp::Tensor g = stp::Tensor::empty(r.device_alloc, {static_cast<std::int64_t>(kN)});
  stp::Tensor m = stp::Tensor::empty(r.host.allocator(), {static_cast<std::int64_t>(kN)});
  stp::Tensor v = stp::Tensor::empty(r.host.allocator(), {static_cast<std::int64_t>(kN)});
  r.put(p, p0.data());
  r.put(g, g0.data());
  std::memset(m.raw(), 0, m.bytes());
  std::memset(v.raw(), 0, v.bytes());
  r.host.add(0, p.f32(), g.f32(), m.f32(), v.f32(), kN, /*decay=*/true);

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  r.host.cpu().enqueue_host([released] { released.wait(); });  // holds the CPU updates back
  r.host.begin_step(1e-3f, kHyper, 1);
  r.host.step(1e-3f, kHyper, 1);  // returns although no update can run yet
  EXPECT_FALSE(stp::testing::completes_within(r.host.uploaded(0), 50ms)) << "the upload ran before the update";
  EXPECT_TRUE(r.host.pending(0));
  EXPECT_EQ(r.get<float>(p), p0) << "the device parameters changed before the update ran";
  release.set_value();
  r.host.settle();
  EXPECT_TRUE(r.host.uploaded(0).query());

  std::vector<float> ep = p0, em(kN, 0.0f), ev(kN, 0.0f);
  stp::cpu_adamw_update(ep.data(), g0.data(), em.data(), ev.data(), kN, stp::adamw_scalars(1e-3f, kHyper, 1, true));
  const std::vector<float> got = r.get<float>(p);
  EXPECT_EQ(std::memcmp(got.data(), ep.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(m.f32(), em.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(v.f32(), ev.data(), kN * sizeof(float)), 0);
  EXPECT_NE(got, p0);
}

TEST(HostUpdate, HostMasterUploadsItsBf16RoundingAndEarlyCopiesTakeTheClip) {
  Rig r;
  r.host.set_early(0, true);
  const std::vector<float> p0 = ramp(kN, 0.5f, 1.0f), g0 = ramp(kN, -2.0f, 4.0f);
  stp::Tensor master = stp::Tensor::empty(r.host.allocator(), {static_cast<std::int64_t>(kN)});
  stp::Tensor copy = stp::Tensor::empty(r.device_alloc, {static_cast<std::int64_t>(kN)}, stp::DType::Bf16);
  stp::Tensor g = stp::Tensor::empty(r.device_alloc, {static_cast<std::int64_t>(kN)});
  stp::Tensor m = stp::Tensor::empty(r.host.allocator(), {static_cast<std::int64_t>(kN)});
  stp::Tensor v = stp::Tensor::empty(r.host.allocator(), {static_cast<std::int64_t>(kN)});
  std::memcpy(master.raw(), p0.data(), master.bytes());
  r.put(g, g0.data());
  std::memset(m.raw(), 0, m.bytes());
  std::memset(v.raw(), 0, v.bytes());
  r.host.add(0, master.f32(), g.f32(), m.f32(), v.f32(), kN, /*decay=*/false, copy.as<bf16>());

  const float coef = 0.25f;
  r.host.begin_step(2e-3f, kHyper, 3);
  r.host.grads_final(0);  // the early download: the unclipped gradient
  r.host.order_after_downloads(*r.compute);
  r.host.set_clip_coefficient(coef);
  r.host.step(2e-3f, kHyper, 3);
  r.host.settle();

  std::vector<float> ep = p0, eg = g0, em(kN, 0.0f), ev(kN, 0.0f);
  for (float& x : eg) x *= coef;
  stp::cpu_adamw_update(ep.data(), eg.data(), em.data(), ev.data(), kN, stp::adamw_scalars(2e-3f, kHyper, 3, false));
  EXPECT_EQ(std::memcmp(master.f32(), ep.data(), kN * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(m.f32(), em.data(), kN * sizeof(float)), 0);
  const std::vector<bf16> got = r.get<bf16>(copy);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < kN; ++i) {
    const bf16 want = stp::from_f32<bf16>(ep[i]);
    wrong += std::memcmp(&got[i], &want, sizeof(bf16)) != 0;
  }
  EXPECT_EQ(wrong, 0u);
}

// Two spans in one early group, a device master and a host master, updated with speculation:
// step 1 commits (coefficient 1), step 2 discards (coefficient 0.5, the device gradient clipped in
// place as GradClipper does), step 3 is skipped (its speculation dropped), step 3 again commits.
// direct: the group is direct (its "device" tensors in pinned host memory); speculative off: every
// step's update runs at step() on the clipped gradients.
void run_group(bool direct, bool speculative) {
  Rig r;
  r.host.set_early(0, true);
  r.host.set_speculative(speculative);
  r.host.set_direct(0, direct);
  stp::Allocator& dev = direct ? static_cast<stp::Allocator&>(r.pinned_alloc) : r.device_alloc;
  const std::int64_t n = static_cast<std::int64_t>(kN);
  const std::vector<float> p0 = ramp(kN, -1.0f, 2.0f), q0 = ramp(kN, 0.5f, 1.0f), g0 = ramp(kN, -0.01f, 0.02f);
  stp::Tensor p = stp::Tensor::empty(dev, {n}), gp = stp::Tensor::empty(dev, {n});
  stp::Tensor master = stp::Tensor::empty(r.host.allocator(), {n}), gq = stp::Tensor::empty(dev, {n});
  stp::Tensor copy = stp::Tensor::empty(dev, {n}, stp::DType::Bf16);
  std::vector<stp::Tensor> mv;
  for (int i = 0; i < 4; ++i) {
    mv.push_back(stp::Tensor::empty(r.host.allocator(), {n}));
    std::memset(mv.back().raw(), 0, mv.back().bytes());
  }
  r.put(p, p0.data());
  std::memcpy(master.raw(), q0.data(), master.bytes());
  r.host.add(0, p.f32(), gp.f32(), mv[0].f32(), mv[1].f32(), kN, /*decay=*/true);
  r.host.add(0, master.f32(), gq.f32(), mv[2].f32(), mv[3].f32(), kN, /*decay=*/false, copy.as<bf16>());

  // The expected state, updated by cpu_adamw_update directly.
  std::vector<float> ep = p0, eq = q0, em(kN, 0.0f), ev(kN, 0.0f), fm(kN, 0.0f), fv(kN, 0.0f);
  auto expect_state = [&](const char* when) {
    SCOPED_TRACE(when);
    const std::vector<float> got = r.get<float>(p);
    EXPECT_EQ(std::memcmp(got.data(), ep.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(master.f32(), eq.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mv[0].f32(), em.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mv[1].f32(), ev.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mv[2].f32(), fm.data(), kN * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(mv[3].f32(), fv.data(), kN * sizeof(float)), 0);
    const std::vector<bf16> c = r.get<bf16>(copy);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < kN; ++i) {
      const bf16 want = stp::from_f32<bf16>(eq[i]);
      wrong += std::memcmp(&c[i], &want, sizeof(bf16)) != 0;
    }
    EXPECT_EQ(wrong, 0u);
  };
  // One step: the gradients g0 * (1 + step / 10) on the device, reported final; the clip then
  // scales them on the device by coef (when below 1) as GradClipper does.
  auto run_step = [&](int step, float coef, bool skipped) {
    std::vector<float> g = g0;
    for (float& x : g) x *= 1.0f + static_cast<float>(step) / 10.0f;
    r.host.begin_step(1e-3f, kHyper, step);  // orders compute after the last step's downloads
    r.put(gp, g.data());
    r.put(gq, g.data());
    r.host.grads_final(0);
    if (skipped) return;
    r.host.order_after_downloads(*r.compute);
    std::vector<float> clipped = g;
    for (float& x : clipped) x *= coef;
    if (coef != 1.0f) {
      r.put(gp, clipped.data());
      r.put(gq, clipped.data());
    }
    r.host.set_clip_coefficient(coef);
    r.host.step(1e-3f, kHyper, step);
    r.host.settle();
    stp::cpu_adamw_update(ep.data(), clipped.data(), em.data(), ev.data(), kN,
                          stp::adamw_scalars(1e-3f, kHyper, step, true));
    stp::cpu_adamw_update(eq.data(), clipped.data(), fm.data(), fv.data(), kN,
                          stp::adamw_scalars(1e-3f, kHyper, step, false));
  };
  const std::size_t spec = speculative ? 1 : 0;
  run_step(1, 1.0f, false);
  EXPECT_EQ(r.host.last_speculation().committed, spec);
  EXPECT_EQ(r.host.last_speculation().discarded, 0u);
  expect_state("committed");
  run_step(2, 0.5f, false);
  EXPECT_EQ(r.host.last_speculation().committed, 0u);
  EXPECT_EQ(r.host.last_speculation().discarded, spec);
  expect_state("discarded");
  run_step(3, 1.0f, /*skipped=*/true);
  r.host.settle();
  expect_state("skipped");
  run_step(3, 1.0f, false);
  EXPECT_EQ(r.host.last_speculation().committed, spec);
  expect_state("committed after a skipped step");
  if (speculative) {
    EXPECT_GT(r.host.hidden_ns(), 0);
  }
  // Shadows: m, v of both spans and the master of the host master, or (direct) of both spans.
  const std::size_t shadows = speculative ? (direct ? 6 : 5) * kN * sizeof(float) : 0;
  EXPECT_EQ(r.host.shadow_bytes(), shadows);
  // Moments and the host master, the shadows, and (staged) the staging: the device master's
  // parameter, both gradients, the host master's bf16 rounding.
  const std::size_t staging = direct ? 0 : 3 * kN * sizeof(float) + kN * sizeof(bf16);
  EXPECT_EQ(r.host.host_bytes(), 5 * kN * sizeof(float) + shadows + staging);
  // Staged: per step both gradients and the device master down, the master and the copy up; the
  // skipped step's download, and a discarded speculation's second download.
  const std::size_t down = 3 * kN * sizeof(float), per_step = down + kN * sizeof(float) + kN * sizeof(bf16);
  EXPECT_EQ(r.host.copied_bytes(), direct ? 0 : 3 * per_step + down + (speculative ? down : 0));
}

TEST(HostUpdate, SpeculationCommitsDiscardsAndDropsBitwise) { run_group(false, true); }
TEST(HostUpdate, DirectGroupSpeculatesBitwiseWithoutStagingOrCopies) { run_group(true, true); }
TEST(HostUpdate, DirectGroupUpdatesInPlaceBitwiseWithoutStagingOrCopies) { run_group(true, false); }
TEST(HostUpdate, StagedGroupWithoutSpeculationCopiesEveryStep) { run_group(false, false); }

}  // namespace
