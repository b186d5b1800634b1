// How a collective's builder describes the call and puts its schedule together: the call's
// fingerprint, the checks of its arguments (a bad one makes this member reject the call in
// its fingerprint, so that every member throws), the steps' transfers, the start.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/collectives.hpp"
#include "coll/kinds.hpp"
#include "coll/reduce.hpp"
#include "coll/schedule.hpp"

namespace shmdist::coll {

// A call's fingerprint, each field set here only (Fingerprint has no padding: peers compare
// the bytes): the Builder sets them as it checks the arguments, small_all_reduce, which
// builds no Builder, through the same functions, so both send the same bytes for one call.
void fingerprint_call(Fingerprint& fp, const CallSetup& s, Kind kind);
void fingerprint_data(Fingerprint& fp, DType dtype, std::int64_t count);
void fingerprint_op(Fingerprint& fp, ReduceOp op);

// Collects the call's description and the first problem with this member's arguments.
class Builder {
 public:
  Builder(const CallSetup& s, Kind kind) : s_(s), kind_(kind) { fingerprint_call(call_.fp, s, kind); }

  int n() const { return s_.group.size(); }
  int me() const { return s_.group.me; }
  bool ok() const { return !error_; }
  // The data move on the world lane (coll/kinds.hpp's chooser, the one place that decides).
  bool on_lane() const { return choose_route(kind_, s_.lane != nullptr, ok()) == Route::Lane; }
  std::span<const int> members() const { return s_.group.members; }

  void fail(const std::string& why) {
    if (!error_) error_ = call_name(kind_, s_.group, s_.seq) + ": " + why;
  }
  bool tensor(const Tensor& t, const char* role) {
    if (!t.defined())
      fail(std::string("the ") + role + " is undefined (default-constructed); pass a tensor "
           "made with zeros(), empty(), tensor({...}) or from_blob()");
    return ok();
  }
  void describe(DType dtype, std::int64_t count) { fingerprint_data(call_.fp, dtype, count); }
  void op(ReduceOp op, DType dtype) {
    fingerprint_op(call_.fp, op);
    if (auto why = unsupported(op, dtype)) fail(*why);
  }
  // The root's group rank, or -1 (and a failure) if it is not a member.
  int root(int global_root, const char* role);
  // One tensor per member, each defined, of `dtype` and, unless `like` is null, of the
  // shape of `like` (the call's single tensor, named `like_role`): gloo refuses another
  // shape with the same element count too, and a user who passes one has mixed up the
  // outputs (a silent reshape would hand back rows where columns were meant).
  bool list(const std::vector<Tensor>& l, const char* role, DType dtype, const Tensor* like,
            const char* like_role);
  void splits(std::vector<std::int64_t> sends, std::vector<std::int64_t> recvs) {
    call_.send_counts = std::move(sends);
    call_.recv_counts = std::move(recvs);
  }

  std::shared_ptr<Schedule> make(std::optional<FoldedReduce> fold = std::nullopt) {
    return std::make_shared<Schedule>(s_, call_, error_, std::move(fold));
  }
  // The call as a blocking lane call sees it (only when ok()), moved out of the builder.
  CallContext take_context() {
    CallContext ctx;
    ctx.group = s_.group;
    ctx.seq = s_.seq;
    ctx.call = std::move(call_);  // its fingerprint has seq and group size (fingerprint_call)
    return ctx;
  }

 private:
  const CallSetup& s_;
  Kind kind_;
  CallDescription call_;
  std::optional<std::string> error_;
};

// A step's transfers: `view` goes to, or comes from, global rank `peer`.
inline void send(Step& step, int peer, Tensor view) {
  step.transfers.push_back({Transfer::Dir::Send, peer, std::move(view)});
}
inline void recv(Step& step, int peer, Tensor view) {
  step.transfers.push_back({Transfer::Dir::Recv, peer, std::move(view)});
}

// Starts the built schedule; `bytes` is what the hang report says the call moves.
inline Completion finish(const std::shared_ptr<Schedule>& sch, std::uint64_t bytes) {
  sch->bytes = bytes;
  return sch->start();
}

}  // namespace shmdist::coll
