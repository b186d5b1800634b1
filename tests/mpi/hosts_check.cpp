// One rank of a job across (emulated) hosts, run by test_across_hosts.cpp under mpirun with
// SHMDIST_HOST_ID chosen per rank (with_host_id.sh). Mode "all" runs the behaviour checks and
// rank 0 prints "OK"; any failed check prints "FAIL rank R: ..." to stderr and exits 1.
// Mode "kill" makes the last rank die by SIGKILL while the others wait for it; mode
// "timeout" makes rank 0 wait for a message nobody sends, and print the Timeout's text.
// Mode "count" (2 ranks on 2 hosts) counts the MPI messages a shmdist message becomes, through
// MPI's profiling interface: rank 0 prints one line per size, "SIZE MESSAGES". Mode "allocs"
// (2 ranks on 2 hosts) counts the C++ allocations (operator new) of each rank during a
// ping-pong of small messages after a warm-up: rank 0 prints "ALLOCS R0 R1".
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <new>
#include <cstring>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

namespace {

int rank = 0;
int world = 0;

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

dist::Tensor pair(std::int64_t a, std::int64_t b) {
  dist::Tensor t = dist::zeros(2, dist::kInt64);
  t.data<std::int64_t>()[0] = a;
  t.data<std::int64_t>()[1] = b;
  return t;
}

// Every rank sends K messages to every other rank over 3 tags, all at once (non-blocking);
// each receiver takes them per (source, tag) and finds them in sending order.
void ordering() {
  constexpr int K = 60;
  std::vector<dist::Work> sends;
  for (int dst = 0; dst < world; ++dst)
    if (dst != rank)
      for (int i = 0; i < K; ++i) sends.push_back(dist::isend(pair(rank, i), dst, {}, i % 3));
  for (int src = 0; src < world; ++src) {
    if (src == rank) continue;
    for (int tag = 2; tag >= 0; --tag)  // the reverse of sending order: the rest is unexpected
      for (int i = tag; i < K; i += 3) {
        dist::Tensor t = dist::zeros(2, dist::kInt64);
        check(dist::recv(t, src, {}, tag) == src, "ordering: wrong source");
        check(t.data<std::int64_t>()[0] == src && t.data<std::int64_t>()[1] == i,
              "ordering: from rank " + std::to_string(src) + " tag " + std::to_string(tag) +
                  " expected message " + std::to_string(i) + ", got " +
                  std::to_string(t.data<std::int64_t>()[1]));
      }
  }
  for (auto& w : sends) w.wait();
}

// Rank 0 receives from any source everything every other rank sends it (local and remote
// peers mixed): all arrive, each source's in order.
void any_source() {
  constexpr int M = 40;
  if (rank != 0) {
    for (int i = 0; i < M; ++i) dist::send(pair(rank, i), 0, {}, 7);
    return;
  }
  std::vector<int> next(world, 0);
  for (int n = 0; n < M * (world - 1); ++n) {
    dist::Tensor t = dist::zeros(2, dist::kInt64);
    const int src = dist::recv(t, dist::ANY_SOURCE, {}, 7);
    check(src > 0 && src < world && t.data<std::int64_t>()[0] == src,
          "any-source: recv returned source " + std::to_string(src) + " for a message of rank " +
              std::to_string(t.data<std::int64_t>()[0]));
    check(t.data<std::int64_t>()[1] == next[src]++, "any-source: out of order from rank " +
                                                        std::to_string(src));
  }
}

// Large messages both ways at once between rank 0 and the last rank (on another host in
// every configuration), an odd size, and an empty message.
void large() {
  if (rank != 0 && rank != world - 1) return;
  const int peer = rank == 0 ? world - 1 : 0;
  for (std::int64_t n : {std::int64_t{3} << 20, (std::int64_t{16} << 20) + 7, std::int64_t{0}}) {
    dist::Tensor out = dist::empty({n}, dist::kUInt8);
    for (std::int64_t i = 0; i < n; ++i) out.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i * 7 + rank);
    dist::Tensor in = dist::zeros(n, dist::kUInt8);
    dist::Work s = dist::isend(out, peer, {}, 11);
    check(dist::recv(in, peer, {}, 11) == peer, "large: wrong source");
    s.wait();
    for (std::int64_t i = 0; i < n; ++i)
      if (in.data<std::uint8_t>()[i] != static_cast<std::uint8_t>(i * 7 + peer))
        throw std::runtime_error("large: byte " + std::to_string(i) + " of " +
                                 std::to_string(n) + " differs");
  }
}

