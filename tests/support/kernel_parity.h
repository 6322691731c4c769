// The kernel parity fixture (KernelParity): every kernel runs on a CpuDevice, the oracle, and on the
// device under test with the same inputs, and each output of the device is compared with the
// oracle's (bitwise on a CPU device, within the stated tolerance on CUDA). One GoogleTest suite over
// several files: tests/core/kernel_parity_test.cpp (whose header derives the tolerances and holds
// the one INSTANTIATE_TEST_SUITE_P, Backends/KernelParity.NAME/KIND), kernel_parity_attention_test.cpp
// and kernel_parity_llama_test.cpp. In a named namespace: GoogleTest requires one fixture type for
// a suite across translation units.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "tests/support/devices.h"
#include "tests/support/parity_compare.h"

namespace stp::testing {

// Rows and columns of the row-wise kernels' cases (LayerNorm, RMSNorm, SwiGLU, ...).
inline constexpr std::int64_t kRows = 300, kC = 96;  // 300 rows: two CUDA blocks of 256 threads

// A buffer with one copy per side: [0] on the oracle, [1] on the device under test.
template <typename T>
struct Buf {
  T* on[2] = {nullptr, nullptr};
  std::size_t n = 0;
};

// Picks one side's pointer of a Buf inside KernelParity::run.
struct Side {
  int i;
  template <typename T>
  T* operator()(const Buf<T>& b) const {
    return b.on[i];
  }
};

template <typename T>
std::vector<float> widened(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = stp::to_f32(v[i]);
  return out;
}

class KernelParity : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    STP_DEVICES_OR_SKIP(dut, GetParam(), 1);
    stp::BackendOptions o;  // the oracle: always a CpuDevice of its own
    dev_[0] = std::move(stp::make_devices(o)[0]);
    dev_[1] = std::move(dut[0]);
    for (int i = 0; i < 2; ++i) stream_[i] = dev_[i]->create_stream("compute");
  }

  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (!stream_[i]) continue;
      stream_[i]->synchronize();
      for (void* p : owned_[i]) dev_[i]->deallocate(p);
    }
  }

  bool on_cpu() const { return GetParam() == DeviceKind::Cpu; }

  // The same bytes on both sides.
  template <typename T>
  Buf<T> upload(const std::vector<T>& host) {
    Buf<T> b;
    b.n = host.size();
    for (int i = 0; i < 2; ++i) {
      b.on[i] = static_cast<T*>(dev_[i]->allocate(std::max<std::size_t>(1, host.size()) * sizeof(T)));
      owned_[i].push_back(b.on[i]);
      if (!host.empty()) stream_[i]->copy(b.on[i], host.data(), host.size() * sizeof(T));
      stream_[i]->synchronize();  // host dies with the caller
    }
    return b;
  }

  template <typename T>
  std::vector<T> download(const Buf<T>& b, int side) {
    std::vector<T> out(b.n);
    stream_[side]->copy(out.data(), b.on[side], b.n * sizeof(T));
    stream_[side]->synchronize();
    return out;
  }

  // f(stream, side) enqueues the kernel under test with side(buf) as pointers: once on each side.
  template <typename F>
  void run(F f) {
    for (int i = 0; i < 2; ++i) f(*stream_[i], Side{i});
  }

  // The device's copy of b against the oracle's: bitwise on a CPU device, `cuda` on a GPU.
  template <typename T>
  void expect_match(const char* what, const Buf<T>& b, const Tolerance& cuda) {
    std::vector<T> want = download(b, 0), got = download(b, 1);
    const Tolerance& tol = on_cpu() ? Tolerance::exact() : cuda;
    auto r = matches(got, want, tol);
    EXPECT_TRUE(r) << what << ": " << r.message();
    if (!on_cpu() && r) std::cout << "[parity] " << what << ": " << r.message() << "\n";
  }

  std::vector<float> uniform(std::size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  // Uniform values stored as T (bf16: rounded, so both sides and the host bounds see the same).
  template <typename T>
  std::vector<T> values(std::size_t n, float lo, float hi) {
    std::vector<float> f = uniform(n, lo, hi);
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = stp::from_f32<T>(f[i]);
    return v;
  }
  std::vector<std::int32_t> tokens(std::size_t n, int below) {
    std::uniform_int_distribution<int> d(0, below - 1);
    std::vector<std::int32_t> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  // One case per kernel, for each storage type it is instantiated for (defined in the test file of
  // its kernels: kernel_parity_test.cpp, kernel_parity_attention_test.cpp, kernel_parity_llama_test.cpp).
  template <typename TA, typename TC>
  void gemm_case();
  template <typename T>
  void layernorm_forward_case();
  template <typename TA, typename TC>
  void linear_forward_case();
  template <typename TA, typename TC>
  void linear_backward_input_case();
  template <typename TA>
  void linear_backward_weight_case();
  template <typename T>
  void column_sum_case();
  template <typename T>
  void gelu_forward_case();
  template <typename T>
  void gelu_backward_case();
  template <typename T>
  void attention_forward_case();
  template <typename T>
  void attention_backward_case();
  template <typename T>
  void fused_attention_case(std::int64_t seq);
  void library_attention_case();
  template <typename T>
  void cross_entropy_forward_case();
  template <typename T>
  void cross_entropy_backward_case();
  template <typename T>
  void rmsnorm_forward_case();
  template <typename T>
  void rope_case();
  template <typename T>
  void swiglu_case();
  template <typename T>
  void gqa_case();

  std::mt19937 rng_{20240611};
  std::unique_ptr<stp::Device> dev_[2];
  std::unique_ptr<Stream> stream_[2];
  std::vector<void*> owned_[2];
};

}  // namespace stp::testing
