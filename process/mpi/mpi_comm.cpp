#include "process/mpi/mpi_comm.h"

#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "core/cpu/cpu_stream.h"

namespace stp::mpi {

namespace {

constexpr int kDataTag = 7;
constexpr std::uint32_t kMagic = 0x53545032;  // "STP2"

struct Header {
  std::uint32_t magic;
  std::uint32_t tag;
  std::uint64_t bytes;
};
static_assert(sizeof(Header) == 16);

int to_count(std::size_t n, const char* what) {
  STP_CHECK(n <= static_cast<std::size_t>(INT_MAX), what, " of ", n,
            " elements is larger than an MPI count allows (INT_MAX); this communicator cannot move it in one piece");
  return static_cast<int>(n);
}

class MpiComm final : public Communicator {
 public:
  MpiComm(MPI_Comm comm, std::shared_ptr<JobAbort> abort) : comm_(comm), abort_(std::move(abort)) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  ~MpiComm() override {
    // After an abort peers may be gone and requests pending for ever: the process is ending.
    if (abort_->aborted()) return;
    try {
      std::lock_guard<std::mutex> lock(sends_mu_);
      for (auto& s : sends_) wait(s.request, *abort_);
      sends_.clear();
    } catch (...) {
      return;
    }
    (void)MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t bytes_sent() const override { return bytes_sent_.load(); }

  void abort(const std::string& why) override { abort_->raise(why); }

  void all_reduce_sum(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += count * sizeof(float);
    submit(stream, [this, data, count](Turn& turn) { all_reduce(turn, data, count); });
  }

  void all_reduce_max(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += count * sizeof(float);
    submit(stream, [this, data, count](Turn& turn) {
      if (size_ == 1 || count == 0) return;
      MPI_Request request;
      check(
          MPI_Iallreduce(MPI_IN_PLACE, data, to_count(count, "a max all-reduce"), MPI_FLOAT, MPI_MAX, comm_, &request),
          "MPI_Iallreduce");
      turn.pass();
      wait(request, *abort_);
    });
  }

  void reduce_scatter_sum(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, size_).count) * sizeof(float);
    submit(stream, [this, data, count](Turn& turn) {
      reduce_my_slice(data, count);
      turn.pass();
    });
  }

