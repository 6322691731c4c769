// AdamW / GradClipper over ParamInfo lists: torch reference values (one rank) and the same
// clipping with grads sharded over two ranks (replicated tensors counted once).
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "core/comm.h"
#include "config/config.h"
#include "core/cpu/cpu_device.h"
#include "optim/adamw.h"
#include "optim/grad_clipper.h"
#include "tests/support/files.h"

using namespace stp;

namespace {

std::map<std::string, std::vector<float>> reference() {
  std::ifstream f(std::string(STP_SOURCE_DIR) + "/tests/optim/data/adamw_reference.txt");
  std::map<std::string, std::vector<float>> ref;
  std::string line, key;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream is(line);
    is >> key;
    for (float v; is >> v;) ref[key].push_back(v);
  }
  return ref;
}

ParamInfo make_param(Allocator& alloc, const std::string& name, Shape shape, const std::vector<float>& init,
                     bool decay) {
  ParamInfo p;
  p.name = name;
  p.param = Tensor::empty(alloc, shape);
  p.grad = Tensor::empty(alloc, shape);
  p.full_shape = shape;
  p.decay = decay;
  std::memcpy(p.param.f32(), init.data(), init.size() * 4);
  return p;
}

void set(const Tensor& t, const std::vector<float>& v, std::size_t offset = 0) {
  std::memcpy(t.f32(), v.data() + offset, static_cast<std::size_t>(t.numel()) * 4);
}

void expect_close(const Tensor& t, const std::vector<float>& want, std::size_t offset, const std::string& what) {
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    float w = want[offset + static_cast<std::size_t>(i)];
    EXPECT_NEAR(t.f32()[i], w, 4e-7f * std::max(1.0f, std::fabs(w))) << what << "[" << i << "]";
  }
}

}  // namespace

TEST(Optimizer, AdamWAndClipperMatchTorch) {
  auto ref = reference();
  auto devs = make_cpu_devices(1);
  auto s = devs[0]->create_stream("compute");
  DeviceAllocator alloc(*devs[0]);
  std::vector<ParamInfo> params;
  params.push_back(make_param(alloc, "h.0.w", {3, 4}, ref["init.w"], true));
  params.push_back(make_param(alloc, "h.0.b", {4}, ref["init.b"], false));
  Config cfg = load_config_from_string("", "t", {"optim.beta2=0.95", "optim.eps=1e-6", "optim.weight_decay=0.1"});
  AdamW opt(params, adamw_hyper(cfg.optim), alloc, *s);
  GradClipper clipper(params, alloc);
  for (int step = 1; step <= 5; ++step) {
    std::string k = ".step" + std::to_string(step);
    set(params[0].grad, ref["grad" + k + ".w"]);
    set(params[1].grad, ref["grad" + k + ".b"]);
    clipper.local_sumsq(*s);
    clipper.clip(*s, 0.5f);
    opt.step(*s, ref["lr" + k][0]);
    s->synchronize();
    EXPECT_NEAR(*clipper.norm(), ref["clip" + k + ".norm"][0], 4e-7f * ref["clip" + k + ".norm"][0]);
    expect_close(params[0].param, ref["clip" + k + ".w"], 0, "w" + k);
    expect_close(params[1].param, ref["clip" + k + ".b"], 0, "b" + k);
  }
  EXPECT_EQ(opt.step_count(), 5);
}

// Rank 0 holds rows 0-1 of w, rank 1 row 2; b is replicated on both and counted on rank 0 only.
TEST(Optimizer, ClippingAcrossRanksEqualsOneRank) {
  auto ref = reference();
  auto devs = make_cpu_devices(2);
  auto comms = make_host_comms(2);
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<DeviceAllocator>> allocs;
  std::vector<std::vector<ParamInfo>> params(2);
  std::vector<std::unique_ptr<GradClipper>> clippers;
  for (int r = 0; r < 2; ++r) {
    streams.push_back(devs[r]->create_stream("compute"));
    allocs.push_back(std::make_unique<DeviceAllocator>(*devs[r]));
    std::int64_t rows = r == 0 ? 2 : 1;
    params[r].push_back(make_param(*allocs[r], "w", {rows, 4}, std::vector<float>(rows * 4), true));
    params[r].push_back(make_param(*allocs[r], "b", {4}, std::vector<float>(4), false));
    params[r][1].replicated = true;
    set(params[r][0].grad, ref["grad.step1.w"], r == 0 ? 0 : 8);
    set(params[r][1].grad, ref["grad.step1.b"]);
    clippers.push_back(std::make_unique<GradClipper>(params[r], *allocs[r],
                                                     [r](const ParamInfo& p) { return !p.replicated || r == 0; }));
  }
  for (int r = 0; r < 2; ++r) {
    clippers[r]->local_sumsq(*streams[r]);
    comms[r]->all_reduce_sum(*streams[r], clippers[r]->sumsq(), 1);
    clippers[r]->clip(*streams[r], 0.5f);
  }
  for (int r = 0; r < 2; ++r) {
    streams[r]->synchronize();
    float want = ref["clip.step1.norm"][0];
    EXPECT_NEAR(*clippers[r]->norm(), want, 4e-7f * want) << "rank " << r;
    expect_close(params[r][0].grad, ref["clip.step1.clipped_w"], r == 0 ? 0 : 8, "w rank " + std::to_string(r));
    expect_close(params[r][1].grad, ref["clip.step1.clipped_b"], 0, "b rank " + std::to_string(r));
  }
}
