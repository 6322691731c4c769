// Element types of tensors and the bf16 number format, usable from host and device code alike.
//
// bf16 is the upper half of an IEEE f32 (1 sign, 8 exponent, 7 mantissa bits). Storage only:
// kernels load bf16 into f32 (exact), compute in f32 and round once when they store (round to
// nearest, ties to even: the rounding of CUDA's __float2bfloat16_rn and PyTorch). The same
// functions run on the CPU backend and inside CUDA kernels, so a bf16 tensor holds the same bits
// on both (docs/model.md, "Precision").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STP_HD __host__ __device__
#else
#define STP_HD
#endif

namespace stp {

enum class DType : std::uint8_t { F32, Bf16 };

std::size_t dtype_size(DType dtype);
const char* to_string(DType dtype);

struct bf16 {
  std::uint16_t bits;
};

STP_HD inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STP_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Element loads and stores of the kernels: f32 passes through, bf16 widens exactly / rounds.
STP_HD inline float to_f32(float v) { return v; }
STP_HD inline float to_f32(bf16 v) { return bits_float(static_cast<std::uint32_t>(v.bits) << 16); }

template <typename T>
STP_HD inline T from_f32(float v);

template <>
STP_HD inline float from_f32<float>(float v) {
  return v;
}

// Round to nearest even; NaN stays NaN (quietened), infinities and overflow to inf as IEEE says.
template <>
STP_HD inline bf16 from_f32<bf16>(float v) {
  std::uint32_t u = float_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::Bf16;
}

}  // namespace stp
