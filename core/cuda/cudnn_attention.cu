// CudnnAttention (core/cuda/cudnn_attention.h): cuDNN's composite SDPA graphs on the backend API.
//
// Why the composite graph and not CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR: in cuDNN 9.19's
// header those single operations (the forward from 9.13.1) take Q, K, V, O, the statistics, a
// scale and optional block masks, paged caches and sequence lengths, but no causal (diagonal) mask;
// the backward one has no mask at all. (A score-modifier subgraph that could carry the mask comes
// with cuDNN 9.21.) The composite graph expresses the causal mask as pointwise operations, and
// cuDNN's fused flash-attention engines recognise that pattern (docs/gpu-readiness.md, Attention). The graphs follow
// the operation sequence cudnn-frontend's CompositeSDPANode / CompositeSDPABackwardNode build for a causal mask
// (top-left diagonal), a by-value attention scale, statistics, no bias, no dropout, and the deterministic backward.
//
// Tensor layouts (4-d, cuDNN's (b, h, s, d) order; strides in elements):
//   Q, dQ (B, NH, T, D)  strides (T*ldq, D, ldq, 1);  O, dO likewise with ldo
//   K, V, dK, dV (B, NKV, T, D) strides (T*ldkv, D, ldkv, 1); K^T and V^T swap the last two
//   statistics / lse, row_dot (B, NH, T, 1) strides (NH*T, T, 1, 1): lse[(b*NH + h)*T + t]
//   scores (virtual) (B, NH, T, T) strides (NH*T*T, T*T, T, 1)
#include "core/cuda/cudnn_attention.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <set>
#include <vector>

#include "base/error.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cudnn_api.h"
#include "core/cuda/cudnn_library.h"

namespace stp {

namespace {

using i64 = std::int64_t;
using Dims = std::array<i64, 4>;

// Every real tensor is 16-byte aligned: the arena's buffers are 256-byte aligned and the offsets
// of k and v in a packed row and every row stride are multiples of 8 bf16 (prepare checks D and
// the strides).
constexpr i64 kAlignment = 16;

// Unique ids of the tensors the variant packs name.
enum Uid : i64 { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kRowDot, kOne, kFirstVirtual = 100 };

struct Layout {
  Dims dims, strides;
};

Layout heads(const AttentionShape& s, i64 h, i64 ld) { return {{s.B, h, s.T, s.D}, {s.T * ld, s.D, ld, 1}}; }
Layout transposed(Layout l) {
  std::swap(l.dims[2], l.dims[3]);
  std::swap(l.strides[2], l.strides[3]);
  return l;
}
Layout rows(const AttentionShape& s) { return {{s.B, s.NH, s.T, 1}, {s.NH * s.T, s.T, 1, 1}}; }
Layout scores(const AttentionShape& s) { return {{s.B, s.NH, s.T, s.T}, {s.NH * s.T * s.T, s.T * s.T, s.T, 1}}; }
// P^T and dS^T as the dV and dK products read them: the scores' memory seen as (b, h, key, query).
Layout scores_t(const AttentionShape& s) { return {{s.B, s.NH, s.T, s.T}, {s.NH * s.T * s.T, s.T * s.T, 1, s.T}}; }
// A per-query-head dK / dV before GQA's sum over the group.
Layout full_heads(const AttentionShape& s) { return {{s.B, s.NH, s.T, s.D}, {s.NH * s.T * s.D, s.T * s.D, s.D, 1}}; }

// One graph's descriptors, each finalized as it is made; deques keep references stable.
struct Graph {
  std::deque<CudnnDesc> tensors, ops, attrs;
  i64 next_virtual = kFirstVirtual;

