// The collective loops (osu_allreduce, osu_bcast, osu_reduce, osu_allgather,
// osu_reduce_scatter, osu_alltoall style), written once against a CollComm: shmdist-bench and
// the MPI twin run the very same code. float32 elements; each call is timed on its own and
// followed by a barrier (as OSU 5.x does), and the figure is the average time per call
// across ranks, in microseconds. Sizes are OSU's: the whole buffer for allreduce, bcast and
// reduce; each rank's contribution for allgather; each pair's message for alltoall; each
// rank's whole input for reduce_scatter (every rank receives size / ranks of it).
// After each size, one untimed call on fresh inputs is checked (exact small integers).
// With --dtype bfloat16 or float16 (shmdist-bench), the library's prepare() views the same
// bytes as twice as many 16-bit elements; that result is not checked here (tests/coll checks
// every dtype bit for bit).
#pragma once

#include <functional>
#include <string>

#include "osu_conventions.hpp"

namespace bench {

enum class Collective { AllReduce, Bcast, Reduce, AllGather, ReduceScatter, AllToAll };

inline const char* collective_title(Collective k) {
  switch (k) {
    case Collective::AllReduce: return "Allreduce Latency";
    case Collective::Bcast: return "Broadcast Latency";
    case Collective::Reduce: return "Reduce Latency";
    case Collective::AllGather: return "Allgather Latency";
    case Collective::ReduceScatter: return "Reduce_scatter Latency";
    case Collective::AllToAll: return "All-to-All Latency";
  }
  return "?";
}

// What a library offers to be measured: `prepare` returns the call for one size, with its
// buffers bound (`in` and `out` as the Collective needs them, `count` elements as above);
// `mean` averages a double across ranks.
template <class C>
concept CollComm = requires(C c, Collective k, float* in, float* out, std::size_t count,
                            double v) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.prepare(k, in, out, count) } -> std::convertible_to<std::function<void()>>;
  { c.mean(v) } -> std::convertible_to<double>;
  c.barrier();
};

// osu_util: 1000 iterations (100 above 8 KiB) after 200 (10) warm-up calls.
inline LoopCount collective_loop(std::size_t size, const Options& o) {
  LoopCount c = size > kLargeMessageSize ? LoopCount{100, 10} : LoopCount{1000, 200};
  if (o.iterations > 0) c.iterations = o.iterations;
  if (o.warmup >= 0) c.skip = o.warmup;
  return c;
}

namespace detail {

// Elements of the input buffer, of the output buffer, and `count` for prepare().
struct Shape {
  std::size_t in, out, count;
};
inline Shape shape_of(Collective k, std::size_t bytes, int n) {
  const std::size_t e = std::max<std::size_t>(bytes / sizeof(float), 1);
  const auto un = static_cast<std::size_t>(n);
  switch (k) {
    case Collective::AllGather: return {e, e * un, e};
    case Collective::AllToAll: return {e * un, e * un, e};
    case Collective::ReduceScatter: {
      const std::size_t part = std::max<std::size_t>(e / un, 1);
      return {part * un, part, part};
    }
    default: return {e, e, e};
  }
}

// Inputs whose result is exact in float32; returns whether `out` holds the right result.
inline void fill_inputs(Collective k, std::vector<float>& in, std::vector<float>& out, int me) {
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = static_cast<float>(me * 100 + static_cast<int>(i % 7));
  if (k == Collective::AllReduce || k == Collective::Reduce || k == Collective::Bcast)
    out = in;  // these work in place on `out`
}
inline bool check_result(Collective k, const std::vector<float>& out, std::size_t count, int me,
                         int n) {
  auto sum_over_ranks = [n](std::size_t i) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += static_cast<float>(r * 100 + static_cast<int>(i % 7));
    return s;
  };
  for (std::size_t i = 0; i < out.size(); ++i) {
    float want = 0;
    switch (k) {
      case Collective::AllReduce: want = sum_over_ranks(i); break;
      case Collective::Reduce:
        want = me == 0 ? sum_over_ranks(i) : static_cast<float>(me * 100 + static_cast<int>(i % 7));
        break;
      case Collective::Bcast: want = static_cast<float>(i % 7); break;
      case Collective::AllGather:
        want = static_cast<float>(static_cast<int>(i / count) * 100 + static_cast<int>(i % count % 7));
        break;
      case Collective::AllToAll: {
        const std::size_t from = i / count, at = static_cast<std::size_t>(me) * count + i % count;
        want = static_cast<float>(static_cast<int>(from) * 100 + static_cast<int>(at % 7));
        break;
      }
      case Collective::ReduceScatter: want = sum_over_ranks(static_cast<std::size_t>(me) * count + i); break;
    }
    if (out[i] != want) return false;
  }
  return true;
}

}  // namespace detail

template <CollComm C>
void run_collective(C& c, Collective k, const Options& o, const std::string& name,
                    const std::string& lib_detail, const std::function<void(const std::string&)>& fail) {
  Options opts = o;
  if (opts.min_size < 0) opts.min_size = 4;
  if (opts.max_size < 0) opts.max_size = 16 << 20;
  const auto sizes = message_sizes(opts, 4);
  const int me = c.rank(), n = c.size();
  if (me == 0) {
    print_title(name, collective_title(k), lib_detail);
    std::printf("# [ ranks: %d ] [ %s; average time per call across ranks ]\n", n,
                opts.dtype.c_str());
    print_header("Avg Latency(us)");
  }
  for (const std::size_t size : sizes) {
    const detail::Shape sh = detail::shape_of(k, size, n);
    std::vector<float> in(sh.in), out(sh.out);
    detail::fill_inputs(k, in, out, me);
    float* out_p = out.data();
    float* in_p = k == Collective::AllReduce || k == Collective::Reduce || k == Collective::Bcast
                      ? out_p
                      : in.data();
    const std::function<void()> call = c.prepare(k, in_p, out_p, sh.count);
    const LoopCount loop = collective_loop(size, opts);
    double total = 0;
    c.barrier();
    for (long i = 0; i < loop.skip + loop.iterations; ++i) {
      const double t0 = wtime();
      call();
      const double t = wtime() - t0;
      if (i >= loop.skip) total += t;
      c.barrier();
    }
    // One checked call on fresh inputs (untimed).
    detail::fill_inputs(k, in, out, me);
    if (k == Collective::Bcast && me != 0) std::fill(out.begin(), out.end(), -1.0f);
    call();
    if (opts.dtype == "float32" && !detail::check_result(k, out, sh.count, me, n))
      fail(std::string(collective_title(k)) + ": rank " + std::to_string(me) +
           " got a wrong result at size " + std::to_string(size));
    const double avg = c.mean(total * 1e6 / static_cast<double>(loop.iterations));
    if (me == 0) print_row(size, avg);
  }
}

}  // namespace bench
