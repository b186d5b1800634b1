// The command line shared by shmdist-bench and its MPI twin:
//   PROGRAM [--min-size N] [--max-size N] [--iterations N] [--warmup N] [--window N]
//           [--duration S] [--dtype float32|bfloat16|float16] latency|bw|bibw|anysource|idle
//           | allreduce|bcast|reduce|allgather|reduce_scatter|alltoall
// Options may come before or after the test name.
#pragma once

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "osu_collectives.hpp"
#include "osu_conventions.hpp"

namespace bench {

struct Command {
  Test test = Test::Latency;
  bool collective = false;  // then `coll` says which (osu_collectives.hpp)
  Collective coll = Collective::AllReduce;
  Options options;
};

// Whether this process is rank 0 (or not started by a launcher): only it prints help/errors.
inline bool first_rank() {
  for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::string(v) == "0";
  return true;
}

// Parses the command line; on --help or an error prints (rank 0 only) and exits.
inline Command parse_command_line(int argc, char** argv, const std::string& description) {
  CLI::App app{description};
  app.require_subcommand(1, 1);
  app.fallthrough();  // options given after the test name still reach the main app
  Command cmd;
  Options& o = cmd.options;
  app.add_option("--min-size", o.min_size,
                 "smallest message in bytes (default 0 for latency/anysource, 4 for collectives, else 1)")
      ->check(CLI::Range(0L, long(kMaxMessageSize) * 256));
  app.add_option("--max-size", o.max_size, "largest message in bytes (default 4194304; 16777216 for collectives)")
      ->check(CLI::Range(0L, long(kMaxMessageSize) * 256));
  app.add_option("--iterations,-i", o.iterations,
                 "timed iterations for every size (default: OSU's, by test and size)")
      ->check(CLI::Range(1L, 100'000'000L));
  app.add_option("--warmup,-x", o.warmup, "untimed warm-up iterations for every size")
      ->check(CLI::Range(0L, 100'000'000L));
  app.add_option("--window,-W", o.window, "bw/bibw/anysource: messages in flight per iteration")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--dtype", o.dtype,
                 "allreduce/reduce/reduce_scatter: element type, float32 (default), bfloat16 or "
                 "float16 (shmdist-bench only); sizes stay in bytes")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
  app.add_option("--duration", o.idle_seconds, "idle: seconds a receive stays blocked (default 2)")
      ->check(CLI::Range(0.01, 3600.0));
  struct Entry {
    const char* name;
    const char* help;
    Test test;
  };
  const Entry entries[] = {
      {"latency", "ping-pong of ranks 0 and 1, half the round trip in us (2 ranks; others only "
                  "join the barriers)", Test::Latency},
      {"bw", "window of isends then a 4-byte ack, MB/s with MB = 10^6 bytes (2 ranks)",
       Test::Bandwidth},
      {"bibw", "both ranks send a window at once, both directions counted (2 ranks)",
       Test::BiBandwidth},
      {"anysource", "rank 0 receives with ANY_SOURCE: latency against one sender, message "
                    "rate with all N-1 senders (N ranks)", Test::AnySource},
      {"idle", "CPU used by a rank blocked in recv after the spin phase, % of one core",
       Test::Idle},
  };
  for (const Entry& e : entries) {
    CLI::App* sub = app.add_subcommand(e.name, e.help);
    sub->callback([&cmd, t = e.test] { cmd.test = t; });
  }
  struct CollEntry {
    const char* name;
    Collective coll;
  };
  const CollEntry colls[] = {{"allreduce", Collective::AllReduce}, {"bcast", Collective::Bcast},
                             {"reduce", Collective::Reduce}, {"allgather", Collective::AllGather},
                             {"reduce_scatter", Collective::ReduceScatter},
                             {"alltoall", Collective::AllToAll}};
  for (const CollEntry& e : colls) {
    CLI::App* sub = app.add_subcommand(
        e.name, std::string("osu_") + e.name + " style: float32, average us per call across ranks "
                "(sizes 4 B to 16 MiB by default)");
    sub->callback([&cmd, k = e.coll] {
      cmd.collective = true;
      cmd.coll = k;
    });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const bool print = first_rank();
    if (!print) std::exit(e.get_exit_code());
    std::exit(app.exit(e));
  }
  if (o.min_size >= 0 && o.max_size >= 0 && o.min_size > o.max_size) {
    if (first_rank())
      std::fprintf(stderr, "--min-size %ld is larger than --max-size %ld\n", o.min_size,
                   o.max_size);
    std::exit(2);
  }
  return cmd;
}

}  // namespace bench
