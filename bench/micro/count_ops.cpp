// shmdist-count: drives every rank of a thread-mode job from ONE thread, so that a run does
// exactly the work of the operations and never waits (each receive finds its message in the
// ring already). Made for instruction counts, not for time:
//
//   valgrind --tool=callgrind build/bench/shmdist-count pingpong --iterations=10000
//
// Run it twice with different --iterations and divide the difference of the totals by the
// difference of the iterations: that removes start-up and leaves the instructions per
// operation. What one iteration is:
//   pingpong   rank 0 send, rank 1 recv, rank 1 send, rank 0 recv (one round trip)
//   stream     rank 1 posts --window irecvs, rank 0 isends --window messages, both wait all
//              (one OSU bw window without the ack): divide by the window for per message
//   anysource  ranks 1..R-1 each send one message, rank 0 receives R-1 with ANY_SOURCE
//   rate       rank 0 posts (R-1) * --window ANY_SOURCE irecvs, ranks 1..R-1 each isend
//              --window messages, all wait for all (one window of the anysource message-rate
//              loop without the acks): divide by (R-1) * window for per message
// All through the public ProcessGroup API, as shmdist-bench does. The job is not destroyed
// (that would wait for peers driven by this same thread): the process just exits.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <shmdist/shmdist.hpp>

#include "pg/impl.hpp"
#include "segment/layout.hpp"

namespace {

struct Options {
  std::string test = "pingpong";
  long iterations = 1000;
  std::size_t size = 8;
  int ranks = 3;
  int window = 64;
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: shmdist-count pingpong|stream|anysource|rate [--iterations=N] [--size=B] "
               "[--ranks=R] [--window=W]\n");
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> const char* {
      return a.substr(0, name.size()) == name ? argv[i] + name.size() : nullptr;
    };
    if (const char* v = value("--iterations=")) o.iterations = std::atol(v);
    else if (const char* s = value("--size=")) o.size = static_cast<std::size_t>(std::atol(s));
    else if (const char* r = value("--ranks=")) o.ranks = std::atoi(r);
    else if (const char* w = value("--window=")) o.window = std::atoi(w);
    else if (!a.empty() && a[0] != '-') o.test = std::string(a);
    else usage();
  }
  if (o.iterations < 0 || o.ranks < 2 || o.window < 1) usage();
  return o;
}

using shmdist::ProcessGroup;
using shmdist::Tensor;

std::vector<ProcessGroup> join_all(int n) {
  auto seg = std::make_shared<shmdist::segment::Segment>(
      shmdist::segment::Segment::create_anonymous(n, shmdist::segment::default_ring_size(n)));
  seg->header().flags |= shmdist::segment::kThreadMode;
  const shmdist::config::Config config;
  std::vector<ProcessGroup> pgs;
  for (int r = 0; r < n; ++r)
    pgs.push_back(shmdist::detail::ProcessGroupAccess::make(
        std::make_shared<ProcessGroup::Impl>(shmdist::detail::attach_world(
            seg, r, std::chrono::seconds(60), config, /*supervised=*/true))));
  return pgs;
}

Tensor bytes(std::vector<std::byte>& storage) {
  return Tensor::from_blob(storage.data(), {static_cast<std::int64_t>(storage.size())},
                           shmdist::kUInt8);
}

void pingpong(std::vector<ProcessGroup>& pg, const Options& o) {
  std::vector<std::byte> a(o.size, std::byte{1}), b(o.size);
  Tensor ta = bytes(a), tb = bytes(b);
  for (long i = 0; i < o.iterations; ++i) {
    pg[0].send(ta, 1);
    pg[1].recv(tb, 0);
    pg[1].send(tb, 0);
    pg[0].recv(ta, 1);
  }
}

void stream(std::vector<ProcessGroup>& pg, const Options& o) {
  std::vector<std::byte> a(o.size, std::byte{1});
  std::vector<std::vector<std::byte>> in(o.window, std::vector<std::byte>(o.size));
  Tensor ta = bytes(a);
  std::vector<Tensor> tin;
  for (auto& v : in) tin.push_back(bytes(v));
  std::vector<shmdist::Work> sends, recvs;
  for (long i = 0; i < o.iterations; ++i) {
    recvs.clear();
    sends.clear();
    for (int w = 0; w < o.window; ++w) recvs.push_back(pg[1].irecv(tin[w], 0));
    for (int w = 0; w < o.window; ++w) sends.push_back(pg[0].isend(ta, 1));
    for (auto& s : sends) s.wait();
    for (auto& r : recvs) r.wait();
  }
}

void rate(std::vector<ProcessGroup>& pg, const Options& o) {
  std::vector<std::byte> a(o.size, std::byte{1}), b(o.size);
  Tensor ta = bytes(a), tb = bytes(b);
  std::vector<shmdist::Work> sends, recvs;
  for (long i = 0; i < o.iterations; ++i) {
    recvs.clear();
    sends.clear();
    for (int w = 0; w < (o.ranks - 1) * o.window; ++w)
      recvs.push_back(pg[0].irecv(tb, shmdist::ANY_SOURCE));
    for (int r = 1; r < o.ranks; ++r)
      for (int w = 0; w < o.window; ++w) sends.push_back(pg[r].isend(ta, 0));
    for (auto& s : sends) s.wait();
    for (auto& r : recvs) r.wait();
  }
}

void anysource(std::vector<ProcessGroup>& pg, const Options& o) {
  std::vector<std::byte> a(o.size, std::byte{1}), b(o.size);
  Tensor ta = bytes(a), tb = bytes(b);
  for (long i = 0; i < o.iterations; ++i) {
    for (int r = 1; r < o.ranks; ++r) pg[r].send(ta, 0);
    for (int r = 1; r < o.ranks; ++r) pg[0].recv(tb, shmdist::ANY_SOURCE);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    std::vector<ProcessGroup> pg = join_all(o.test == "anysource" || o.test == "rate" ? o.ranks : 2);
    if (o.test == "pingpong") pingpong(pg, o);
    else if (o.test == "stream") stream(pg, o);
    else if (o.test == "anysource") anysource(pg, o);
    else if (o.test == "rate") rate(pg, o);
    else usage();
    std::printf("%s: %ld iterations of %zu bytes done\n", o.test.c_str(), o.iterations, o.size);
    std::fflush(stdout);
    std::_Exit(0);  // no destroy: it would wait for ranks this thread drives
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shmdist-count: %s\n", e.what());
    std::_Exit(1);
  }
}