// irecv posted before the send; a wait with a timeout that expires while nothing is sent.
void nonblocking() {
  const int peer = world - 1 - rank;  // pairs across the job (hosts differ in our layouts)
  const bool paired = peer != rank;
  dist::Tensor in = dist::zeros(2, dist::kInt64);
  dist::Work r;
  if (paired) r = dist::irecv(in, peer, {}, 21);
  dist::barrier();
  if (paired && rank < peer)
    check(!r.wait(std::chrono::milliseconds(50)), "nonblocking: completed before the send");
  dist::barrier();
  if (!paired) return;
  dist::Work s = dist::isend(pair(rank, 42), peer, {}, 21);
  r.wait();
  s.wait();
  check(in.data<std::int64_t>()[0] == peer && in.data<std::int64_t>()[1] == 42,
        "nonblocking: wrong payload");
  check(r.source_rank() == peer, "nonblocking: wrong source_rank");
}

// A group of the first and last rank (two hosts) and one of the odd ranks.
void groups() {
  dist::Group ends = dist::new_group({0, world - 1});
  std::vector<int> odd_ranks;
  for (int r = 1; r < world; r += 2) odd_ranks.push_back(r);
  dist::Group odd = dist::new_group(odd_ranks);
  if (rank == 0 || rank == world - 1) {
    const int peer = rank == 0 ? world - 1 : 0;  // global ranks, as in torch
    dist::Work s = dist::isend(pair(rank, 5), peer, ends, 3);
    dist::Tensor t = dist::zeros(2, dist::kInt64);
    check(dist::recv(t, dist::ANY_SOURCE, ends, 3) == (rank == 0 ? world - 1 : 0),
          "groups: recv in a group spanning hosts returned the wrong global rank");
    s.wait();
    dist::Tensor x = dist::full({4}, rank + 1, dist::kFloat32);
    dist::all_reduce(x, dist::ReduceOp::SUM, ends);
    check(x.data<float>()[3] == static_cast<float>(world + 1), "groups: all_reduce over ends");
  }
  if (rank % 2 == 1 && odd_ranks.size() > 1) {
    dist::Tensor x = dist::full({3}, rank, dist::kInt64);
    dist::all_reduce(x, dist::ReduceOp::MAX, odd);
    check(x.data<std::int64_t>()[0] == odd_ranks.back(), "groups: all_reduce MAX over odd");
  }
}

void collectives() {
  dist::Tensor x = dist::full({1000}, rank, dist::kFloat64);
  dist::all_reduce(x);
  check(x.data<double>()[999] == world * (world - 1) / 2.0, "collectives: all_reduce SUM");
  dist::Tensor b = dist::full({5}, rank == world - 1 ? 9 : 0, dist::kInt32);
  dist::broadcast(b, world - 1);
  check(b.data<std::int32_t>()[4] == 9, "collectives: broadcast from the last rank");
  std::vector<dist::Tensor> all;
  for (int r = 0; r < world; ++r) all.push_back(dist::zeros(2, dist::kInt64));
  dist::all_gather(all, pair(rank, rank * 10));
  for (int r = 0; r < world; ++r)
    check(all[r].data<std::int64_t>()[1] == r * 10, "collectives: all_gather slot " +
                                                        std::to_string(r));
  dist::Work w = dist::all_reduce(x, dist::ReduceOp::MAX, {}, /*async_op=*/true);
  w.wait();
  check(x.data<double>()[0] == world * (world - 1) / 2.0, "collectives: async all_reduce MAX");
  dist::barrier();
}