  void all_gather(Stream& stream, float* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, size_).count) * sizeof(float);
    submit(stream, [this, data, count](Turn& turn) { gather_slices(turn, data, count, MPI_FLOAT); });
  }

  // bf16 has no MPI type: its slices travel as 16-bit integers (the bits, unchanged).
  void all_gather_bf16(Stream& stream, bf16* data, std::size_t count) override {
    bytes_sent_ += (count - comm_slice(count, rank_, size_).count) * sizeof(bf16);
    submit(stream, [this, data, count](Turn& turn) { gather_slices(turn, data, count, MPI_UINT16_T); });
  }

  void barrier(Stream& stream) override {
    submit(stream, [this](Turn& turn) {
      MPI_Request request;
      check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
      turn.pass();
      wait(request, *abort_);
    });
  }

  void send(Stream& stream, const void* data, std::size_t bytes, int peer, std::uint32_t tag) override {
    check_peer(peer);
    bytes_sent_ += bytes;
    submit(stream, [this, data, bytes, peer, tag](Turn&) {
      collect_finished_sends();
      PendingSend s;
      s.bytes = sizeof(Header) + bytes;
      s.buffer = std::make_unique<char[]>(s.bytes);
      Header h{kMagic, tag, bytes};
      std::memcpy(s.buffer.get(), &h, sizeof h);
      if (bytes) std::memcpy(s.buffer.get() + sizeof h, data, bytes);
      check(MPI_Isend(s.buffer.get(), to_count(s.bytes, "a message"), MPI_BYTE, peer, kDataTag, comm_, &s.request),
            "MPI_Isend");
      std::lock_guard<std::mutex> lock(sends_mu_);
      sends_.push_back(std::move(s));
    });
  }

  void recv(Stream& stream, void* data, std::size_t bytes, int peer, std::uint32_t tag) override {
    check_peer(peer);
    submit(stream, [this, data, bytes, peer, tag](Turn& turn) {
      std::vector<char> buffer(sizeof(Header) + bytes);
      MPI_Request request;
      check(MPI_Irecv(buffer.data(), to_count(buffer.size(), "a message"), MPI_BYTE, peer, kDataTag, comm_, &request),
            "MPI_Irecv");
      turn.pass();
      std::string expected =
          str("p2p channel ", peer, "->", rank_, ": expected message tag ", tag, " of ", bytes, " bytes");
      MPI_Status status;
      try {
        status = wait(request, *abort_);
      } catch (const CommunicatorAborted&) {
        throw;
      } catch (const Error& e) {  // e.g. MPI_ERR_TRUNCATE: the message was longer than expected
        throw Error(str(expected, ", receiving failed: ", e.what()));
      }
      int got = 0;
      check(MPI_Get_count(&status, MPI_BYTE, &got), "MPI_Get_count");
      Header h{};
      if (static_cast<std::size_t>(got) >= sizeof h) std::memcpy(&h, buffer.data(), sizeof h);
      if (static_cast<std::size_t>(got) != buffer.size() || h.magic != kMagic || h.tag != tag || h.bytes != bytes)
        throw Error(str(expected, ", got tag ", h.tag, " of ", h.bytes, " bytes"));
      if (bytes) std::memcpy(data, buffer.data() + sizeof h, bytes);
    });
  }

 private:
  // The right to post MPI calls on this communicator: operations post in ticket (host issue) order.
  class Turn {
   public:
    Turn(MpiComm& c, std::uint64_t ticket) : c_(c) {
      std::unique_lock<std::mutex> lock(c_.turn_mu_);
      for (int i = 0; !c_.turn_cv_.wait_for(lock, kMaxPollSleep, [&] { return c_.turn_ == ticket; }); ++i) {
        lock.unlock();
        if (c_.abort_->poll()) c_.abort_->throw_aborted();
        lock.lock();
      }
      held_ = true;
    }
    ~Turn() { pass(); }
    void pass() {
      if (!held_) return;
      held_ = false;
      std::lock_guard<std::mutex> lock(c_.turn_mu_);
      ++c_.turn_;
      c_.turn_cv_.notify_all();
    }

   private:
    MpiComm& c_;
    bool held_ = false;
  };

  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<char[]> buffer;
    std::size_t bytes = 0;
  };

  // Enqueues op on the stream (always runs, even after an earlier error of the stream, so peers
  // never wait for an operation that was skipped). An error inside op aborts the job.
  template <typename Op>
  void submit(Stream& stream, Op op) {
    std::uint64_t ticket = next_ticket_++;
    as_cpu_stream(stream).enqueue(
        [this, ticket, op = std::move(op)]() mutable {
          try {
            Turn turn(*this, ticket);  // also passes the turn when the operation throws
            if (abort_->poll()) abort_->throw_aborted();
            op(turn);
          } catch (const CommunicatorAborted&) {
            throw;
          } catch (const std::exception& e) {
            abort_->raise(e.what());
            throw;
          }
        },
        true);
  }

  // An all-reduce in two halves: reduce_my_slice sums this rank's slice (comm_slice) over the
  // ranks in rank order, then gather_slices shares the slices.
  void all_reduce(Turn& turn, float* data, std::size_t count) {
    if (size_ == 1 || count == 0) return;
    reduce_my_slice(data, count);
    gather_slices(turn, data, count, MPI_FLOAT);
  }

  void reduce_my_slice(float* data, std::size_t count) {
    const auto n = static_cast<std::size_t>(size_);
    if (n == 1 || count == 0) return;
    std::vector<int> slice(n), offset(n), mine(n), mine_at(n);
    for (std::size_t r = 0; r < n; ++r) {
      CommSlice c = comm_slice(count, static_cast<int>(r), size_);
      slice[r] = to_count(c.count, "a collective's slice");
      offset[r] = to_count(c.first, "a collective's offset");
    }
    const CommSlice me = comm_slice(count, rank_, size_);
    for (std::size_t r = 0; r < n; ++r) {
      mine[r] = to_count(me.count, "a collective's slice");
      mine_at[r] = to_count(r * me.count, "a collective's buffer");
    }
    std::vector<float> copies(n * me.count);  // [rank r's copy of my slice]
    MPI_Request request;
    check(MPI_Ialltoallv(data, slice.data(), offset.data(), MPI_FLOAT, copies.data(), mine.data(), mine_at.data(),
                         MPI_FLOAT, comm_, &request),
          "MPI_Ialltoallv");
    wait(request, *abort_);
    float* out = data + me.first;
    for (std::size_t i = 0; i < me.count; ++i) {
      float s = copies[i];
      for (std::size_t r = 1; r < n; ++r) s += copies[r * me.count + i];
      out[i] = s;
    }
  }

  void gather_slices(Turn& turn, void* data, std::size_t count, MPI_Datatype type) {
    const auto n = static_cast<std::size_t>(size_);
    if (n == 1 || count == 0) return;
    std::vector<int> slice(n), offset(n);
    for (std::size_t r = 0; r < n; ++r) {
      CommSlice c = comm_slice(count, static_cast<int>(r), size_);
      slice[r] = to_count(c.count, "a collective's slice");
      offset[r] = to_count(c.first, "a collective's offset");
    }
    MPI_Request request;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, slice.data(), offset.data(), type, comm_, &request),
          "MPI_Iallgatherv");
    turn.pass();
    wait(request, *abort_);
  }

  void collect_finished_sends() {
    std::lock_guard<std::mutex> lock(sends_mu_);
    while (!sends_.empty()) {
      int done = 0;
      check(MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) break;
      sends_.pop_front();
    }
  }

  void check_peer(int peer) const {
    STP_ASSERT(peer >= 0 && peer < size_ && peer != rank_, "bad p2p peer ", peer, " for rank ", rank_, " of ", size_);
  }

  MPI_Comm comm_;
  std::shared_ptr<JobAbort> abort_;
  int rank_ = 0, size_ = 1;
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> next_ticket_{0};
  std::mutex turn_mu_;
  std::condition_variable turn_cv_;
  std::uint64_t turn_ = 0;
  std::mutex sends_mu_;
  std::deque<PendingSend> sends_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_comm(MPI_Comm comm, std::shared_ptr<JobAbort> abort) {
  return std::make_unique<MpiComm>(comm, std::move(abort));
}

}  // namespace stp::mpi
