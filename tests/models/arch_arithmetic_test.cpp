// Every architecture's arithmetic (models/registry.h) against counts made independently of it, so
// the numbers train/ uses (model FLOPs, the planner's unit FLOPs, communication volumes) cannot
// drift from the model silently: the parameter counts against the parameter table and a stage
// built on a dry device, the unit FLOPs against the GEMM weights each unit multiplies by, and the
// FLOPs per token against a count by hand.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "models/llama_params.h"
#include "models/registry.h"

namespace stp {
namespace {

using i64 = std::int64_t;

ModelSpec gpt2_model() {  // ModelSpec's defaults: L 2, H 4, C 32, V 64, T 16
  ModelSpec m;
  m.arch = "gpt2";
  m.n_layer = 3;
  return m;
}

// Grouped k/v heads, biases on q, k and v, an untied head and a vocabulary that does not divide
// over two ranks (padding rows).
ModelSpec llama_untied() {
  ModelSpec m;
  m.arch = "llama";
  m.n_layer = 3;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.n_embd = 32;
  m.intermediate_size = 48;
  m.vocab_size = 67;
  m.qkv_bias = true;
  m.tie_embeddings = false;
  return m;
}

ModelSpec llama_tied() {
  ModelSpec m = llama_untied();
  m.n_kv_head = 4;
  m.vocab_size = 64;
  m.qkv_bias = false;
  m.tie_embeddings = true;
  return m;
}

std::vector<ModelSpec> models() { return {gpt2_model(), llama_untied(), llama_tied()}; }

std::string label(const ModelSpec& m) {
  return m.arch + (m.tie_embeddings ? " tied" : " untied") + (m.qkv_bias ? " qkv_bias" : "") + " K " +
         std::to_string(m.n_kv_head) + " V " + std::to_string(m.vocab_size);
}

StageSpec stage(int begin, int end, int tp_rank = 0, int tp = 1, bool vocab_parallel = false) {
  StageSpec s;
  s.layer_begin = begin;
  s.layer_end = end;
  s.tp_rank = tp_rank;
  s.tp_size = tp;
  s.micro_batch_size = 2;
  s.vocab_parallel = vocab_parallel;
  return s;
}

// Every split of a 3-layer model: whole, first, middle, last, on every rank of tp 1 and 2, with and
// without vocab parallelism.
std::vector<StageSpec> splits() {
  std::vector<StageSpec> out;
  for (auto [begin, end] : {std::pair{0, 3}, std::pair{0, 1}, std::pair{1, 2}, std::pair{2, 3}, std::pair{1, 3}})
    for (int tp : {1, 2})
      for (int r = 0; r < tp; ++r)
        for (bool vocab : {false, true}) out.push_back(stage(begin, end, r, tp, vocab));
  return out;
}

std::string label(const StageSpec& s) {
  return "layers [" + std::to_string(s.layer_begin) + ", " + std::to_string(s.layer_end) + ") tp rank " +
         std::to_string(s.tp_rank) + " of " + std::to_string(s.tp_size) + (s.vocab_parallel ? " vocab-parallel" : "");
}

i64 shard_elements(const ParamInfo& p) { return p.layout.shard_rows * p.layout.shard_cols; }

// The embeddings a token only looks up, by the architectures' parameter names (models/gpt2_params.h,
// models/llama_params.h): GPT-2's positions; Llama's token embedding unless it is the head too.
bool lookup_only(const ModelSpec& m, const std::string& name) {
  if (m.arch == "gpt2") return name == "wpe.weight";
  return name == "model.embed_tokens.weight" && !m.tie_embeddings;
}

// The tensor the LM head multiplies by.
std::string head_weight(const ModelSpec& m) { return m.arch == "gpt2" ? "wte.weight" : llama_head_weight(m); }

// A stage on a dry device (allocations counted, nothing runs): what ParamStore decides. With
// host_masters, its masters' allocator is the device's pinned host memory.
struct DryStage {
  DryStage(const ModelSpec& m, StageSpec s, bool host_masters = false)
      : device(0, dry()), alloc(device), pinned(device, true) {
    if (host_masters) s.host_masters = &pinned;
    st = make_stage(m, s, alloc);
  }
  static CpuDeviceOptions dry() {
    CpuDeviceOptions o;
    o.dry_run = true;
    return o;
  }
  CpuDevice device;
  DeviceAllocator alloc, pinned;
  std::unique_ptr<Stage> st;
};

TEST(ArchArithmetic, EveryArchitectureSuppliesAllOfIt) {
  ASSERT_GE(architecture_names().size(), 2u);
  for (const std::string& name : architecture_names()) {
    SCOPED_TRACE(name);
    const Architecture& a = find_architecture(name);
    EXPECT_EQ(std::string(a.name), name);
    EXPECT_NE(a.validate, nullptr);
    EXPECT_NE(a.param_table, nullptr);
    EXPECT_NE(a.make_stage, nullptr);
    EXPECT_NE(a.matmul_params, nullptr);
    EXPECT_NE(a.attention_flops_per_token, nullptr);
    EXPECT_NE(a.unit_flops, nullptr);
    EXPECT_NE(a.final_norm_params, nullptr);
    EXPECT_NE(a.stage_params, nullptr);
  }
}

// GPT-2's head is its token embedding (an untied GPT-2 is refused); HF's Llama configurations
// default to a separate lm_head (tie_word_embeddings: false), and both are accepted.
TEST(ArchArithmetic, DefaultTieIsTheArchitecturesHead) {
  EXPECT_TRUE(gpt2_architecture().tie_embeddings_default);
  ModelSpec untied = gpt2_model();
  untied.tie_embeddings = false;
  EXPECT_THROW(validate_model(untied, stage(0, 3)), Error);

  EXPECT_FALSE(llama_architecture().tie_embeddings_default);
  EXPECT_NO_THROW(validate_model(llama_untied(), stage(0, 3)));
  EXPECT_NO_THROW(validate_model(llama_tied(), stage(0, 3)));
}

// N = every parameter of the whole model (one stage, tp 1) but the lookup-only embeddings.
TEST(ArchArithmetic, MatmulParamsAreTheTableLessTheLookups) {
  for (const ModelSpec& m : models()) {
    SCOPED_TRACE(label(m));
    i64 n = 0;
    for (const ParamInfo& p : model_param_table(m, stage(0, m.n_layer)))
      if (!lookup_only(m, p.name)) n += numel(p.full_shape);
    EXPECT_EQ(find_architecture(m.arch).matmul_params(m), static_cast<double>(n));
  }
}

// By hand, C = 32, L = 3, T = 16; attention 4·L·C·T = 6144 forward, 18432 in training.
//   GPT-2, V = 64: a block is 12C² + 13C = 12704; N = 3·12704 + 2C (ln_f) + VC (wte) = 40224.
//   Llama untied, H = 4, K = 2 (k, v 16 wide), I = 48, qkv_bias, V = 67: a block is 2C (norms) +
//   C·64 + 64 (qkv_proj and its bias) + C² (o_proj) + 3·C·I = 64 + 2112 + 1024 + 4608 = 7808;
//   N = 3·7808 + C (norm) + VC (lm_head) = 23424 + 32 + 2144 = 25600.
TEST(ArchArithmetic, FlopsPerTokenByHand) {
  EXPECT_EQ(model_forward_flops_per_token(gpt2_model()), 2 * 40224.0 + 6144);
  EXPECT_EQ(model_training_flops_per_token(gpt2_model()), 6 * 40224.0 + 18432);
  EXPECT_EQ(model_forward_flops_per_token(llama_untied()), 2 * 25600.0 + 6144);
  EXPECT_EQ(model_training_flops_per_token(llama_untied()), 6 * 25600.0 + 18432);
}

// Each unit of a built stage: attention and MLP units 2·B·T times the elements of this rank's
// shards of their layer's GEMM weights (+ the attention core by its kernel), the head 2·B·T times
// its weight's rows on this rank (V divides over the ranks here) times C, embed and input B·T·C.
TEST(ArchArithmetic, UnitFlopsAreTheGemmWeightsOfEachUnit) {
  for (ModelSpec m : {gpt2_model(), llama_tied(), llama_untied()}) {
    m.vocab_size = 64;
    for (AttentionKernel attention : {AttentionKernel::Naive, AttentionKernel::Fused}) {
      m.attention = attention;
      for (const StageSpec& s : splits()) {
        SCOPED_TRACE(label(m) + ", " + label(s) + (attention == AttentionKernel::Naive ? ", naive" : ", fused"));
        const double N = 2.0 * m.seq_len, C = m.n_embd;
        const double core = (attention == AttentionKernel::Naive ? 4 : 2) * N * m.seq_len * C / s.tp_size;
        const std::vector<ParamInfo> table = model_param_table(m, s);
        auto gemm = [&](int layer, const char* branch) {  // "attn." or "mlp." of layer `layer`
          i64 n = 0;
          for (const ParamInfo& p : table)
            if (p.full_shape.size() == 2 && p.name.find(branch) != std::string::npos &&
                p.name.find("." + std::to_string(layer) + ".") != std::string::npos)
              n += shard_elements(p);
          EXPECT_GT(n, 0);
          return 2 * N * static_cast<double>(n);
        };
        DryStage d(m, s);
        const Architecture& a = find_architecture(m.arch);
        int layer = s.layer_begin;
        for (int u = 0; u < d.st->num_units(); ++u) {
          const UnitKind kind = d.st->unit_kind(u);
          const double flops = a.unit_flops(m, s, kind);
          switch (kind) {
            case UnitKind::Embed:
            case UnitKind::Input: EXPECT_EQ(flops, N * C); break;
            case UnitKind::Attn: EXPECT_EQ(flops, gemm(layer, "attn.") + core); break;
            case UnitKind::Mlp: EXPECT_EQ(flops, gemm(layer++, "mlp.")); break;
            case UnitKind::Head: {
              i64 rows = 0;
              for (const ParamInfo& p : table)
                if (p.name == head_weight(m)) rows = p.layout.shard_rows;
              EXPECT_EQ(flops, 2 * N * static_cast<double>(rows) * C);
              break;
            }
          }
        }
      }
    }
  }
}

// The final norm: the 1-D parameters of a last stage holding no layer.
TEST(ArchArithmetic, FinalNormParamsAreTheLastStagesVectors) {
  for (const ModelSpec& m : models()) {
    SCOPED_TRACE(label(m));
    i64 n = 0;
    for (const ParamInfo& p : model_param_table(m, stage(m.n_layer, m.n_layer)))
      if (p.full_shape.size() == 1) n += numel(p.full_shape);
    EXPECT_GT(n, 0);
    EXPECT_EQ(find_architecture(m.arch).final_norm_params(m), n);
  }
}

// all: the elements of the rank's shards in the table (padding rows of a vocab-parallel table
// included); movable: the elements of the parameters whose master a bf16 stage with sharded masters
// leaves off the device (ParamInfo::sharded_master), and a stage with host masters moves to the host.
TEST(ArchArithmetic, StageParamsCountTheTableAndTheBuiltStage) {
  for (ModelSpec m : models()) {
    m.precision = DType::Bf16;
    for (StageSpec s : splits()) {
      SCOPED_TRACE(label(m) + ", " + label(s));
      const StageParamCount count = find_architecture(m.arch).stage_params(m, s);
      i64 all = 0;
      for (const ParamInfo& p : model_param_table(m, s)) all += shard_elements(p);
      EXPECT_EQ(count.all, all);

      s.shard_masters = true;
      DryStage sharded(m, s);
      i64 movable = 0;
      for (const ParamInfo& p : sharded.st->params())
        if (p.sharded_master) movable += shard_elements(p);
      EXPECT_GT(movable, 0);
      EXPECT_EQ(count.movable, movable);

      s.shard_masters = false;
      DryStage on_host(m, s, true);
      i64 moved = 0;
      for (const ParamInfo& p : on_host.st->params())
        if (p.host_master) moved += shard_elements(p);
      EXPECT_EQ(count.movable, moved);
    }
  }
}

}  // namespace
}  // namespace stp