// Each rank's host, from SHMDIST_TEST_HOSTS ("a,a,b,b"; unset: one host).
std::vector<std::string> hosts_of_ranks() {
  std::vector<std::string> hosts(world, "");
  const char* list = std::getenv("SHMDIST_TEST_HOSTS");
  std::string rest = list ? list : "";
  for (int r = 0; r < world && !rest.empty(); ++r) {
    const auto comma = rest.find(',');
    hosts[r] = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  return hosts;
}

// A float32 whose sums depend on their order: magnitudes from 2^-12 to 2^20, either sign.
float spread_value(int r, std::int64_t i) {
  const std::uint32_t h = static_cast<std::uint32_t>(r * 2654435761u) ^
                          static_cast<std::uint32_t>(i * 40503u + 17u) * 2246822519u;
  const int mantissa = static_cast<int>(h % 2001) - 1000;
  return std::ldexp(static_cast<float>(mantissa) + 0.37f * static_cast<float>(r + 1),
                    static_cast<int>((h >> 12) % 33) - 22);
}

// docs/semantics.md's order across hosts: inside each host in group-rank order, then the
// host partials in the order of their first member (one host: group-rank order).
template <class T, class Op>
T in_documented_order(const std::vector<int>& members, const std::vector<T>& values, Op op) {
  const std::vector<std::string> hosts = hosts_of_ranks();
  std::vector<std::string> seen;
  std::vector<T> partials;
  for (std::size_t j = 0; j < members.size(); ++j) {
    const std::string& h = hosts[members[j]];
    const auto at = std::find(seen.begin(), seen.end(), h);
    if (at == seen.end()) {
      seen.push_back(h);
      partials.push_back(values[j]);
    } else {
      T& p = partials[at - seen.begin()];
      p = op(p, values[j]);
    }
  }
  T result = partials[0];
  for (std::size_t h = 1; h < partials.size(); ++h) result = op(result, partials[h]);
  return result;
}

std::string bits_of(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return std::to_string(v) + " (0x" + [&] {
    char b[9];
    std::snprintf(b, sizeof b, "%08x", u);
    return std::string(b);
  }() + ")";
}

// all_reduce and reduce over `members` (this rank among them) give bitwise the documented
// order's result for values whose order matters, for every op, at odd sizes, below and above
// the one-MPI-message limit (32 KiB) and the size from which all_reduce across hosts works by
// slices (96 KiB: 20001 floats below it, 30001 above; by columns where every host holds as
// many members, a,b,b,a and a,a,b,b,c,c: 30001 and 70001 floats, odd, so the columns'
// slices differ by one, 70001 in slices larger than a packed MPI message); broadcast reaches
// every member from 3 roots.
void reduce_order_in(const std::vector<int>& members, const dist::Group& group,
                     const std::string& where) {
  const int n = static_cast<int>(members.size());
  const auto plus = [](float a, float b) { return a + b; };
  for (const std::int64_t count : {1, 7, 1001, 12289, 20001, 30001, 70001}) {
    const std::string at = where + ", " + std::to_string(count) + " elements";
    const auto input = [&](int r) {
      dist::Tensor t = dist::empty({count}, dist::kFloat32);
      for (std::int64_t i = 0; i < count; ++i) t.data<float>()[i] = spread_value(r, i);
      return t;
    };
    const auto expect = [&](const dist::Tensor& got, auto op, const std::string& what) {
      for (std::int64_t i = 0; i < count; ++i) {
        std::vector<float> v;
        for (int m : members) v.push_back(spread_value(m, i));
        const float want = in_documented_order(members, v, op);
        const float have = got.data<float>()[i];
        if (std::memcmp(&want, &have, sizeof want) != 0)
          throw std::runtime_error("reduce_order: " + what + " " + at + ", element " +
                                   std::to_string(i) + ": got " + bits_of(have) + ", the documented "
                                   "order gives " + bits_of(want));
      }
    };
    dist::Tensor x = input(rank);
    dist::all_reduce(x, dist::ReduceOp::SUM, group);
    expect(x, plus, "all_reduce SUM");
    x = input(rank);
    dist::all_reduce(x, dist::ReduceOp::AVG, group);
    {  // AVG: the documented order's sum divided by the group size, in float32
      for (std::int64_t i = 0; i < count; ++i) {
        std::vector<float> v;
        for (int m : members) v.push_back(spread_value(m, i));
        const float want = in_documented_order(members, v, plus) / static_cast<float>(n);
        check(std::memcmp(&want, &x.data<float>()[i], sizeof want) == 0,
              "reduce_order: all_reduce AVG " + at + ", element " + std::to_string(i) + ": got " +
                  bits_of(x.data<float>()[i]) + ", want " + bits_of(want));
      }
    }
    x = input(rank);
    dist::all_reduce(x, dist::ReduceOp::PRODUCT, group);
    expect(x, [](float a, float b) { return a * b; }, "all_reduce PRODUCT");
    x = input(rank);
    dist::all_reduce(x, dist::ReduceOp::MIN, group);
    expect(x, [](float a, float b) { return b < a ? b : a; }, "all_reduce MIN");
    x = input(rank);
    dist::all_reduce(x, dist::ReduceOp::MAX, group);
    expect(x, [](float a, float b) { return a < b ? b : a; }, "all_reduce MAX");
    dist::Tensor bits = dist::full({count}, 0, dist::kInt64);
    for (std::int64_t i = 0; i < count; ++i)
      bits.data<std::int64_t>()[i] = (std::int64_t{rank + 3} << (i % 50)) ^ (i * 0x9e3779b9LL);
    dist::Tensor want_xor = dist::zeros(count, dist::kInt64);
    for (int m : members)
      for (std::int64_t i = 0; i < count; ++i)
        want_xor.data<std::int64_t>()[i] ^= (std::int64_t{m + 3} << (i % 50)) ^ (i * 0x9e3779b9LL);
    dist::all_reduce(bits, dist::ReduceOp::BXOR, group);
    check(std::memcmp(bits.data_ptr(), want_xor.data_ptr(), bits.nbytes()) == 0,
          "reduce_order: all_reduce BXOR int64 " + at);
    {  // reduce_scatter_tensor: member j's output is part j of the inputs, reduced alike
      const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) -
                                      members.begin());
      dist::Tensor in = dist::empty({count * n}, dist::kFloat32);
      for (std::int64_t i = 0; i < count * n; ++i) in.data<float>()[i] = spread_value(rank, i);
      dist::Tensor out = dist::empty({count}, dist::kFloat32);
      dist::reduce_scatter_tensor(out, in, dist::ReduceOp::SUM, group);
      for (std::int64_t i = 0; i < count; ++i) {
        std::vector<float> v;
        for (int m : members) v.push_back(spread_value(m, me * count + i));
        const float want = in_documented_order(members, v, plus);
        check(std::memcmp(&want, &out.data<float>()[i], sizeof want) == 0,
              "reduce_order: reduce_scatter_tensor SUM " + at + ", element " + std::to_string(i) +
                  ": got " + bits_of(out.data<float>()[i]) + ", want " + bits_of(want));
      }
    }
    for (const int root : {members.front(), members.back(), members[n / 2]}) {
      x = input(rank);
      const dist::Tensor before = input(rank);
      dist::reduce(x, root, dist::ReduceOp::SUM, group);
      if (rank == root) expect(x, plus, "reduce SUM to " + std::to_string(root));
      else check(std::memcmp(x.data_ptr(), before.data_ptr(), x.nbytes()) == 0,
                 "reduce_order: reduce to " + std::to_string(root) + " changed rank " +
                     std::to_string(rank) + "'s tensor " + at);
      dist::Tensor b = rank == root ? input(root) : dist::zeros(count, dist::kFloat32);
      dist::broadcast(b, root, group);
      const dist::Tensor want = input(root);
      check(std::memcmp(b.data_ptr(), want.data_ptr(), b.nbytes()) == 0,
            "reduce_order: broadcast from " + std::to_string(root) + " " + at);
    }
  }
}

