#include "train/hf_convert.h"

#include "base/error.h"

namespace stp {
namespace {

using i64 = std::int64_t;

i64 rows_of(const Shape& s) { return s.size() == 1 ? 1 : s[0]; }

void check_values(const std::string& source, const std::string& name, const HostTensor& t, ValueRule rule) {
  const std::string problem = value_problem(t.data, rule);
  STP_CHECK(problem.empty(), source, ": tensor '", name, "' ", problem,
            "; stp imports only finite parameters and optimizer moments (exp_avg_sq also >= 0): use another "
            "checkpoint or model file");
}

}  // namespace

Shape hf_part_shape(const HfTensorRule& r, const HfPart& part) {
  const i64 width = part.end - part.begin;
  if (r.shape.size() == 1) return {width};
  return part.transpose ? Shape{width, r.shape[0]} : Shape{r.shape[0], width};
}

HostTensor to_hf_part(const HfTensorRule& r, const HfPart& p, const float* src) {
  const i64 rows = rows_of(r.shape), cols = r.shape.back();
  HostTensor t{hf_part_shape(r, p), {}};
  const i64 w = p.end - p.begin;
  t.data.resize(static_cast<std::size_t>(rows * w));
  for (i64 i = 0; i < rows; ++i)
    for (i64 j = 0; j < w; ++j) {
      const float v = src[i * cols + p.begin + j];
      t.data[static_cast<std::size_t>(p.transpose ? j * rows + i : i * w + j)] = v;
    }
  return t;
}

std::map<std::string, HostTensor> to_hf(const std::vector<HfTensorRule>& rules,
                                        const std::map<std::string, HostTensor>& full) {
  std::map<std::string, HostTensor> out;
  for (const HfTensorRule& r : rules) {
    auto it = full.find(r.name);
    STP_CHECK(it != full.end(), "HF export: tensor '", r.name, "' is missing");
    STP_CHECK(it->second.shape == r.shape, "HF export: tensor '", r.name, "' has shape ", to_string(it->second.shape),
              ", expected ", to_string(r.shape));
    for (const HfPart& p : r.parts) out.emplace(p.name, to_hf_part(r, p, it->second.data.data()));
  }
  return out;
}

bool stp_named(const std::vector<HfTensorRule>& rules, const TensorSource& hf) {
  // o_proj and down_proj keep their names in both conventions, so the fused names decide for the
  // whole file.
  bool stp_names = false;
  for (const HfTensorRule& r : rules) stp_names = stp_names || (r.parts.size() > 1 && hf.shape(r.name) != nullptr);
  return stp_names;
}

HostTensor from_hf_tensor(const HfTensorRule& r, const TensorSource& hf, bool stp_names, const std::string& source,
                          ValueRule rule, PageableMeter& meter) {
  if (stp_names) {  // every tensor is taken as it is
    const Shape* shape = hf.shape(r.name);
    STP_CHECK(shape != nullptr, source, ": tensor '", r.name, "' is missing");
    STP_CHECK(*shape == r.shape, source, ": tensor '", r.name, "' has shape ", to_string(*shape), ", the model needs ",
              to_string(r.shape));
    HostTensor same = hf.read(r.name);
    meter.hold(same.data.size() * sizeof(float));
    check_values(source, r.name, same, rule);
    return same;
  }
  const i64 rows = rows_of(r.shape), cols = r.shape.back();
  HostTensor full{r.shape, std::vector<float>(static_cast<std::size_t>(rows * cols))};
  meter.hold(full.data.size() * sizeof(float));
  for (const HfPart& p : r.parts) {
    const Shape* shape = hf.shape(p.name);
    STP_CHECK(shape != nullptr, source, ": tensor '", p.name, "' is missing");
    const Shape want = hf_part_shape(r, p);
    STP_CHECK(*shape == want, source, ": tensor '", p.name, "' has shape ", to_string(*shape), ", the model needs ",
              to_string(want));
    const HostTensor part = hf.read(p.name);
    meter.hold(part.data.size() * sizeof(float));
    check_values(source, p.name, part, rule);
    const i64 w = p.end - p.begin;
    const float* src = part.data.data();
    for (i64 i = 0; i < rows; ++i)
      for (i64 j = 0; j < w; ++j)
        full.data[static_cast<std::size_t>(i * cols + p.begin + j)] =
            src[static_cast<std::size_t>(p.transpose ? j * rows + i : i * w + j)];
    meter.release(part.data.size() * sizeof(float));
  }
  return full;
}

std::map<std::string, HostTensor> from_hf(const std::vector<HfTensorRule>& rules,
                                          const std::map<std::string, HostTensor>& hf, const std::string& source,
                                          ValueRule rule) {
  const TensorMapSource tensors(hf);
  const bool stp_names = stp_named(rules, tensors);
  PageableMeter meter;
  std::map<std::string, HostTensor> out;
  for (const HfTensorRule& r : rules) out.emplace(r.name, from_hf_tensor(r, tensors, stp_names, source, rule, meter));
  return out;
}

}  // namespace stp