  const CudnnDesc& tensor(i64 uid, cudnnDataType_t type, const Layout& l, bool is_virtual, bool by_value = false) {
    CudnnDesc& t = tensors.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR, str("tensor ", uid));
    t.set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, l.dims.data())
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, l.strides.data())
        .set_int(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .set_int(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, kAlignment);
    if (is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    return t.finalize();
  }
  const CudnnDesc& virt(cudnnDataType_t type, const Layout& l) { return tensor(next_virtual++, type, l, true); }
  // An f32 scalar passed by value (its host address goes in the variant pack).
  const CudnnDesc& scalar(i64 uid) { return tensor(uid, CUDNN_DATA_FLOAT, {{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true); }

  void matmul(const CudnnDesc& a, const CudnnDesc& b, const CudnnDesc& c, const char* name) {
    CudnnDesc& m = attrs.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR, str(name, " (matmul)"));
    m.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    ops.emplace_back(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, m)
        .finalize();
  }
  // y = mode(x [, b] [, t]); `prec` is the operation's math precision; axis only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const CudnnDesc& x, const CudnnDesc* b, const CudnnDesc& y,
                 const char* name, cudnnDataType_t prec = CUDNN_DATA_FLOAT, const CudnnDesc* t = nullptr,
                 i64 axis = -1) {
    CudnnDesc& p = attrs.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, str(name, " (pointwise)"));
    p.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) p.set_int(CUDNN_ATTR_POINTWISE_AXIS, axis);
    p.finalize();
    CudnnDesc& op = ops.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p).set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.finalize();
  }
  void reduction(cudnnReduceTensorOp_t mode, const CudnnDesc& x, const CudnnDesc& y, const char* name) {
    CudnnDesc& r = attrs.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, str(name, " (reduction)"));
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    ops.emplace_back(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
        .finalize();
  }
  void reshape(const CudnnDesc& x, const CudnnDesc& y, const char* name) {
    ops.emplace_back(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name)
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y)
        .finalize();
  }

  // out (a k/v head gradient, NKV heads) = a b. Under GQA the product has NH heads, one per query
  // head, and each k/v head's gradient is the sum over its group.
  void kv_head_matmul(const AttentionShape& s, const CudnnDesc& a, const CudnnDesc& b, const CudnnDesc& out,
                      const char* matmul_name, const char* reduce_name) {
    if (s.NKV == s.NH) {
      matmul(a, b, out, matmul_name);
      return;
    }
    const CudnnDesc& full = virt(CUDNN_DATA_BFLOAT16, full_heads(s));
    matmul(a, b, full, matmul_name);
    reduction(CUDNN_REDUCE_TENSOR_ADD, full, out, reduce_name);
  }

  // The causal mask on scores x: keep (row >= column), else -inf. Row and column indices are
  // generated along axes 2 and 3 of x (int32), compared (boolean), and select x or -inf.
  const CudnnDesc& causal_mask(const AttentionShape& s, const CudnnDesc& x, const CudnnDesc& neg_inf) {
    const CudnnDesc& row = virt(CUDNN_DATA_INT32, scores(s));
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, "gen_row_index", CUDNN_DATA_FLOAT, nullptr, 2);
    const CudnnDesc& col = virt(CUDNN_DATA_INT32, scores(s));
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, "gen_col_index", CUDNN_DATA_FLOAT, nullptr, 3);
    const CudnnDesc& keep = virt(CUDNN_DATA_BOOLEAN, scores(s));
    pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep, "row_ge_col", CUDNN_DATA_BOOLEAN);
    const CudnnDesc& y = virt(CUDNN_DATA_FLOAT, scores(s));
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, y, "causal_select", CUDNN_DATA_FLOAT, &keep);
    return y;
  }
};

constexpr cudnnDataType_t kBf16 = CUDNN_DATA_BFLOAT16, kF32 = CUDNN_DATA_FLOAT;