// The documented order on the world group, on a group of the first, a middle and the last
// rank (spanning hosts), and on a group of the ranks on rank 0's host (inside one host).
void reduce_order() {
  std::vector<int> all(world);
  for (int r = 0; r < world; ++r) all[r] = r;
  reduce_order_in(all, {}, "world group");
  std::vector<int> some = {0, world / 2, world - 1};
  some.erase(std::unique(some.begin(), some.end()), some.end());
  const dist::Group spread = dist::new_group(some);
  if (std::count(some.begin(), some.end(), rank)) reduce_order_in(some, spread, "group of ends");
  const std::vector<std::string> hosts = hosts_of_ranks();
  std::vector<int> first_host;
  for (int r = 0; r < world; ++r)
    if (hosts[r] == hosts[0]) first_host.push_back(r);
  const dist::Group inside = dist::new_group(first_host);
  if (hosts[rank] == hosts[0]) reduce_order_in(first_host, inside, "group inside rank 0's host");
  // Members that disagree (the last rank with one element more, or MAX instead of SUM) raise
  // on every member, on the leaders' schedule and the flat one, and the group goes on.
  for (const std::int64_t count : {5, 30001}) {
    for (const bool other_op : {false, true}) {
      const bool odd = rank == world - 1;
      dist::Tensor x = dist::full({odd && !other_op ? count + 1 : count}, 1, dist::kFloat32);
      std::string said;
      try {
        dist::all_reduce(x, odd && other_op ? dist::ReduceOp::MAX : dist::ReduceOp::SUM);
      } catch (const dist::InvalidArgument& e) {
        said = e.what();
      }
      check(!said.empty(), "reduce_order: a disagreeing all_reduce of " + std::to_string(count) +
                               " elements returned on rank " + std::to_string(rank));
    }
  }
  dist::Tensor x = dist::full({3}, 1, dist::kFloat32);
  dist::all_reduce(x);
  check(x.data<float>()[2] == static_cast<float>(world), "reduce_order: all_reduce after a "
                                                          "disagreement");
}

