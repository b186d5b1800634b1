// The collectives of API.md §7 as schedules: each builder checks its arguments (a bad one
// makes this member reject the call in its fingerprint, so that every member throws), builds
// the steps and starts them. They return the completion a Work refers to.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/schedule.hpp"

namespace shmdist::coll {

using Completion = std::shared_ptr<detail::Operation>;

// `root` arguments are global ranks, as in the public API.
// A call of `kind` whose arguments this member's runtime rejected before shmdist saw them
// (torch: a dtype or layout shmdist does not carry): it takes part in the members' agreement
// as rejected, so the others' calls fail at once naming this member, this one fails with
// InvalidArgument(call name + ": " + why), and nothing moves. Keeps the group's count alike.
Completion reject(const CallSetup& s, Kind kind, const std::string& why);
Completion broadcast(const CallSetup& s, Tensor& tensor, int root);
Completion all_reduce(const CallSetup& s, Tensor& tensor, ReduceOp op);
Completion reduce(const CallSetup& s, Tensor& tensor, int root, ReduceOp op);
Completion all_gather(const CallSetup& s, std::vector<Tensor>& outputs, const Tensor& input);
Completion all_gather_into_tensor(const CallSetup& s, Tensor& output, const Tensor& input);
Completion gather(const CallSetup& s, const Tensor& input, std::vector<Tensor>& outputs, int root);
Completion scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs, int root);
Completion reduce_scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs,
                          ReduceOp op);
Completion reduce_scatter_tensor(const CallSetup& s, Tensor& output, const Tensor& input,
                                 ReduceOp op);
Completion all_to_all(const CallSetup& s, std::vector<Tensor>& outputs,
                      const std::vector<Tensor>& inputs);
Completion all_to_all_single(const CallSetup& s, Tensor& output, const Tensor& input,
                             const std::vector<std::int64_t>& output_splits,
                             const std::vector<std::int64_t>& input_splits);
// A collective without data: no member's call completes before every member has made this
// same call (the group's call number included), and it takes part in the members' agreement
// like every other collective, so a member in another call fails at once on every member.
Completion barrier(const CallSetup& s);
// Blocking: group rank 0 waits up to `timeout` for every member, then releases them all,
// telling them who was missing; everyone that took part throws Timeout naming them.
void monitored_barrier(const CallSetup& s, std::chrono::milliseconds timeout, bool wait_all);

}  // namespace shmdist::coll