// O = softmax(mask(Q K^T * scale)) V and the statistics lse = max + log(sum exp(s - max)), the
// natural log-sum-exp of each row's scaled, masked scores (cudnn-frontend's softmax node).
void build_forward(Graph& g, const AttentionShape& s) {
  const CudnnDesc& q = g.tensor(kQ, kBf16, heads(s, s.NH, s.ldq), false);
  const CudnnDesc& kt = g.tensor(kK, kBf16, transposed(heads(s, s.NKV, s.ldkv)), false);
  const CudnnDesc& v = g.tensor(kV, kBf16, heads(s, s.NKV, s.ldkv), false);
  const CudnnDesc& o = g.tensor(kO, kBf16, heads(s, s.NH, s.ldo), false);
  const CudnnDesc& stats = g.tensor(kStats, kF32, rows(s), false);
  const CudnnDesc& scale = g.scalar(kScale);
  const CudnnDesc& neg_inf = g.scalar(kNegInf);

  const CudnnDesc& qk = g.virt(kF32, scores(s));
  g.matmul(q, kt, qk, "bmm1");
  const CudnnDesc& scaled = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_MUL, qk, &scale, scaled, "attn_scale");
  const CudnnDesc& masked = g.causal_mask(s, scaled, neg_inf);
  const CudnnDesc& max = g.virt(kF32, rows(s));
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max, "softmax_max");
  const CudnnDesc& shifted = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_SUB, masked, &max, shifted, "softmax_sub");
  const CudnnDesc& e = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e, "softmax_exp");
  const CudnnDesc& sum = g.virt(kF32, rows(s));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum, "softmax_sum");
  const CudnnDesc& log_sum = g.virt(kF32, rows(s));
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, log_sum, "softmax_log");
  g.pointwise(CUDNN_POINTWISE_ADD, max, &log_sum, stats, "softmax_stats");
  const CudnnDesc& p = g.virt(kBf16, scores(s));  // the engines take bmm2's A in the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, e, &sum, p, "softmax_div");
  g.matmul(p, v, o, "bmm2");
}