// A small all_reduce across hosts carries its agreement in its data's messages (the host
// tree, docs/hosts.md): members whose calls differ must still all raise, the same error on
// every member (naming the calls and global ranks), leave every tensor as it was, and the
// group goes on. Each case has one rank call otherwise: a member on another host than rank
// 0's that is not its host's leader (another count; invalid arguments of its own), another
// host's leader (another op), a member of rank 0's host (another dtype), and rank 0, the
// first leader (broadcast instead of all_reduce). Host h (numbered by its lowest rank) is led
// by its member at place h mod its size (HostSplit::leader): on a,a,b,b, ranks 0 and 3.
void folded_agreement() {
  const std::vector<std::string> hosts = hosts_of_ranks();
  auto leader_of = [&](int r) {
    std::vector<std::string> order;  // the hosts, by their lowest rank
    for (int q = 0; q < world; ++q)
      if (std::find(order.begin(), order.end(), hosts[q]) == order.end()) order.push_back(hosts[q]);
    const auto h = static_cast<std::size_t>(std::find(order.begin(), order.end(), hosts[r]) -
                                            order.begin());
    std::vector<int> members;
    for (int q = 0; q < world; ++q)
      if (hosts[q] == hosts[r]) members.push_back(q);
    return members[h % members.size()];
  };
  int other_leader = world - 1, other_mate = world - 1, own_mate = world - 1;
  for (int r = world - 1; r > 0; --r) {
    if (hosts[r] == hosts[0]) own_mate = r;
    else if (leader_of(r) == r) other_leader = r;
    else other_mate = r;
  }
  enum Case { kCount, kOp, kDtype, kKind, kRejected };
  const std::pair<Case, int> cases[] = {{kCount, other_mate}, {kOp, other_leader},
                                        {kDtype, own_mate}, {kKind, 0}, {kRejected, other_mate}};
  for (const auto& [what, odd_rank] : cases) {
    const std::string at = "folded_agreement case " + std::to_string(what) + " (rank " +
                           std::to_string(odd_rank) + " differs)";
    const bool odd = rank == odd_rank;
    const std::int64_t count = odd && what == kCount ? 6 : 5;
    const dist::DType dtype = odd && what == kDtype ? dist::kFloat64 : dist::kFloat32;
    dist::Tensor x = dist::full({count}, rank + 1, dtype);
    const dist::Tensor before = dist::full({count}, rank + 1, dtype);
    std::string said;
    try {
      if (odd && what == kKind) dist::broadcast(x, 0);
      else if (odd && what == kOp) dist::all_reduce(x, dist::ReduceOp::MAX);
      else if (odd && what == kRejected) dist::all_reduce(x, dist::ReduceOp::BAND);
      else dist::all_reduce(x);
    } catch (const dist::InvalidArgument& e) {
      said = e.what();
    }
    check(!said.empty(), at + ": the call returned on rank " + std::to_string(rank));
    check(std::memcmp(x.data_ptr(), before.data_ptr(), x.nbytes()) == 0,
          at + ": rank " + std::to_string(rank) + "'s tensor changed: " + said);
    if (what != kRejected || !odd)
      check(said.find("global rank " + std::to_string(odd_rank)) != std::string::npos,
            at + ": rank " + std::to_string(rank) + " does not name the odd rank: " + said);
    if (what != kRejected) {
      const std::string calls = what == kKind ? "broadcast(" : "all_reduce(";
      check(said.find(calls) != std::string::npos && said.find("disagree") != std::string::npos,
            at + ": rank " + std::to_string(rank) + " does not name the calls: " + said);
      // The same verdict on every member (after the name of its own call): the smallest and
      // largest hash of it agree.
      dist::Tensor h = dist::zeros(2, dist::kInt64);
      const std::string verdict = said.substr(said.find("): ") + 3);
      const auto hash = static_cast<std::int64_t>(std::hash<std::string>{}(verdict) >> 1);
      h.data<std::int64_t>()[0] = hash;
      h.data<std::int64_t>()[1] = -hash;
      dist::all_reduce(h, dist::ReduceOp::MAX);
      check(h.data<std::int64_t>()[0] == -h.data<std::int64_t>()[1],
            at + ": the members raised different texts; rank " + std::to_string(rank) +
                "'s: " + said);
    }
    dist::Tensor y = dist::full({3}, 1, dist::kFloat32);
    dist::all_reduce(y);
    check(y.data<float>()[0] == static_cast<float>(world),
          at + ": all_reduce after it gave " + std::to_string(y.data<float>()[0]));
  }
}

