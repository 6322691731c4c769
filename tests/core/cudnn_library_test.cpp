// cuDNN as far as a machine without a GPU can check it (core/cuda/cudnn_library.h): the library
// opened at run time with its version checked, the one fallback line when it is missing or too
// old, and the tensor and operation descriptors of the fused-attention graphs, each finalized by
// cuDNN itself. The operation graph, the engines and the plans need a cuDNN handle, that is a GPU:
// KernelParity's library-attention cases run them there (tests/core/kernel_parity_attention_test.cpp).
// Built with the CUDA backend only.
#include <gtest/gtest.h>

#if STP_HAVE_CUDA

#include <string>

#include "base/error.h"
#include "core/cuda/cudnn_library.h"

namespace {

using stp::AttentionShape;
using stp::CudnnStatus;

// The toolkit's cuDNN (CMake found CUDA, whose image holds cuDNN 9); skipped where there is none.
CudnnStatus toolkit_cudnn() { return stp::probe_cudnn(stp::kCudnnLibrary); }

TEST(CudnnLibrary, OpensTheToolkitsCudnnAndChecksItsVersion) {
  const CudnnStatus s = toolkit_cudnn();
  if (s.version == 0) GTEST_SKIP() << "no cuDNN on this machine: " << s.why;
  EXPECT_TRUE(s.usable) << s.why;
  EXPECT_GE(s.version, stp::kMinCudnnVersion) << stp::cudnn_version_string(s.version);
  EXPECT_EQ(stp::cudnn_version_defect(s.version), "");
  EXPECT_TRUE(s.why.empty()) << s.why;
  // The process's own load agrees (and prints nothing when usable).
  EXPECT_EQ(stp::cudnn_status().usable, s.usable);
  EXPECT_EQ(stp::cudnn_status().version, s.version);
}

TEST(CudnnLibrary, AMissingLibraryIsOneLineNamingItAndTheFallback) {
  const CudnnStatus s = stp::probe_cudnn("libcudnn_stp_missing.so.9");
  EXPECT_FALSE(s.usable);
  EXPECT_EQ(s.version, 0u);
  const std::string line = stp::cudnn_fallback_line(s);
  EXPECT_EQ(line.rfind("stp: cuDNN not found (dlopen libcudnn_stp_missing.so.9: ", 0), 0u) << line;
  EXPECT_NE(line.find("); fused attention runs stp's own CUDA kernel"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST(CudnnLibrary, ATooOldOrDefectiveVersionIsOneLineNamingIt) {
  EXPECT_EQ(stp::cudnn_version_string(91900), "9.19.0");
  EXPECT_EQ(stp::cudnn_version_string(stp::kMinCudnnVersion), "9.1.0");
  CudnnStatus old;
  old.library = "libcudnn.so.9";
  old.version = 90002;
  old.why = "libcudnn.so.9 is version 9.0.2, older than 9.1.0";
  EXPECT_EQ(stp::cudnn_fallback_line(old),
            "stp: cuDNN not usable (libcudnn.so.9 is version 9.0.2, older than 9.1.0); fused attention runs "
            "stp's own CUDA kernel");
  // Releases with known defects are refused although new enough; their neighbours are not.
  EXPECT_NE(stp::cudnn_version_defect(91000), "");
  EXPECT_NE(stp::cudnn_version_defect(91001), "");
  EXPECT_EQ(stp::cudnn_version_defect(91002), "");
  EXPECT_EQ(stp::cudnn_version_defect(90800), "");
  EXPECT_EQ(stp::cudnn_version_defect(91900), "");
}

// A GQA shape in GPT-2-style packed rows [q | k | v]: 4 query heads over 2 k/v heads of 64 values.
constexpr AttentionShape kGqa{2, 128, 4, 2, 64, (4 + 2 * 2) * 64, (4 + 2 * 2) * 64, 4 * 64, stp::DType::Bf16};

TEST(CudnnAttentionGraph, ForwardDescriptorsOfAGqaShapeFinalize) {
  if (!toolkit_cudnn().usable) GTEST_SKIP() << "no usable cuDNN: " << toolkit_cudnn().why;
  const stp::CudnnGraphCounts c = stp::check_cudnn_attention_descriptors(kGqa, /*backward=*/false);
  // Q, K^T, V, O, the statistics, the scale and -inf; 12 virtual: Q K^T, scaled, row and column
  // indices, the mask, masked, max, shifted, exp, sum, log, P.
  EXPECT_EQ(c.tensors, 7 + 12);
  // bmm1, scale, 4 of the mask, max, sub, exp, sum, log, stats, div, bmm2.
  EXPECT_EQ(c.operations, 14);
  GTEST_LOG_(INFO) << "the operation graph, engine heuristics and plans need a cuDNN handle (a GPU): "
                      "KernelParity.LibraryAttention* runs them";
}

TEST(CudnnAttentionGraph, BackwardDescriptorsOfAGqaShapeFinalize) {
  if (!toolkit_cudnn().usable) GTEST_SKIP() << "no usable cuDNN: " << toolkit_cudnn().why;
  const stp::CudnnGraphCounts c = stp::check_cudnn_attention_descriptors(kGqa, /*backward=*/true);
  // Q, K^T, V^T, O, dO, the statistics, dQ, dK, dV, row_dot, the scale, -inf and 1; 19 virtual
  // (with GQA's per-head dK and dV).
  EXPECT_EQ(c.tensors, 13 + 19);
  // 21 operations, and GQA's two head reductions.
  EXPECT_EQ(c.operations, 21 + 2);
  AttentionShape mha = kGqa;
  mha.NKV = mha.NH;
  mha.ldq = mha.ldkv = 3 * mha.NH * mha.D;
  const stp::CudnnGraphCounts m = stp::check_cudnn_attention_descriptors(mha, /*backward=*/true);
  EXPECT_EQ(m.tensors, 13 + 17);
  EXPECT_EQ(m.operations, 21);
}

// The checks are cuDNN's own: a graph whose products do not fit (3 k/v heads for 4 query heads, which
// no broadcast covers) is refused when its first matmul operation is finalized.
TEST(CudnnAttentionGraph, AGraphWhoseProductsDoNotFitIsRefusedAtFinalize) {
  if (!toolkit_cudnn().usable) GTEST_SKIP() << "no usable cuDNN: " << toolkit_cudnn().why;
  AttentionShape bad = kGqa;
  bad.NKV = 3;
  try {
    (void)stp::check_cudnn_attention_descriptors(bad, /*backward=*/false);
    FAIL() << "cuDNN finalized a Q K^T product of 4 query heads over 3 k/v heads";
  } catch (const stp::InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("finalizing bmm1"), std::string::npos) << e.what();
  }
}

}  // namespace

#endif  // STP_HAVE_CUDA