// dQ, dK, dV from dO, Q, K, V, O and the statistics, in the deterministic form: row_dot = sum(dO * O)
// per query row (a real tensor: the engines read it back), P = exp(mask(Q K^T * scale) - lse),
// dV = P^T dO, dS = P (dO V^T - row_dot) * scale, dK = dS^T Q, dQ = dS K (no f32 dQ accumulator).
// GQA: dK and dV per query head, then summed over each group by a reduction.
void build_backward(Graph& g, const AttentionShape& s) {
  const Layout q_l = heads(s, s.NH, s.ldq), kv_l = heads(s, s.NKV, s.ldkv), o_l = heads(s, s.NH, s.ldo);
  const CudnnDesc& q = g.tensor(kQ, kBf16, q_l, false);
  const CudnnDesc& kt = g.tensor(kK, kBf16, transposed(kv_l), false);
  const CudnnDesc& vt = g.tensor(kV, kBf16, transposed(kv_l), false);
  const CudnnDesc& o = g.tensor(kO, kBf16, o_l, false);
  const CudnnDesc& d_o = g.tensor(kDO, kBf16, o_l, false);
  const CudnnDesc& stats = g.tensor(kStats, kF32, rows(s), false);
  const CudnnDesc& dq = g.tensor(kDQ, kBf16, q_l, false);
  const CudnnDesc& dk = g.tensor(kDK, kBf16, kv_l, false);
  const CudnnDesc& dv = g.tensor(kDV, kBf16, kv_l, false);
  const CudnnDesc& row_dot = g.tensor(kRowDot, kF32, rows(s), false);
  const CudnnDesc& scale = g.scalar(kScale);
  const CudnnDesc& neg_inf = g.scalar(kNegInf);
  const CudnnDesc& one = g.scalar(kOne);

  // row_dot = sum_d dO * O (times the dropout keep rate, 1 here: the pattern the engines match).
  const Layout prod_l{{s.B, s.NH, s.T, s.D}, {s.NH * s.T * s.D, s.T * s.D, s.NH * s.D, 1}};
  const CudnnDesc& prod = g.virt(kF32, prod_l);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, prod, "mul_dO_O");
  const CudnnDesc& dot = g.virt(kF32, rows(s));
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, dot, "reduce_dO_O");
  g.pointwise(CUDNN_POINTWISE_MUL, dot, &one, row_dot, "scale_dropout_inv");

  // P = exp(mask(Q K^T * scale) - lse).
  const CudnnDesc& qk = g.virt(kF32, scores(s));
  g.matmul(q, kt, qk, "matmul_Q_KT");
  const CudnnDesc& scaled = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_MUL, qk, &scale, scaled, "mul_s_attn_scale");
  const CudnnDesc& shifted = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, &stats, shifted, "sub_s_m");
  const CudnnDesc& masked = g.causal_mask(s, shifted, neg_inf);
  const CudnnDesc& p = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p, "exp_s");

  // dV = P^T dO.
  const CudnnDesc& pt = g.virt(kBf16, scores_t(s));
  g.reshape(p, pt, "reshape_p");
  g.kv_head_matmul(s, pt, d_o, dv, "matmul_pT_dO", "red_dV_head");

  // dS = P (dO V^T - row_dot) * scale.
  const CudnnDesc& dp = g.virt(kF32, scores(s));
  g.matmul(d_o, vt, dp, "matmul_dO_VT");
  const CudnnDesc& dp_shift = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &row_dot, dp_shift, "sub_dP_softmax_sum");
  const CudnnDesc& ds_unscaled = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_MUL, dp_shift, &p, ds_unscaled, "mul_dP_exp_s");
  const CudnnDesc& ds = g.virt(kF32, scores(s));
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, &scale, ds, "mul_dS_attn_scale");

  // dK = dS^T Q.
  const CudnnDesc& dst = g.virt(kBf16, scores_t(s));
  g.reshape(ds, dst, "reshape_dS");
  g.kv_head_matmul(s, dst, q, dk, "matmul_dST_Q", "red_dK_head");

  // dQ = dS K, K read back from K^T.
  const CudnnDesc& k = g.virt(kBf16, kv_l);
  g.reshape(kt, k, "reshape_k");
  g.matmul(ds, k, dq, "matmul_dS_K");
}

// Why cuDNN cannot run `s` before any graph is built, or "".
std::string unsupported(const AttentionShape& s) {
  if (s.type != DType::Bf16) return str("the fused engines run 16-bit types, not ", to_string(s.type));
  if (s.D % 8 != 0 || s.D > 128) return str("head dimension ", s.D, " is not a multiple of 8 up to 128");
  if (s.NKV <= 0 || s.NH % s.NKV != 0) return str(s.NKV, " k/v heads do not divide ", s.NH, " query heads");
  if (s.ldq % 8 != 0 || s.ldkv % 8 != 0 || s.ldo % 8 != 0)
    return str("row strides ", s.ldq, "/", s.ldkv, "/", s.ldo, " are not multiples of 8 elements (16 bytes)");
  return {};
}

std::string describe(const AttentionShape& s) {
  return str("B ", s.B, " T ", s.T, " NH ", s.NH, " NKV ", s.NKV, " D ", s.D, " ", to_string(s.type));
}

// One pass's graph, the engine chosen for it and its plan.
struct Pass {
  Graph graph;
  CudnnDesc op_graph, config, plan;
  i64 engine = -1;
  i64 workspace = 0;
};

i64 get_int(const CudnnDesc& d, cudnnBackendAttributeName_t attr) {
  i64 value = 0, n = 0;
  cudnn_check(cudnn_api().BackendGetAttribute(d.get(), attr, CUDNN_TYPE_INT64, 1, &n, &value),
              str("reading attribute ", static_cast<int>(attr), " of ", d.name()));
  return value;
}