// Every MPI_Isend of the process (shmdist's own included: libshmdist is static and resolves
// MPI_Isend to this definition) is counted, then handed to the MPI library.
int isends = 0;

// Hosts a,a,b,b: the MPI messages (between hosts) of 10 all_reduce calls of 5 floats (the
// leaders' schedule: one message between the two leaders each way, agreement included) and
// of 10 of 30,001 floats (by columns: each member's 60 KB host partial to its column peer, a
// header and 2 pieces, and the agreement's 2), summed over the ranks; rank 0 prints
// "ISENDS SMALL LARGE".
void count_collectives() {
  check(world == 4, "count_collectives: needs 4 ranks");
  dist::Tensor small = dist::full({5}, 1, dist::kFloat32);
  dist::Tensor large = dist::full({30001}, 1, dist::kFloat32);
  dist::all_reduce(small);
  dist::all_reduce(large);
  dist::Tensor counts = dist::zeros(2, dist::kInt64);
  int at = isends;
  for (int i = 0; i < 10; ++i) dist::all_reduce(small);
  counts.data<std::int64_t>()[0] = isends - at;
  at = isends;
  for (int i = 0; i < 10; ++i) dist::all_reduce(large);
  counts.data<std::int64_t>()[1] = isends - at;
  dist::all_reduce(counts);
  if (rank == 0)
    std::cout << "ISENDS " << counts.data<std::int64_t>()[0] << " "
              << counts.data<std::int64_t>()[1] << std::endl;
}

