// ProcessGroup: argument checking, group bookkeeping and translation to engine calls.

#include <exception>
#include <iostream>
#include <set>

#include "base/cpus.hpp"
#include "base/env.hpp"
#include "coll/scratch.hpp"
#include "engine/group_name.hpp"
#include "pg/impl.hpp"
#include "segment/job_state.hpp"
#include "transport/shm_transport.hpp"

namespace shmdist {
namespace {

// Argument checks run on every call: the tests are inline, the messages are built out of
// line, only when something is wrong.
[[noreturn, gnu::cold, gnu::noinline]] void bad_tag(int tag, const char* call) {
  throw InvalidArgument(std::string(call) + ": tag " + std::to_string(tag) +
                        " is negative; tags must be >= 0");
}

inline void check_tag(int tag, const char* call) {
  if (tag < 0) [[unlikely]]
    bad_tag(tag, call);
}

[[noreturn, gnu::cold, gnu::noinline]] void bad_tensor(const char* call) {
  throw InvalidArgument(std::string(call) +
                        ": the tensor is undefined (default-constructed); pass a tensor made "
                        "with zeros(), empty(), tensor({...}) or from_blob()");
}

inline void check_tensor(const Tensor& t, const char* call) {
  if (!t.defined()) [[unlikely]]
    bad_tensor(call);
}

}  // namespace

ProcessGroup::Impl::Impl(detail::JoinedWorld joined)
    : segment(std::move(joined.segment)), rank(joined.rank), segment_rank(joined.segment_rank),
      world(joined.world), host_of(std::move(joined.host_of)), timeout(joined.timeout),
      supervised(joined.supervised), after_destroy(std::move(joined.after_destroy)) {
  const config::Config& config = joined.config;
  // The job's CPU count, one answer for the engine's spin policy and the world lane.
  const int cpus = cpus::for_job(config.local_cpus);
  const auto spin = wait::SpinPolicy::for_job(config.spin_us, cpus, config.health_check);
  engine = std::make_shared<engine::Engine>(std::move(joined.link), spin, timeout);
  if (joined.health_hook) engine->set_health_hook(std::move(joined.health_hook));
  // The world group's collectives use the segment's lane only when the segment holds the
  // whole world (one host); a job across hosts runs them over point-to-point, whose
  // transports route each peer (same host: shared memory, other hosts: MPI).
  if (segment->world_size() == world)
    world_lane = std::make_unique<coll::ShmLane>(segment, segment_rank, cpus);
  auto w = std::make_shared<detail::GroupInfo>();
  w->owner = this;
  for (int i = 0; i < world; ++i) w->members.push_back(i);
  w->my_rank = rank;
  world_group = std::move(w);
}

// ---- Group ----------------------------------------------------------------------------------

bool Group::is_member() const { return info_ == nullptr || info_->my_rank >= 0; }

const std::vector<int>& Group::ranks() const {
  static const std::vector<int> none;
  return info_ ? info_->members : none;
}

// ---- lifetime -------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(const InitOptions& options)
    : impl_(std::make_shared<Impl>(detail::join_from_environment(options))) {}
ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&& other) noexcept {
  if (this != &other) {
    try {
      if (is_initialized()) destroy();
    } catch (...) {
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}
ProcessGroup::~ProcessGroup() {
  try {
    // Unwound by an exception: the rank is failing, so it must not wait for its peers (they
    // learn of the failure from the launcher, or see this rank gone).
    if (is_initialized() && std::uncaught_exceptions() > 0) impl_->end_without_destroy(std::nullopt);
    if (is_initialized()) destroy();
  } catch (...) {
  }
}

// Up to this long for queued sends to leave when a rank ends without destroy_process_group.
static constexpr std::chrono::milliseconds kExitFlushLimit{2000};

// A rank that exits with a non-zero status fails the job at once, naming itself and its exit
// status (peers' blocked calls throw PeerFailure; the launcher, which reaps it, agrees). One
// that exits 0, or whose status is unknown outside a launcher, flushes its queued sends for a
// bounded time and marks itself finalized: what it sent stays receivable, and it waits for no
// one. Under a launcher with the status unknown (an exception unwinding), it leaves the
// verdict to the launcher, which sees the exit status a moment later.
void ProcessGroup::Impl::end_without_destroy(std::optional<int> exit_status) {
  if (destroyed) return;
  destroyed = true;
  if (exit_status && *exit_status != 0) {
    // Not if the job was aborted already: this exit is then a consequence (a caught
    // PeerFailure), and the first cause must stay the one peers are told about.
    const bool aborted = segment->header().job_state.load(std::memory_order_acquire) ==
                         static_cast<std::uint32_t>(segment::JobState::Aborted);
    if (!aborted)
      segment::record_job_failure(*segment, segment_rank, segment::EndKind::Exited, *exit_status);
    segment::record_rank_end(*segment, segment_rank, segment::EndKind::Exited, *exit_status);
    engine->abandon(engine::Clock::duration::zero(), false, std::cerr);
  } else {
    const bool mark = exit_status.has_value() || !supervised;
    engine->abandon(std::min<engine::Clock::duration>(timeout, kExitFlushLimit), mark, std::cerr);
  }
  if (after_destroy) after_destroy();
}

bool ProcessGroup::is_initialized() const { return impl_ && !impl_->destroyed; }

[[noreturn, gnu::cold, gnu::noinline]] static void not_initialized() {
  throw NotInitialized(
      "the process group is not initialized (never created, or destroyed); call "
      "init_process_group() first, inside a job started with 'shmrun -n N program'");
}

ProcessGroup::Impl& ProcessGroup::impl() const {
  if (!impl_ || impl_->destroyed) [[unlikely]]
    not_initialized();
  return *impl_;
}

// Another thread must not be inside a call on this process group meanwhile (as with
// MPI_Finalize): the engine goes away here.
void ProcessGroup::destroy() {
  Impl& s = impl();
  {
    const auto entry = s.engine->enter("destroy_process_group");
    s.engine->finalize(std::cerr);
    s.destroyed = true;
  }
  s.engine.reset();
  s.world_lane.reset();  // it holds the segment too
  s.segment.reset();
  coll::release_scratch();
  if (s.after_destroy) s.after_destroy();
}

std::chrono::milliseconds ProcessGroup::timeout() const { return impl().timeout; }

// ---- groups ---------------------------------------------------------------------------------

namespace {
[[noreturn, gnu::cold, gnu::noinline]] void foreign_group(const char* call) {
  throw InvalidArgument(std::string(call) +
                        ": the group was created by another process group object; use groups "
                        "only with the ProcessGroup whose new_group() made them");
}

inline const detail::GroupInfo& resolve(const ProcessGroup::Impl& s, const Group& g,
                                        const char* call) {
  const detail::GroupInfo* info = g.info();
  if (!info) return *s.world_group;
  if (info->owner != &s) [[unlikely]]
    foreign_group(call);
  return *info;
}

[[noreturn, gnu::cold, gnu::noinline]] void not_member(const ProcessGroup::Impl& s,
                                                      const detail::GroupInfo& info,
                                                      const char* call) {
  throw InvalidArgument(std::string(call) + ": global rank " + std::to_string(s.rank) +
                        " is not a member of " + engine::group_name(info.id) +
                        "; only its members may use it");
}

[[noreturn, gnu::cold, gnu::noinline]] void groups_disagree(const ProcessGroup::Impl& s,
                                                          const detail::GroupInfo& info,
                                                          const char* call) {
  throw InvalidArgument(std::string(call) + " on " + engine::group_name(info.id) + ": " +
                        s.engine->group_disagreement());
}

inline const detail::GroupInfo& resolve_member(const ProcessGroup::Impl& s, const Group& g,
                                               const char* call) {
  const detail::GroupInfo& info = resolve(s, g, call);
  if (info.my_rank < 0) [[unlikely]]
    not_member(s, info, call);
  // Once two ranks are known to disagree about the groups, no group can be trusted.
  if (info.id != 0 && !s.engine->group_disagreement().empty()) [[unlikely]]
    groups_disagree(s, info, call);
  return info;
}

[[noreturn, gnu::cold, gnu::noinline]] void bad_peer(const ProcessGroup::Impl& s,
                                                    const detail::GroupInfo& info, int peer,
                                                    const char* call, const char* role,
                                                    bool any_allowed) {
  if (peer < 0 || peer >= s.world)
    throw InvalidArgument(std::string(call) + ": " + role + " rank " + std::to_string(peer) +
                          " is outside the world [0, " + std::to_string(s.world) + ")" +
                          (any_allowed ? "; use ANY_SOURCE (-1) to receive from anyone" : ""));
  if (peer == s.rank)
    throw InvalidArgument(std::string(call) + ": " + role + " rank " + std::to_string(peer) +
                          " is this rank itself; send to and receive from other ranks only");
  throw InvalidArgument(std::string(call) + ": global rank " + std::to_string(peer) +
                        " is not part of " + engine::group_name(info.id) + "; " + role +
                        " ranks are global ranks, and must be members of the group");
}

// Checks a peer given as a global rank for a call on `info`.
inline void check_peer(const ProcessGroup::Impl& s, const detail::GroupInfo& info, int peer,
                       const char* call, const char* role, bool any_allowed) {
  if (any_allowed && peer == ANY_SOURCE) return;
  if (peer < 0 || peer >= s.world || peer == s.rank ||
      (info.id != 0 && info.group_rank_of(peer) < 0)) [[unlikely]]
    bad_peer(s, info, peer, call, role, any_allowed);
}

}  // namespace

const detail::GroupInfo& detail::member_group(const ProcessGroup::Impl& s, const Group& g,
                                              const char* call) {
  return resolve_member(s, g, call);
}

namespace {
engine::MatchKey key_for(const detail::GroupInfo& info, int tag, std::uint8_t channel) {
  return {info.id, info.sig, tag, channel};
}
}  // namespace

int ProcessGroup::get_rank(const Group& group) const {
  return resolve(impl(), group, "get_rank").my_rank;
}

int ProcessGroup::get_world_size(const Group& group) const {
  const auto& info = resolve(impl(), group, "get_world_size");
  return info.my_rank < 0 ? -1 : static_cast<int>(info.members.size());
}

Group ProcessGroup::new_group(const std::vector<int>& ranks) {
  Impl& s = impl();
  if (ranks.empty())
    throw InvalidArgument("new_group: expected at least one rank, got an empty list");
  std::set<int> unique;
  for (int r : ranks) {
    if (r < 0 || r >= s.world)
      throw InvalidArgument("new_group: rank " + std::to_string(r) +
                            " is outside the world [0, " + std::to_string(s.world) +
                            "); the new group's ranks must be within the world size");
    if (!unique.insert(r).second)
      throw InvalidArgument("new_group: rank " + std::to_string(r) + " is listed twice");
  }
  const auto entry = s.engine->enter("new_group");
  auto info = std::make_shared<detail::GroupInfo>();
  info->owner = &s;
  info->id = s.next_group_id++;
  info->members.assign(unique.begin(), unique.end());
  info->sig = detail::members_signature(info->members);
  info->my_rank = info->group_rank_of(s.rank);
  s.engine->register_group(info->id, info->sig, info->members);
  return Group(std::move(info));
}

int ProcessGroup::get_group_rank(const Group& group, int global_rank) const {
  const auto& info = resolve(impl(), group, "get_group_rank");
  const int r = info.group_rank_of(global_rank);
  if (r < 0)
    throw InvalidArgument("get_group_rank: global rank " + std::to_string(global_rank) +
                          " is not part of " + engine::group_name(info.id));
  return r;
}

int ProcessGroup::get_global_rank(const Group& group, int group_rank) const {
  const auto& info = resolve(impl(), group, "get_global_rank");
  if (group_rank < 0 || group_rank >= static_cast<int>(info.members.size()))
    throw InvalidArgument("get_global_rank: group rank " + std::to_string(group_rank) +
                          " is not part of " + engine::group_name(info.id) + " (it has " +
                          std::to_string(info.members.size()) + " ranks)");
  return info.members[group_rank];
}

std::vector<int> ProcessGroup::get_process_group_ranks(const Group& group) const {
  return resolve(impl(), group, "get_process_group_ranks").members;
}

// ---- point-to-point -------------------------------------------------------------------------
//
// Every call enters the engine first (Engine::enter: several threads may call at once), also
// before its checks: they read the engine's record of group disagreements, which another
// thread's progress may write.

namespace {
// The checks of a point-to-point call, in order (tensor, tag, group, peer); returns its group.
inline const detail::GroupInfo& checked_p2p(const ProcessGroup::Impl& s, const Tensor& tensor,
                                            int peer, const Group& group, int tag,
                                            const char* call, bool receive) {
  check_tensor(tensor, call);
  check_tag(tag, call);
  const auto& info = resolve_member(s, group, call);
  check_peer(s, info, peer, call, receive ? "source" : "destination", receive);
  return info;
}
}  // namespace

void ProcessGroup::send(const Tensor& tensor, int dst, const Group& group, int tag) {
  Impl& s = impl();
  const auto entry = s.engine->enter("send");
  const auto& info = checked_p2p(s, tensor, dst, group, tag, "send", false);
  s.engine->send(tensor, dst, key_for(info, tag, transport::kUserChannel));
}

int ProcessGroup::recv(Tensor& tensor, int src, const Group& group, int tag) {
  Impl& s = impl();
  const auto entry = s.engine->enter("recv");
  const auto& info = checked_p2p(s, tensor, src, group, tag, "recv", true);
  return s.engine->recv(tensor, src, key_for(info, tag, transport::kUserChannel), info.members);
}

Work ProcessGroup::isend(const Tensor& tensor, int dst, const Group& group, int tag) {
  Impl& s = impl();
  const auto entry = s.engine->enter("isend");
  const auto& info = checked_p2p(s, tensor, dst, group, tag, "isend", false);
  return Work(s.engine->isend(tensor, dst, key_for(info, tag, transport::kUserChannel)));
}

Work ProcessGroup::irecv(Tensor& tensor, int src, const Group& group, int tag) {
  Impl& s = impl();
  const auto entry = s.engine->enter("irecv");
  const auto& info = checked_p2p(s, tensor, src, group, tag, "irecv", true);
  return Work(s.engine->irecv(tensor, src, key_for(info, tag, transport::kUserChannel), info.members));
}

std::vector<Work> ProcessGroup::batch_isend_irecv(const std::vector<P2POp>& ops) {
  Impl& s = impl();
  const auto entry = s.engine->enter("batch_isend_irecv");
  if (ops.empty())
    throw InvalidArgument("batch_isend_irecv: the list of operations is empty");
  const detail::GroupInfo* first = &resolve(s, ops.front().group, "batch_isend_irecv");
  for (const P2POp& op : ops) {
    const auto& info = resolve_member(s, op.group, "batch_isend_irecv");
    if (&info != first)
      throw InvalidArgument("batch_isend_irecv: all ops need to use the same group");
    check_tensor(op.tensor, "batch_isend_irecv");
    check_tag(op.tag, "batch_isend_irecv");
    const bool is_recv = op.op == P2POp::Kind::Recv;
    check_peer(s, info, op.peer, "batch_isend_irecv", is_recv ? "source" : "destination", is_recv);
  }
  std::vector<Work> works;
  works.reserve(ops.size());
  for (const P2POp& op : ops) {
    const auto key = key_for(*first, op.tag, transport::kUserChannel);
    if (op.op == P2POp::Kind::Send)
      works.push_back(Work(s.engine->isend(op.tensor, op.peer, key)));
    else
      works.push_back(Work(s.engine->irecv(op.tensor, op.peer, key, first->members)));
  }
  return works;
}

void ProcessGroup::send_bytes(std::span<const std::byte> bytes, int dst, const Group& group,
                              int tag) {
  const Tensor t = Tensor::from_blob(const_cast<std::byte*>(bytes.data()),
                                     {static_cast<std::int64_t>(bytes.size())}, kUInt8);
  send(t, dst, group, tag);
}

int ProcessGroup::recv_bytes(std::span<std::byte> bytes, int src, const Group& group, int tag) {
  Tensor t = Tensor::from_blob(bytes.data(), {static_cast<std::int64_t>(bytes.size())}, kUInt8);
  return recv(t, src, group, tag);
}

std::vector<std::byte> ProcessGroup::recv_bytes(int src, const Group& group, int tag,
                                                int* source) {
  Impl& s = impl();
  const auto entry = s.engine->enter("recv_bytes");
  check_tag(tag, "recv_bytes");
  const auto& info = resolve_member(s, group, "recv_bytes");
  check_peer(s, info, src, "recv_bytes", "source", true);
  Tensor t = empty({0}, kUInt8);
  const int from =
      s.engine->recv(t, src, key_for(info, tag, transport::kUserChannel), info.members, true);
  if (source) *source = from;
  const auto* p = static_cast<const std::byte*>(t.data_ptr());
  return std::vector<std::byte>(p, p + t.nbytes());
}

}  // namespace shmdist
