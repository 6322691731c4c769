#include "core/cpu/dry_stream.h"

#include "core/cpu/cpu_device.h"
#include "core/cpu/cpu_stream.h"

namespace stp {

void DryStream::record(Event& event) {
  auto& state = as_cpu_event(event).state();
  state->complete(state->mark_recorded());
}

bool is_dry(Stream& stream) { return dynamic_cast<DryStream*>(&stream) != nullptr; }

bool is_dry(const Device& device) {
  auto* cpu = dynamic_cast<const CpuDevice*>(&device);
  return cpu && cpu->options().dry_run;
}

namespace {

class NullComm final : public Communicator {
 public:
  NullComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Stream&, float*, std::size_t) override {}
  void all_reduce_max(Stream&, float*, std::size_t) override {}
  void reduce_scatter_sum(Stream&, float*, std::size_t) override {}
  void all_gather(Stream&, float*, std::size_t) override {}
  void all_gather_bf16(Stream&, bf16*, std::size_t) override {}
  void send(Stream&, const void*, std::size_t, int, std::uint32_t) override {}
  void recv(Stream&, void*, std::size_t, int, std::uint32_t) override {}
  void barrier(Stream&) override {}
  void abort(const std::string&) override {}
  std::uint64_t bytes_sent() const override { return 0; }

 private:
  int rank_, size_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_null_comms(int size) {
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<NullComm>(r, size));
  return out;
}

}  // namespace stp
