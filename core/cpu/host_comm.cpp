// HostComm: the CPU backend's communicator. Ranks are stream worker threads of one process that
// meet in shared memory.
//
// Collectives rendezvous by sequence number (the k-th collective call of every rank meets in
// slot k). all_reduce_sum is a two-phase exchange: each rank sums its slice of the vector over
// all ranks *in rank order* into a shared scratch buffer (so the result is bitwise identical on
// every rank and from run to run), a barrier, then every rank copies the scratch back;
// all_reduce_max is the same exchange taking the maximum.
// reduce_scatter_sum is the first phase with each rank's slice (comm_slice) written straight to
// its own buffer; all_gather is the second with every rank copying the other ranks' slices.
// Point-to-point sends are buffered (the sender's stream continues at once); a receive waits
// for the oldest message on its (src -> dst) channel and checks its tag and size.
#include <atomic>
#include <chrono>
#include <thread>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "core/comm.h"
#include "core/cpu/cpu_stream.h"
#include "base/error.h"

namespace stp {

namespace {

struct Message {
  std::uint32_t tag;
  std::vector<char> bytes;
};

enum class CollectiveKind { AllReduce, AllReduceMax, ReduceScatter, AllGather, AllGatherBf16 };

const char* name_of(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::ReduceScatter: return "reduce-scatter";
    case CollectiveKind::AllGather: return "all-gather";
    case CollectiveKind::AllGatherBf16: return "bf16 all-gather";
    case CollectiveKind::AllReduceMax: return "max all-reduce";
    case CollectiveKind::AllReduce: break;
  }
  return "all-reduce";
}

// The all-reduces leave the whole result in every rank's buffer (via the shared scratch).
bool whole(CollectiveKind k) { return k == CollectiveKind::AllReduce || k == CollectiveKind::AllReduceMax; }

struct Collective {
  std::vector<float*> ptrs;
  std::vector<CollectiveKind> kinds;
  std::vector<std::size_t> counts;
  std::vector<float> scratch;
  int arrived = 0, reduced = 0, copied = 0, left = 0;
};

struct HostGroup {
  HostGroup(int n, HostCommOptions o) : size(n), options(o) {}
  const int size;
  const HostCommOptions options;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string abort_reason;
  std::map<std::uint64_t, Collective> collectives;
  std::map<std::pair<int, int>, std::deque<Message>> channels;  // (src, dst) -> messages

  // Waits (lock held) until pred() or abort; throws on abort.
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    cv.wait(lock, [&] { return aborted || pred(); });
    if (aborted) throw CommunicatorAborted("communicator aborted: " + abort_reason);
  }
  void abort_locked(const std::string& why) {
    if (!aborted) abort_reason = why;
    aborted = true;
    cv.notify_all();
  }
};

