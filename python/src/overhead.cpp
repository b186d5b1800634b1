// Loops in C++ for bench/torch/overhead.py, which measures how much the Python layer adds per
// operation: the same sends and receives from Python (torch.distributed), through torch's C++
// ProcessGroup interface (what torch's bindings call: any backend, gloo too), and through
// shmdist's own C++ API (backend "shm" only). Not part of the API.

#include "overhead.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define SHMDIST_HAVE_CALLGRIND 1
#endif

#include <chrono>

#include "backend.hpp"
#include "tensor_bridge.hpp"

namespace shmdist::torch_backend {
namespace {

enum class Step { Send, Recv, AllReduce };

// The steps of one iteration on this rank.
std::vector<Step> steps(const std::string& pattern, int me) {
  if (pattern == "send") return {Step::Send};
  if (pattern == "recv") return {Step::Recv};
  if (pattern == "allreduce") return {Step::AllReduce};
  TORCH_CHECK(pattern == "pingpong", "_cxx_loop: pattern is 'pingpong', 'send', 'recv' or "
              "'allreduce', got '", pattern, "'");
  return me == 0 ? std::vector<Step>{Step::Send, Step::Recv}
                 : std::vector<Step>{Step::Recv, Step::Send};
}

}  // namespace

double cxx_loop(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& path,
                const std::string& pattern, at::Tensor tensor, int peer, int iterations, int tag) {
  const std::vector<Step> plan = steps(pattern, pg->getRank());
  TORCH_CHECK(path == "c10d" || path == "shmdist",
              "_cxx_loop: path is 'c10d' or 'shmdist', got '", path, "'");
  const auto start = std::chrono::steady_clock::now();
  if (path == "c10d") {
    std::vector<at::Tensor> ts{tensor};
    for (int i = 0; i < iterations; ++i)
      for (Step s : plan) {
        if (s == Step::AllReduce) pg->allreduce(ts)->wait();  // SUM over the whole group
        else (s == Step::Send ? pg->send(ts, peer, tag) : pg->recv(ts, peer, tag))->wait();
      }
  } else {
    const auto backend = cpu_backend_of(pg);
    auto* shm = dynamic_cast<ProcessGroupShm*>(backend.get());
    TORCH_CHECK(shm != nullptr, "_cxx_loop: path 'shmdist' needs a group of backend 'shm'");
    BoundTensor b = bind(tensor, "_cxx_loop");
    ProcessGroup& core = shm->job()->pg;
    const int to = shm->members().at(static_cast<std::size_t>(peer));
    for (int i = 0; i < iterations; ++i)
      for (Step s : plan) {
        if (s == Step::Send) core.send(b.view, to, shm->group(), tag);
        else if (s == Step::Recv) core.recv(b.view, to, shm->group(), tag);
        else core.all_reduce(b.view, ReduceOp::SUM, shm->group());
      }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool callgrind(const std::string& what) {
#ifdef SHMDIST_HAVE_CALLGRIND
  if (!RUNNING_ON_VALGRIND) return false;
  if (what == "zero") {
    CALLGRIND_ZERO_STATS;
  } else {
    CALLGRIND_DUMP_STATS_AT(what.c_str());
  }
  return true;
#else
  (void)what;
  return false;
#endif
}

}  // namespace shmdist::torch_backend