bool nondeterministic(const CudnnDesc& engine) {
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  i64 n = 0;
  cudnn_check(cudnn_api().BackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                              static_cast<i64>(notes.size()), &n, notes.data()),
              "reading the numerical notes of an engine");
  for (i64 i = 0; i < n; ++i)
    if (notes[static_cast<std::size_t>(i)] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

// Finalizes p's operation graph on `handle` and picks its engine (the contract's order); "" or why not.
std::string choose_engine(Pass& p, cudnnHandle_t handle, std::size_t workspace_cap) {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const CudnnDesc& op : p.graph.ops) ops.push_back(op.get());
  p.op_graph = CudnnDesc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  p.op_graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<i64>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .finalize();
  std::string skipped;
  std::set<i64> tried;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, p.op_graph)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    try {
      heur.finalize();
    } catch (const InternalError& e) {
      skipped += str("; heuristics mode ", static_cast<int>(mode), ": ", e.what());
      continue;
    }
    i64 count = 0;
    cudnn_check(cudnn_api().BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                "counting the heuristics' engine configurations");
    std::vector<CudnnDesc> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (i64 i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, str("engine configuration ", i));
      raw.push_back(configs.back().get());
    }
    i64 got = 0;
    if (count > 0)
      cudnn_check(cudnn_api().BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                  "reading the heuristics' engine configurations");
    for (i64 i = 0; i < got; ++i) {
      CudnnDesc& cfg = configs[static_cast<std::size_t>(i)];
      i64 index = -1;
      // Any step cuDNN refuses for one engine (its notes, its plan) only rules that engine out;
      // the reason goes into the line that says why a shape was refused.
      try {
        CudnnDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
        cudnnBackendDescriptor_t e = engine.get();
        i64 n = 0;
        cudnn_check(cudnn_api().BackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
                    "reading an engine configuration's engine");
        index = get_int(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
        if (!tried.insert(index).second) continue;
        if (nondeterministic(engine)) {
          skipped += str("; engine ", index, " nondeterministic");
          continue;
        }
        CudnnDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, str("execution plan of engine ", index));
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
            .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg)
            .finalize();
        const i64 ws = get_int(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
        if (ws < 0 || static_cast<std::size_t>(ws) > workspace_cap) {
          skipped += str("; engine ", index, " needs ", ws, " bytes of workspace, ", workspace_cap, " offered");
          continue;
        }
        p.config = std::move(cfg);
        p.plan = std::move(plan);
        p.engine = index;
        p.workspace = ws;
        return {};
      } catch (const InternalError& err) {
        skipped += str("; engine ", index, ": ", std::string(err.what()).substr(0, 240));
      }
    }
  }
  return skipped.empty() ? std::string("no engine") : skipped.substr(2);
}

// One line per shape and process (several devices prepare the same shapes).
void say_once(const AttentionShape& s, std::size_t workspace, const std::string& line) {
  static std::mutex mu;
  static std::set<std::pair<AttentionShape, std::size_t>> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert({s, workspace}).second) std::fprintf(stderr, "%s\n", line.c_str());
}

void execute(cudnnHandle_t handle, cudaStream_t stream, const CudnnDesc& plan, const std::vector<i64>& uids,
             const std::vector<void*>& pointers, void* workspace) {
  const CudnnApi& api = cudnn_api();
  cudnn_check(api.SetStream(handle, stream), "setting the handle's stream");
  CudnnDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<i64>(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<i64>(pointers.size()),
           pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  cudnn_check(api.BackendExecute(handle, plan.get(), pack.get()), str("executing ", plan.name()));
}

}  // namespace

struct CudnnAttention::Plans {
  bool usable = false;
  Pass fwd, bwd;
  // By-value scalars; the variant packs point at them.
  float scale = 0, neg_inf = -std::numeric_limits<float>::infinity(), one = 1;
};

