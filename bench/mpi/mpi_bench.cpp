// shmdist-mpi-bench: the loops of shmdist-bench (bench/common/osu_loops.hpp) run over MPI, so
// that shmdist and an MPI library on the same host are measured by identical code and print
// identical formats. Not OSU's code: the loops are ours, written after OSU's conventions.
//
//   mpirun -n 2 --mca pml ob1 --mca btl self,vader shmdist-mpi-bench latency
//   mpirun -n 3 --oversubscribe --mca mpi_yield_when_idle 1 shmdist-mpi-bench anysource
//   mpirun -n 2 --mca pml ob1 --mca btl self,vader shmdist-mpi-bench allreduce
#include <mpi.h>

#include <cstdio>
#include <functional>
#include <string>

#include "cli.hpp"
#include "osu_loops.hpp"

namespace {

class MpiComm {
 public:
  struct Buffer {
    void* data;
    int count;
  };
  using Request = MPI_Request;
  static constexpr int kAnySource = -1;  // mapped to MPI_ANY_SOURCE below

  MpiComm(int* argc, char*** argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiComm() { MPI_Finalize(); }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string name() const { return "MPI"; }
  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  std::string detail() const {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(text, &len);
    std::string v(text, static_cast<std::size_t>(len));
    const auto cut = v.find_first_of(",\n");
    return cut == std::string::npos ? v : v.substr(0, cut);
  }

  Buffer buffer(std::byte* data, std::size_t n) { return {data, static_cast<int>(n)}; }
  void barrier() { MPI_Barrier(MPI_COMM_WORLD); }
  void send(const Buffer& b, int dst, int tag) {
    MPI_Send(b.data, b.count, MPI_CHAR, dst, tag, MPI_COMM_WORLD);
  }
  int recv(Buffer& b, int src, int tag) {
    MPI_Status st;
    MPI_Recv(b.data, b.count, MPI_CHAR, source(src), tag, MPI_COMM_WORLD, &st);
    return st.MPI_SOURCE;
  }
  Request isend(const Buffer& b, int dst, int tag) {
    MPI_Request r;
    MPI_Isend(b.data, b.count, MPI_CHAR, dst, tag, MPI_COMM_WORLD, &r);
    return r;
  }
  Request irecv(Buffer& b, int src, int tag) {
    MPI_Request r;
    MPI_Irecv(b.data, b.count, MPI_CHAR, source(src), tag, MPI_COMM_WORLD, &r);
    return r;
  }
  // The collectives, as osu_allreduce and friends call them (in place where shmdist is).
  std::function<void()> prepare(bench::Collective k, float* in, float* out, std::size_t count) {
    using bench::Collective;
    const int c = static_cast<int>(count);
    const bool root = rank_ == 0;
    switch (k) {
      case Collective::AllReduce:
        return [=] { MPI_Allreduce(MPI_IN_PLACE, out, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
      case Collective::Bcast:
        return [=] { MPI_Bcast(out, c, MPI_FLOAT, 0, MPI_COMM_WORLD); };
      case Collective::Reduce:
        return [=] {
          MPI_Reduce(root ? MPI_IN_PLACE : out, root ? out : nullptr, c, MPI_FLOAT, MPI_SUM, 0,
                     MPI_COMM_WORLD);
        };
      case Collective::AllGather:
        return [=] { MPI_Allgather(in, c, MPI_FLOAT, out, c, MPI_FLOAT, MPI_COMM_WORLD); };
      case Collective::ReduceScatter:
        return [=] { MPI_Reduce_scatter_block(in, out, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
      case Collective::AllToAll:
        return [=] { MPI_Alltoall(in, c, MPI_FLOAT, out, c, MPI_FLOAT, MPI_COMM_WORLD); };
    }
    return [] {};
  }
  double mean(double v) {
    double sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum / size_;
  }

  void wait_all(std::vector<Request>& reqs) {
    MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  }
  [[noreturn]] void fail(const std::string& why) {
    std::fflush(stdout);
    std::fprintf(stderr, "shmdist-mpi-bench: %s\n", why.c_str());
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::exit(3);
  }

 private:
  static int source(int src) { return src == kAnySource ? MPI_ANY_SOURCE : src; }
  int rank_ = 0;
  int size_ = 1;
};
static_assert(bench::Comm<MpiComm>);
static_assert(bench::CollComm<MpiComm>);

}  // namespace

int main(int argc, char** argv) {
  const bench::Command cmd = bench::parse_command_line(
      argc, argv,
      "shmdist-mpi-bench: shmdist-bench's loops over MPI. Run under mpirun, for example: "
      "mpirun -n 2 --mca btl self,vader shmdist-mpi-bench latency");
  MpiComm comm(&argc, &argv);
  if (cmd.options.dtype != "float32")
    comm.fail("--dtype " + cmd.options.dtype + ": MPI has no 16-bit floating type; this twin "
              "measures float32 only");
  if (cmd.collective)
    bench::run_collective(comm, cmd.coll, cmd.options, comm.name(), comm.detail(),
                          [&](const std::string& why) { comm.fail(why); });
  else
    bench::run_test(comm, cmd.test, cmd.options);
  return 0;
}