// Rank 0 sends messages of several sizes to rank 1 (on the other host), one at a time, and
// counts the MPI messages each became; rank 1 checks every byte.
void count_messages() {
  check(world == 2, "count: needs 2 ranks");
  const std::int64_t sizes[] = {0, 1, 8, 4096, 1 << 15, (1 << 15) + 8, 1 << 17, (1 << 17) + 1,
                                1 << 20};
  for (const std::int64_t n : sizes) {
    dist::Tensor t = dist::zeros(n, dist::kUInt8);
    dist::barrier();
    if (rank == 0) {
      for (std::int64_t i = 0; i < n; ++i) t.data<std::uint8_t>()[i] = std::uint8_t(i * 7 + 1);
      const int before = isends;
      dist::send(t, 1, {}, 3);
      std::cout << n << " " << isends - before << std::endl;
    } else {
      dist::recv(t, 0, {}, 3);
      for (std::int64_t i = 0; i < n; ++i)
        check(t.data<std::uint8_t>()[i] == std::uint8_t(i * 7 + 1),
              "count: byte " + std::to_string(i) + " of " + std::to_string(n) + " is wrong");
    }
  }
  dist::barrier();
}

// Every operator new of the process (shmdist's included) is counted.
std::atomic<long> allocations{0};

// A ping-pong of 8-byte messages with the rank on the other host: after a warm-up (send
// slots, receive buffers and MPI's own free lists are in place), a message allocates nothing.
void count_allocations() {
  check(world == 2, "allocs: needs 2 ranks");
  dist::Tensor t = dist::zeros(1, dist::kInt64);
  auto rounds = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (rank == 0) {
        t.data<std::int64_t>()[0] = i;
        dist::send(t, 1, {}, 4);
        dist::recv(t, 1, {}, 4);
        // (not check(): its message would be a std::string made, and allocated, every round)
        if (t.data<std::int64_t>()[0] != i + 1) throw std::runtime_error("allocs: wrong echo");
      } else {
        dist::recv(t, 0, {}, 4);
        t.data<std::int64_t>()[0] += 1;
        dist::send(t, 0, {}, 4);
      }
    }
  };
  rounds(200);
  const long before = allocations.load();
  rounds(1000);
  const long mine = allocations.load() - before;
  dist::Tensor count = dist::zeros(1, dist::kInt64);
  if (rank == 1) {
    count.data<std::int64_t>()[0] = mine;
    dist::send(count, 0, {}, 5);
  } else {
    dist::recv(count, 1, {}, 5);
    std::cout << "ALLOCS " << mine << " " << count.data<std::int64_t>()[0] << std::endl;
  }
  dist::barrier();
}

}  // namespace