CudnnGraphCounts check_cudnn_attention_descriptors(const AttentionShape& shape, bool backward) {
  STP_ASSERT(cudnn_status().usable, "cuDNN is not usable: ", cudnn_status().why);
  Graph g;
  if (backward) build_backward(g, shape);
  else build_forward(g, shape);
  return {static_cast<int>(g.tensors.size()), static_cast<int>(g.ops.size())};
}

CudnnAttention::CudnnAttention(int ordinal) : ordinal_(ordinal) {
  cudnnHandle_t h = nullptr;
  cudnn_check(cudnn_api().Create(&h), str("creating a handle on GPU ", ordinal_));
  handle_ = h;
}

CudnnAttention::~CudnnAttention() {
  cache_.clear();  // the plans before the handle they were made with
  if (handle_) (void)cudnn_api().Destroy(static_cast<cudnnHandle_t>(handle_));
}

const CudnnAttention::Plans& CudnnAttention::plans(const AttentionShape& s, std::size_t workspace_bytes) {
  auto key = std::make_pair(s, workspace_bytes);
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto p = std::make_unique<Plans>();
  p->scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)));
  std::string why = unsupported(s);
  if (why.empty()) {
    try {
      build_forward(p->fwd.graph, s);
      build_backward(p->bwd.graph, s);
      auto h = static_cast<cudnnHandle_t>(handle_);
      why = choose_engine(p->fwd, h, workspace_bytes);
      if (why.empty()) {
        why = choose_engine(p->bwd, h, workspace_bytes);
        if (!why.empty()) why = "backward: " + why;
      } else {
        why = "forward: " + why;
      }
    } catch (const InternalError& e) {
      why = e.what();
    }
  }
  p->usable = why.empty();
  if (p->usable)
    say_once(s, workspace_bytes,
             str("stp: fused attention runs cuDNN ", cudnn_version_string(cudnn_status().version), " for ", describe(s),
                 ": forward engine ", p->fwd.engine, " (", p->fwd.workspace, " bytes of workspace), backward engine ",
                 p->bwd.engine, " (", p->bwd.workspace, " bytes)"));
  else
    say_once(s, workspace_bytes,
             str("stp: cuDNN fused attention refused ", describe(s), " with ", workspace_bytes, " bytes of workspace (",
                 why, "); this shape runs stp's own CUDA kernel"));
  return *cache_.emplace(key, std::move(p)).first->second;
}

bool CudnnAttention::prepare(const AttentionShape& shape, std::size_t workspace_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return plans(shape, workspace_bytes).usable;
}

void CudnnAttention::forward(cudaStream_t stream, const AttentionForwardArgs& a, void* workspace,
                             std::size_t workspace_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const Plans& p = plans(a.shape, workspace_bytes);
  STP_ASSERT(p.usable, "cuDNN attention run on a shape it refused: ", describe(a.shape));
  execute(static_cast<cudnnHandle_t>(handle_), stream, p.fwd.plan, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), a.o, a.lse,
           const_cast<float*>(&p.scale), const_cast<float*>(&p.neg_inf)},
          workspace);
}

void CudnnAttention::backward(cudaStream_t stream, const AttentionBackwardArgs& a, void* workspace,
                              std::size_t workspace_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const Plans& p = plans(a.shape, workspace_bytes);
  STP_ASSERT(p.usable, "cuDNN attention run on a shape it refused: ", describe(a.shape));
  execute(static_cast<cudnnHandle_t>(handle_), stream, p.bwd.plan,
          {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kRowDot, kScale, kNegInf, kOne},
          {const_cast<void*>(a.q), const_cast<void*>(a.k), const_cast<void*>(a.v), const_cast<void*>(a.o),
           const_cast<void*>(a.dout), const_cast<float*>(a.lse), a.dq, a.dk, a.dv, a.row_dot,
           const_cast<float*>(&p.scale), const_cast<float*>(&p.neg_inf), const_cast<float*>(&p.one)},
          workspace);
}

}  // namespace stp
