// shmdist-bench: OSU Micro-Benchmarks-style point-to-point figures for shmdist.
//
//   shmrun -n 2 shmdist-bench latency     # ping-pong, half round trip, us
//   shmrun -n 2 shmdist-bench bw          # window of 64 isends, then an ack; MB/s (10^6 B)
//   shmrun -n 2 shmdist-bench bibw
//   shmrun -n N shmdist-bench anysource   # rank 0 receives with ANY_SOURCE from N-1 senders
//   shmrun -n 2 shmdist-bench idle        # CPU of a rank blocked in recv, % of one core
//   shmrun -n N shmdist-bench allreduce   # also bcast, reduce, allgather, reduce_scatter,
//                                         # alltoall: OSU style, float32, avg us per call
//   shmrun -n 2 shmdist-bench --dtype bfloat16 allreduce   # the same bytes as bfloat16
//
// Only the public API is used, as a user program would: messages are uint8 tensors over
// 64-byte aligned buffers (Tensor::from_blob), built once per message size.
#include <cstdio>
#include <exception>
#include <functional>

#include <shmdist/shmdist.hpp>

#include "cli.hpp"
#include "osu_loops.hpp"

namespace {

class ShmdistComm {
 public:
  using Buffer = shmdist::Tensor;
  using Request = shmdist::Work;
  static constexpr int kAnySource = shmdist::ANY_SOURCE;

  ShmdistComm() {
    shmdist::init_process_group("shm");
    rank_ = shmdist::get_rank();
    size_ = shmdist::get_world_size();
  }
  ~ShmdistComm() { shmdist::destroy_process_group(); }
  ShmdistComm(const ShmdistComm&) = delete;
  ShmdistComm& operator=(const ShmdistComm&) = delete;

  void set_dtype(const std::string& name) {
    dtype_ = name == "bfloat16" ? shmdist::kBFloat16
             : name == "float16" ? shmdist::kFloat16
                                 : shmdist::kFloat32;
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return "shmdist"; }
  std::string detail() const { return {}; }

  Buffer buffer(std::byte* data, std::size_t n) {
    return shmdist::Tensor::from_blob(data, {static_cast<std::int64_t>(n)}, shmdist::kUInt8);
  }
  void barrier() { shmdist::barrier(); }
  void send(const Buffer& b, int dst, int tag) { shmdist::send(b, dst, {}, tag); }
  int recv(Buffer& b, int src, int tag) { return shmdist::recv(b, src, {}, tag); }
  Request isend(const Buffer& b, int dst, int tag) { return shmdist::isend(b, dst, {}, tag); }
  Request irecv(Buffer& b, int src, int tag) { return shmdist::irecv(b, src, {}, tag); }
  // Collectives on tensors of dtype() over the caller's float buffers (`n` floats' bytes),
  // built once per size.
  std::function<void()> prepare(bench::Collective k, float* in, float* out, std::size_t count) {
    using bench::Collective;
    auto t = [d = dtype_](float* p, std::size_t n) {
      const std::size_t elements = n * sizeof(float) / shmdist::element_size(d);
      return shmdist::Tensor::from_blob(p, {static_cast<std::int64_t>(elements)}, d);
    };
    const auto n = static_cast<std::size_t>(size_);
    switch (k) {
      case Collective::AllReduce:
        return [x = t(out, count)]() mutable { shmdist::all_reduce(x); };
      case Collective::Bcast:
        return [x = t(out, count)]() mutable { shmdist::broadcast(x, 0); };
      case Collective::Reduce:
        return [x = t(out, count)]() mutable { shmdist::reduce(x, 0); };
      case Collective::AllGather:
        return [o = t(out, count * n), i = t(in, count)]() mutable {
          shmdist::all_gather_into_tensor(o, i);
        };
      case Collective::ReduceScatter:
        return [o = t(out, count), i = t(in, count * n)]() mutable {
          shmdist::reduce_scatter_tensor(o, i);
        };
      case Collective::AllToAll:
        return [o = t(out, count * n), i = t(in, count * n)]() mutable {
          shmdist::all_to_all_single(o, i);
        };
    }
    return [] {};
  }
  double mean(double v) {
    shmdist::Tensor x = shmdist::Tensor::from_blob(&v, {1}, shmdist::kFloat64);
    shmdist::all_reduce(x, shmdist::ReduceOp::AVG);
    return v;
  }

  void wait_all(std::vector<Request>& reqs) {
    for (Request& r : reqs) r.wait();
  }
  // The launcher stops the other ranks when one exits non-zero (fail-fast).
  [[noreturn]] void fail(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "shmdist-bench: %s\n", why.c_str());
    std::exit(3);
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  shmdist::DType dtype_ = shmdist::kFloat32;
};
static_assert(bench::Comm<ShmdistComm>);
static_assert(bench::CollComm<ShmdistComm>);

}  // namespace

int main(int argc, char** argv) {
  const bench::Command cmd = bench::parse_command_line(
      argc, argv,
      "shmdist-bench: OSU-style point-to-point benchmarks for shmdist. Run under the launcher, "
      "for example: shmrun -n 2 shmdist-bench latency");
  try {
    ShmdistComm comm;
    comm.set_dtype(cmd.options.dtype);
    if (cmd.collective)
      bench::run_collective(comm, cmd.coll, cmd.options, comm.name(), comm.detail(),
                            [&](const std::string& why) { comm.fail(why); });
    else
      bench::run_test(comm, cmd.test, cmd.options);
  } catch (const shmdist::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shmdist-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