// Not under AddressSanitizer: it owns operator new and delete (a replacement here meets its
// own in allocations made elsewhere, a mismatch it reports); mode "allocs" then says so.
#if defined(__SANITIZE_ADDRESS__)
#define HOSTS_CHECK_COUNTS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOSTS_CHECK_COUNTS_ALLOCATIONS 0
#endif
#endif
#ifndef HOSTS_CHECK_COUNTS_ALLOCATIONS
#define HOSTS_CHECK_COUNTS_ALLOCATIONS 1
#endif

#if HOSTS_CHECK_COUNTS_ALLOCATIONS
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);  // a count only: no ordering needed
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// Out of line: GCC would otherwise see free() meet a new-expression's pointer and warn.
[[gnu::noinline]] static void release(void* p) noexcept { std::free(p); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
#endif

extern "C" int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag,
                         MPI_Comm comm, MPI_Request* request) {
  ++isends;
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  dist::InitOptions options;
  // Only rank 0 gives up early; the others wait for it in a barrier afterwards.
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (mode == "timeout" && mpi_rank && std::string(mpi_rank) == "0")
    options.timeout = std::chrono::milliseconds(1500);
  try {
    dist::init_process_group("shm", options);
    rank = dist::get_rank();
    world = dist::get_world_size();
    if (mode == "kill") {
      dist::barrier();
      if (rank == world - 1) std::raise(SIGKILL);
      dist::Tensor t = dist::zeros(1, dist::kInt64);
      dist::recv(t, world - 1);
      std::cerr << "FAIL rank " << rank << ": received from a killed rank\n";
      return 1;
    }
    if (mode == "kill_neighbour") {
      // Hosts a,a,b,b: rank 2 dies; rank 3, on its host, reports what it was told (the
      // global rank, not rank 2's index on host b). Run with mpirun's recovery on, so that
      // mpirun lets rank 3 finish.
      dist::barrier();
      if (rank == 2) std::raise(SIGKILL);
      if (rank == 3) {
        dist::Tensor t = dist::zeros(1, dist::kInt64);
        try {
          dist::recv(t, 2);
          std::cerr << "FAIL rank 3: received from a killed rank\n";
          return 1;
        } catch (const dist::PeerFailure& e) {
          std::cout << "PEERFAILURE " << e.what() << std::endl;
        }
      }
      return 0;
    }
    if (mode == "timeout") {
      if (rank == 0) {
        dist::Tensor t = dist::zeros(1, dist::kInt64);
        try {
          dist::recv(t, world - 1, {}, 5);
          std::cerr << "FAIL rank 0: a receive nobody sent to completed\n";
          return 1;
        } catch (const dist::Timeout& e) {
          std::cout << "TIMEOUT " << e.what() << std::endl;
        }
      }
      dist::barrier();
      dist::destroy_process_group();
      return 0;
    }
    if (mode == "allocs") {
      if (!HOSTS_CHECK_COUNTS_ALLOCATIONS) {
        if (rank == 0) std::cout << "ALLOCS not counted under AddressSanitizer" << std::endl;
        dist::destroy_process_group();
        return 0;
      }
      count_allocations();
      dist::destroy_process_group();
      return 0;
    }
    if (mode == "count_collectives") {
      count_collectives();
      dist::destroy_process_group();
      return 0;
    }
    if (mode == "count") {
      count_messages();
      dist::destroy_process_group();
      return 0;
    }
    const bool trace = std::getenv("HOSTS_CHECK_TRACE") != nullptr;
    const std::pair<const char*, void (*)()> checks[] = {
        {"ordering", ordering}, {"any_source", any_source}, {"large", large},
        {"nonblocking", nonblocking}, {"groups", groups}, {"collectives", collectives},
        {"reduce_order", reduce_order}, {"folded_agreement", folded_agreement}};
    for (const auto& [name, run] : checks) {
      if (trace) std::cerr << "rank " << rank << ": " << name << std::endl;
      run();
    }
    dist::destroy_process_group();
  } catch (const std::exception& e) {
    std::cerr << "FAIL rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
  if (rank == 0) std::cout << "OK" << std::endl;
  return 0;
}