class HostComm final : public Communicator {
 public:
  HostComm(std::shared_ptr<HostGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(); }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(group_->mu);
    group_->abort_locked(str("rank ", rank_, ": ", why));
  }

  void all_reduce_sum(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += count * sizeof(float);
    enqueue_collective(stream, data, count, CollectiveKind::AllReduce);
  }

  void all_reduce_max(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += count * sizeof(float);
    enqueue_collective(stream, data, count, CollectiveKind::AllReduceMax);
  }

  void reduce_scatter_sum(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, group_->size).count) * sizeof(float);
    enqueue_collective(stream, data, count, CollectiveKind::ReduceScatter);
  }

  void all_gather(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, group_->size).count) * sizeof(float);
    enqueue_collective(stream, data, count, CollectiveKind::AllGather);
  }

  void all_gather_bf16(Stream& stream, bf16* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, group_->size).count) * sizeof(bf16);
    // The collective table keeps float pointers; a bf16 all-gather only copies bytes through it.
    enqueue_collective(stream, reinterpret_cast<float*>(data), count, CollectiveKind::AllGatherBf16);
  }

  void barrier(Stream& stream) override { enqueue_collective(stream, nullptr, 0, CollectiveKind::AllReduce); }

  void send(Stream& stream, const void* data, std::size_t bytes, int peer, std::uint32_t tag) override {
    check_peer(peer);
    bytes_sent_ += bytes;
    as_cpu_stream(stream).enqueue(
        [g = group_, src = rank_, data, bytes, peer, tag] {
          Message msg{tag, std::vector<char>(static_cast<const char*>(data), static_cast<const char*>(data) + bytes)};
          std::lock_guard<std::mutex> lock(g->mu);
          g->channels[{src, peer}].push_back(std::move(msg));
          g->cv.notify_all();
        },
        true);
  }

  void recv(Stream& stream, void* data, std::size_t bytes, int peer, std::uint32_t tag) override {
    check_peer(peer);
    as_cpu_stream(stream).enqueue(
        [g = group_, dst = rank_, data, bytes, peer, tag] {
          std::unique_lock<std::mutex> lock(g->mu);
          auto& channel = g->channels[{peer, dst}];
          g->wait(lock, [&] { return !channel.empty(); });
          Message msg = std::move(channel.front());
          channel.pop_front();
          if (msg.tag != tag || msg.bytes.size() != bytes) {
            std::string why = str("p2p channel ", peer, "->", dst, ": expected message tag ", tag, " of ", bytes,
                                  " bytes, got tag ", msg.tag, " of ", msg.bytes.size(), " bytes");
            g->abort_locked(why);
            throw Error(why);
          }
          lock.unlock();
          if (bytes) std::memcpy(data, msg.bytes.data(), bytes);
        },
        true);
  }

 private:
  void check_peer(int peer) const {
    STP_ASSERT(peer >= 0 && peer < group_->size && peer != rank_, "bad p2p peer ", peer, " for rank ", rank_, " of ",
               group_->size);
  }

  void enqueue_collective(Stream& stream, float* data, std::size_t count, CollectiveKind kind) {
    std::uint64_t seq = next_seq_++;  // issue order on this rank's host thread
    as_cpu_stream(stream).enqueue(
        [g = group_, rank = rank_, seq, data, count, kind] { run_collective(*g, rank, seq, data, count, kind); }, true);
  }

  // The emulated link carries an all-reduce's buffer in all_reduce_bytes_per_s; a reduce-scatter
  // or an all-gather is half of an all-reduce's traffic.
  static void run_collective(HostGroup& g, int rank, std::uint64_t seq, float* data, std::size_t count,
                             CollectiveKind kind) {
    auto start = std::chrono::steady_clock::now();
    reduce(g, rank, seq, data, count, kind);
    if (kind != CollectiveKind::AllReduce && kind != CollectiveKind::AllReduceMax) count /= 2;
    const std::size_t element = kind == CollectiveKind::AllGatherBf16 ? sizeof(bf16) : sizeof(float);
    if (g.options.all_reduce_bytes_per_s > 0 && count > 0) {  // the emulated link's transfer time
      std::chrono::duration<double> t(static_cast<double>(count * element) / g.options.all_reduce_bytes_per_s);
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(t));
    }
  }

  static void reduce(HostGroup& g, int rank, std::uint64_t seq, float* data, std::size_t count, CollectiveKind kind) {
    const int n = g.size;
    std::unique_lock<std::mutex> lock(g.mu);
    Collective& c = g.collectives[seq];
    if (c.ptrs.empty()) {
      c.ptrs.assign(static_cast<std::size_t>(n), nullptr);
      c.counts.assign(static_cast<std::size_t>(n), 0);
      c.kinds.assign(static_cast<std::size_t>(n), kind);
    }
    c.ptrs[static_cast<std::size_t>(rank)] = data;
    c.counts[static_cast<std::size_t>(rank)] = count;
    c.kinds[static_cast<std::size_t>(rank)] = kind;
    if (++c.arrived == n) {
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<std::size_t>(r);
        if (c.kinds[i] != kind) {
          g.abort_locked(str("collective #", seq, ": rank ", r, " issued a ", name_of(c.kinds[i]), ", rank ", rank,
                             " a ", name_of(kind)));
        } else if (c.counts[i] != count) {
          g.abort_locked(str(name_of(kind), " #", seq, ": rank ", r, " has ", c.counts[i], " elements, rank ", rank,
                             " has ", count));
        }
      }
      if (whole(kind)) c.scratch.resize(count);
      g.cv.notify_all();
    }
    g.wait(lock, [&] { return c.arrived == n; });
    lock.unlock();

    // Phase 1: my slice of the sum, accumulated in rank order (into my own buffer for a
    // reduce-scatter: no other rank reads my slice of it).
    const CommSlice mine = comm_slice(count, rank, n);
    const bool gather = kind == CollectiveKind::AllGather || kind == CollectiveKind::AllGatherBf16;
    if (!gather) {
      float* out = whole(kind) ? c.scratch.data() : data;
      const bool max = kind == CollectiveKind::AllReduceMax;
      for (std::size_t i = mine.first; i < mine.first + mine.count; ++i) {
        float s = c.ptrs[0][i];
        for (int r = 1; r < n; ++r) {
          const float x = c.ptrs[static_cast<std::size_t>(r)][i];
          s = max ? (x > s ? x : s) : s + x;
        }
        out[i] = s;
      }
    }
    lock.lock();
    if (++c.reduced == n) g.cv.notify_all();
    g.wait(lock, [&] { return c.reduced == n; });
    lock.unlock();

    // Phase 2: everyone takes the full result (an all-gather: the other ranks' slices).
    if (whole(kind)) {
      if (count) std::memcpy(data, c.scratch.data(), count * sizeof(float));
    } else if (gather) {
      const std::size_t element = kind == CollectiveKind::AllGatherBf16 ? sizeof(bf16) : sizeof(float);
      auto* mine_bytes = reinterpret_cast<char*>(data);
      for (int r = 0; r < n; ++r) {
        const CommSlice s = comm_slice(count, r, n);
        const auto* theirs = reinterpret_cast<const char*>(c.ptrs[static_cast<std::size_t>(r)]);
        if (r != rank && s.count)
          std::memcpy(mine_bytes + s.first * element, theirs + s.first * element, s.count * element);
      }
      // The others read my buffer until they are done: nobody leaves before everyone copied.
      lock.lock();
      if (++c.copied == n) g.cv.notify_all();
      g.wait(lock, [&] { return c.copied == n; });
      lock.unlock();
    }
    lock.lock();
    if (++c.left == n) g.collectives.erase(seq);
  }

  std::shared_ptr<HostGroup> group_;
  int rank_;
  std::uint64_t next_seq_ = 0;
  std::atomic<std::uint64_t> bytes_sent_{0};
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_comms(int size, const HostCommOptions& options) {
  STP_CHECK(size >= 1, "communicator size must be >= 1, got ", size);
  auto group = std::make_shared<HostGroup>(size, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<HostComm>(group, r));
  return comms;
}

}  // namespace stp
