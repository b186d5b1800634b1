// The collectives' builders, one per row of coll/kinds.hpp: each checks its arguments, then
// takes the route the table's chooser gives (choose_route: the world lane's plan, or the
// point-to-point schedule the row describes, built here). Every reduction is evaluated in
// group-rank order by coll/reduce.hpp, on either route.

#include "coll/collectives.hpp"

#include <algorithm>

#include "coll/builder.hpp"
#include "coll/lane_plans.hpp"
#include "coll/on_lane.hpp"
#include "coll/reduce_schedules.hpp"
#include "coll/scratch.hpp"
#include "coll/tensor_views.hpp"
#include "engine/engine.hpp"

namespace shmdist::coll {
namespace {

// sends[j] goes to member j and recvs[j] comes from it; this member's own pair is a local copy
// (all_gather, all_gather_into_tensor and the all_to_alls over point-to-point).
void exchange(Schedule& sch, const Builder& b, const std::vector<Tensor>& sends,
              const std::vector<Tensor>& recvs) {
  Step& step = sch.add_step();
  for (int j = 0; j < b.n(); ++j) {
    sch.keep(sends[j]);
    sch.keep(recvs[j]);
    if (j == b.me()) continue;
    send(step, b.members()[j], sends[j]);
    recv(step, b.members()[j], recvs[j]);
  }
  Tensor from = sends[b.me()], to = recvs[b.me()];
  step.after = [from, to] { copy_elements(from, to); };
}

// Broadcast across hosts from a leader: each host's leader sends `tensor` to its host's
// other members.
void spread_inside_host(Schedule& sch, const Builder& b, const HostSplit& split, int lead,
                        const Tensor& tensor) {
  Step& out = sch.add_step();
  for (int j : split.hosts[static_cast<std::size_t>(split.mine)]) {
    if (j == lead) continue;
    if (b.me() == lead) send(out, b.members()[j], tensor);
    else if (b.me() == j) recv(out, b.members()[lead], tensor);
  }
}

}  // namespace

Completion broadcast(const CallSetup& s, Tensor& tensor, int root) {
  Builder b(s, Kind::Broadcast);
  int r = -1;
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    r = b.root(root, "src");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_broadcast(*s.lane, tensor, r, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  auto sch = b.make();
  if (b.ok() && tensor.numel() > 0) {
    if (const HostSplitPtr& split = s.split) {
      // The root sends to its host's members and to the other hosts' leaders, which pass it
      // on inside their hosts: one message to each other host.
      sch->keep(tensor);
      const std::vector<int> leaders = split->leaders(r);
      Step& first = sch->add_step();
      for (std::size_t h = 0; h < split->hosts.size(); ++h) {
        const bool root_host = leaders[h] == r;
        for (int j : split->hosts[h]) {
          if (j == r || (!root_host && j != leaders[h])) continue;  // reached in step 2
          if (b.me() == r) send(first, b.members()[j], tensor);
          else if (b.me() == j) recv(first, b.members()[r], tensor);
        }
      }
      const int lead = leaders[static_cast<std::size_t>(split->mine)];
      if (lead != r) spread_inside_host(*sch, b, *split, lead, tensor);
      return finish(sch, tensor.nbytes());
    }
  }
  if (b.ok()) {
    sch->keep(tensor);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j)
        if (j != r) send(step, b.members()[j], tensor);
    } else {
      recv(step, b.members()[r], tensor);
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion reject(const CallSetup& s, Kind kind, const std::string& why) {
  Builder b(s, kind);
  b.fail(why);
  return finish(b.make(), 0);
}

Completion all_reduce(const CallSetup& s, Tensor& tensor, ReduceOp op) {
  if (s.blocking && s.lane && tensor.defined())
    if (std::optional<Completion> done = small_all_reduce(s, tensor, op)) return std::move(*done);
  Builder b(s, Kind::AllReduce);
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    b.op(op, tensor.dtype());
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce(*s.lane, tensor, op, -1, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  const HostSplitPtr& split = s.split;
  if (b.ok() && split && tensor.numel() > 0 && tensor.nbytes() < kLeadersBelow)
    return finish(b.make(folded_reduce(tensor, op)), tensor.nbytes());
  auto sch = b.make();
  if (b.ok() && split && same_size_hosts(*split) &&
      (tensor.nbytes() < kColumnsBelow ||
       split->hosts.size() <= split->hosts[static_cast<std::size_t>(split->mine)].size())) {
    reduce_by_columns(*sch, b, tensor, op, *split);
  } else if (b.ok()) {
    const int n = b.n(), me = b.me();
    const std::int64_t count = tensor.numel();
    sch->keep(tensor);
    reduce_slices(*sch, b, tensor,
                  view_of(tensor, slice_begin(count, n, me), slice_len(count, n, me)), op, split);
    Step& out = sch->add_step();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      send(out, b.members()[j], view_of(tensor, slice_begin(count, n, me), slice_len(count, n, me)));
      recv(out, b.members()[j], view_of(tensor, slice_begin(count, n, j), slice_len(count, n, j)));
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion reduce(const CallSetup& s, Tensor& tensor, int root, ReduceOp op) {
  Builder b(s, Kind::Reduce);
  int r = -1;
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    b.op(op, tensor.dtype());
    r = b.root(root, "dst");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce(*s.lane, tensor, op, r, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  auto sch = b.make();
  // Across hosts: the flat schedule at every size, reduced host by host (the leaders' was
  // not measurably faster for reduce, docs/hosts.md).
  const HostSplitPtr& split = s.split;
  if (b.ok()) {
    const int n = b.n(), me = b.me();
    const std::int64_t count = tensor.numel();
    const std::int64_t m = slice_len(count, n, me);
    sch->keep(tensor);
    // Only the root's tensor is written: the others reduce into a private buffer.
    Tensor result = me == r ? view_of(tensor, slice_begin(count, n, me), m) : scratch(m, tensor.dtype());
    sch->keep(result);
    reduce_slices(*sch, b, tensor, result, op, split);
    Step& out = sch->add_step();
    if (me == r) {
      for (int j = 0; j < n; ++j)
        if (j != me)
          recv(out, b.members()[j], view_of(tensor, slice_begin(count, n, j), slice_len(count, n, j)));
    } else {
      send(out, b.members()[r], result);
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion all_gather(const CallSetup& s, std::vector<Tensor>& outputs, const Tensor& input) {
  Builder b(s, Kind::AllGather);
  if (b.tensor(input, "tensor")) {
    b.describe(input.dtype(), input.numel());
    b.list(outputs, "tensor_list", input.dtype(), &input, "tensor");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_all_gather(*s.lane, input, &outputs, nullptr),
                       input.nbytes() * b.n(), [&](Schedule& sch) { sch.keep(input); });
  auto sch = b.make();
  if (b.ok()) exchange(*sch, b, std::vector<Tensor>(b.n(), input), outputs);
  return finish(sch, b.ok() ? input.nbytes() * b.n() : 0);
}

Completion all_gather_into_tensor(const CallSetup& s, Tensor& output, const Tensor& input) {
  Builder b(s, Kind::AllGatherIntoTensor);
  if (b.tensor(input, "input") && b.tensor(output, "output")) {
    b.describe(input.dtype(), input.numel());
    if (output.dtype() != input.dtype())
      b.fail("output is " + std::string(dtype_name(output.dtype())) + " but input is " +
             std::string(dtype_name(input.dtype())) + "; they must have the same dtype");
    else if (output.numel() != input.numel() * b.n())
      b.fail("output has " + std::to_string(output.numel()) + " elements; it must have group "
             "size x input elements = " + std::to_string(b.n()) + " x " +
             std::to_string(input.numel()));
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_all_gather(*s.lane, input, nullptr, bytes_of(output)),
                       input.nbytes() * b.n(), [&](Schedule& sch) {
                         sch.keep(input);
                         sch.keep(output);
                       });
  auto sch = b.make();
  if (b.ok()) {
    const std::int64_t k = input.numel();
    std::vector<Tensor> parts;
    for (int j = 0; j < b.n(); ++j) parts.push_back(view_of(output, j * k, k));
    sch->keep(output);
    exchange(*sch, b, std::vector<Tensor>(b.n(), input), parts);
  }
  return finish(sch, b.ok() ? input.nbytes() * b.n() : 0);
}

Completion gather(const CallSetup& s, const Tensor& input, std::vector<Tensor>& outputs, int root) {
  Builder b(s, Kind::Gather);
  int r = -1;
  if (b.tensor(input, "tensor")) {
    b.describe(input.dtype(), input.numel());
    r = b.root(root, "dst");
    if (b.ok() && b.me() == r) b.list(outputs, "gather_list", input.dtype(), &input, "tensor");
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(input);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j) {
        sch->keep(outputs[j]);
        if (j != r) recv(step, b.members()[j], outputs[j]);
      }
      Tensor own = outputs[r];
      step.after = [input, own] { copy_elements(input, own); };
    } else {
      send(step, b.members()[r], input);
    }
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}

Completion scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs, int root) {
  Builder b(s, Kind::Scatter);
  int r = -1;
  if (b.tensor(output, "tensor")) {
    b.describe(output.dtype(), output.numel());
    r = b.root(root, "src");
    if (b.ok() && b.me() == r) b.list(inputs, "scatter_list", output.dtype(), &output, "tensor");
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(output);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j) {
        sch->keep(inputs[j]);
        if (j != r) send(step, b.members()[j], inputs[j]);
      }
      Tensor own = inputs[r];
      step.after = [own, output] { copy_elements(own, output); };
    } else {
      recv(step, b.members()[r], output);
    }
  }
  return finish(sch, b.ok() ? output.nbytes() : 0);
}

Completion reduce_scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs,
                          ReduceOp op) {
  Builder b(s, Kind::ReduceScatter);
  if (b.tensor(output, "output")) {
    b.describe(output.dtype(), output.numel());
    b.op(op, output.dtype());
    if (b.ok()) b.list(inputs, "input_list", output.dtype(), &output, "output");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce_scatter(*s.lane, &inputs, nullptr, output, op, b.me()),
                       output.nbytes() * b.n(), [&](Schedule& sch) { sch.keep(output); });
  auto sch = b.make();
  if (b.ok()) {
    scatter_reduce(*sch, b, inputs, output, op, s.split);
  }
  return finish(sch, b.ok() ? output.nbytes() * b.n() : 0);
}

Completion reduce_scatter_tensor(const CallSetup& s, Tensor& output, const Tensor& input,
                                 ReduceOp op) {
  Builder b(s, Kind::ReduceScatterTensor);
  if (b.tensor(output, "output") && b.tensor(input, "input")) {
    b.describe(output.dtype(), output.numel());
    b.op(op, output.dtype());
    if (input.dtype() != output.dtype())
      b.fail("input is " + std::string(dtype_name(input.dtype())) + " but output is " +
             std::string(dtype_name(output.dtype())) + "; they must have the same dtype");
    else if (input.numel() != output.numel() * b.n())
      b.fail("input has " + std::to_string(input.numel()) + " elements; it must have group "
             "size x output elements = " + std::to_string(b.n()) + " x " +
             std::to_string(output.numel()));
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce_scatter(*s.lane, nullptr, bytes_of(input), output, op, b.me()),
                       input.nbytes(), [&](Schedule& sch) {
                         sch.keep(input);
                         sch.keep(output);
                       });
  auto sch = b.make();
  if (b.ok()) {
    std::vector<Tensor> parts;
    for (int j = 0; j < b.n(); ++j) parts.push_back(view_of(input, j * output.numel(), output.numel()));
    sch->keep(input);
    scatter_reduce(*sch, b, parts, output, op, s.split);
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}


Completion all_to_all(const CallSetup& s, std::vector<Tensor>& outputs,
                      const std::vector<Tensor>& inputs) {
  Builder b(s, Kind::AllToAll);
  if (!inputs.empty() && inputs[0].defined()) {
    const DType dtype = inputs[0].dtype();
    b.describe(dtype, 0);
    if (b.list(inputs, "input_list", dtype, nullptr, nullptr) &&
        b.list(outputs, "output_list", dtype, nullptr, nullptr)) {
      std::vector<std::int64_t> sends, recvs;
      for (int j = 0; j < b.n(); ++j) {
        sends.push_back(inputs[j].numel());
        recvs.push_back(outputs[j].numel());
      }
      b.splits(std::move(sends), std::move(recvs));
    }
  } else {
    b.list(inputs, "input_list", kFloat32, nullptr, nullptr);
    b.fail("input_list[0] is undefined or missing");
  }
  auto sch = b.make();
  if (b.ok()) exchange(*sch, b, inputs, outputs);
  std::uint64_t bytes = 0;
  for (const Tensor& t : inputs) bytes += t.defined() ? t.nbytes() : 0;
  return finish(sch, bytes);
}

namespace {
// Rows per member along dim 0 (equal splits when `splits` is empty), or a failure.
std::vector<std::int64_t> rows_per_member(Builder& b, const Tensor& t, const char* role,
                                          const std::vector<std::int64_t>& splits) {
  const std::int64_t rows = t.sizes()[0];
  const int n = b.n();
  if (splits.empty()) {
    if (rows % n != 0) {
      b.fail(std::string(role) + " has " + std::to_string(rows) + " rows along dim 0, which do "
             "not split equally among " + std::to_string(n) + " members; pass split sizes");
      return {};
    }
    return std::vector<std::int64_t>(n, rows / n);
  }
  if (static_cast<int>(splits.size()) != n) {
    b.fail(std::string(role) + "_split_sizes has " + std::to_string(splits.size()) +
           " entries; it needs one per group member (" + std::to_string(n) + ")");
    return {};
  }
  std::int64_t sum = 0;
  for (std::int64_t v : splits) {
    if (v < 0) {
      b.fail(std::string(role) + "_split_sizes holds the negative size " + std::to_string(v));
      return {};
    }
    sum += v;
  }
  if (sum != rows) {
    b.fail(std::string(role) + "_split_sizes add up to " + std::to_string(sum) + " rows but " +
           role + " has " + std::to_string(rows) + " along dim 0");
    return {};
  }
  return splits;
}

std::int64_t row_elements(const Tensor& t) {
  std::int64_t e = 1;
  for (std::size_t d = 1; d < t.sizes().size(); ++d) e *= t.sizes()[d];
  return e;
}
}  // namespace

Completion all_to_all_single(const CallSetup& s, Tensor& output, const Tensor& input,
                             const std::vector<std::int64_t>& output_splits,
                             const std::vector<std::int64_t>& input_splits) {
  Builder b(s, Kind::AllToAllSingle);
  std::vector<std::int64_t> in_rows, out_rows;
  if (b.tensor(input, "input") && b.tensor(output, "output")) {
    b.describe(input.dtype(), 0);
    if (input.dim() < 1 || output.dim() < 1)
      b.fail("input and output need at least one dimension (they are split along dim 0)");
    else if (input.dtype() != output.dtype())
      b.fail("output is " + std::string(dtype_name(output.dtype())) + " but input is " +
             std::string(dtype_name(input.dtype())) + "; they must have the same dtype");
    else if (row_elements(input) != row_elements(output))
      b.fail("a row (dim 0 entry) of input has " + std::to_string(row_elements(input)) +
             " elements but one of output has " + std::to_string(row_elements(output)));
    if (b.ok()) in_rows = rows_per_member(b, input, "input", input_splits);
    if (b.ok()) out_rows = rows_per_member(b, output, "output", output_splits);
  }
  std::vector<Tensor> sends, recvs;
  if (b.ok()) {
    const std::int64_t row = row_elements(input);
    std::vector<std::int64_t> send_counts, recv_counts;
    std::int64_t in_at = 0, out_at = 0;
    for (int j = 0; j < b.n(); ++j) {
      send_counts.push_back(in_rows[j] * row);
      recv_counts.push_back(out_rows[j] * row);
      sends.push_back(view_of(input, in_at, in_rows[j] * row));
      recvs.push_back(view_of(output, out_at, out_rows[j] * row));
      in_at += in_rows[j] * row;
      out_at += out_rows[j] * row;
    }
    b.splits(std::move(send_counts), std::move(recv_counts));
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(input);
    sch->keep(output);
    exchange(*sch, b, sends, recvs);
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}

// On the world lane one round whose slots carry only the fingerprints; on a sub-group the
// fingerprint exchange alone (every member hears from every other before it completes).
Completion barrier(const CallSetup& s) {
  Builder b(s, Kind::Barrier);
  if (b.on_lane()) return run_on_lane(s, b, LanePlan{}, 0, [](Schedule&) {});
  return finish(b.make(), 0);
}

void monitored_barrier(const CallSetup& s, std::chrono::milliseconds timeout, bool wait_all) {
  Builder b(s, Kind::MonitoredBarrier);
  auto sch = b.make();
  Completion done = finish(sch, 0);
  if (s.engine->wait(*done, timeout)) return;
  std::vector<int> missing;
  sch->awaited_peers(missing);
  std::sort(missing.begin(), missing.end());
  if (!wait_all && missing.size() > 1) missing.erase(missing.begin() + 1, missing.end());
  std::string list;
  for (int m : missing) list += (list.empty() ? "" : ", ") + std::to_string(m);
  const bool one = missing.size() == 1;
  const std::string ms = std::to_string(timeout.count()) + " ms";
  const std::string me = std::to_string(s.engine->rank());
  // Our words first, then gloo's for the same event: code and tests written for gloo
  // (torch's own among them) recognise a failed monitored barrier by gloo's sentences.
  const std::string gloo_words =
      timeout.count() == 0 ? "Rank " + me + " timed out in monitoredBarrier after 0 ms"
                           : (one ? "Rank " : "Ranks ") + list +
                                 " failed to pass monitoredBarrier in " + ms;
  throw Timeout(call_name(Kind::MonitoredBarrier, s.group, s.seq) + " on rank " + me + ": " +
                (one ? "rank " : "ranks ") + list + (one ? " has" : " have") +
                " not arrived within " + ms +
                (wait_all ? "" : " (the first missing rank; pass wait_all_ranks=true for all)") +
                ". In gloo's words: " + gloo_words + ".");
}

}  // namespace shmdist::coll
