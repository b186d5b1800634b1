// The progress engine: what a message means. Matches incoming messages to posted receives
// (in posting order) or keeps them as unexpected messages (in arrival order), queues sends
// per destination (FIFO), and drives every pending operation of its rank whenever any call
// waits, so that patterns which are safe with unlimited buffering never deadlock.
//
// Threading: several threads of the rank may use one Engine at once (calls on different
// groups, docs/semantics.md "Threads"). Every call holds the engine's lock (enter(), taken at
// the ProcessGroup's entry points; engine/engine_lock.hpp says why that is enough), which
// its waits let go of while they have nothing to do. Unit tests that drive an Engine from a
// single thread may skip enter(): a wait releases the lock only if its thread holds it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iosfwd>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/background.hpp"
#include "engine/engine_lock.hpp"
#include "engine/operation.hpp"
#include "engine/waiter.hpp"
#include "transport/link.hpp"
#include "wait/spin.hpp"

namespace shmdist::engine {

using detail::Operation;

class Engine : public transport::InboundHandler, public std::enable_shared_from_this<Engine> {
 public:
  Engine(transport::Link link, wait::SpinPolicy spin,
         std::chrono::milliseconds timeout);
  ~Engine() override;

  // The right to call into the engine, for one call of one thread (engine_lock.hpp). Empty
  // when the thread was inside already (a call made from within another: re-entrant).
  class Entry {
   public:
    Entry() = default;
    explicit Entry(EngineLock* lock) : lock_(lock) {}
    Entry(Entry&& other) noexcept : lock_(std::exchange(other.lock_, nullptr)) {}
    Entry& operator=(Entry&&) = delete;
    ~Entry() {
      if (lock_) lock_->release();
    }

   private:
    EngineLock* lock_ = nullptr;
  };
  // Enters the engine for `call` (a string literal: "all_reduce"), waiting at most `limit`
  // (default: the group's timeout) for another thread's call to let it in; throws Timeout
  // naming both calls after that. Calls that wait let others in, so that happens only if a
  // thread is stuck inside the engine without waiting (stopped in a debugger, say).
  [[nodiscard]] Entry enter(const char* call) { return enter(call, timeout_); }
  [[nodiscard]] Entry enter(const char* call, Clock::duration limit);
  // As enter(), but an empty optional instead of Timeout (Work::wait with a limit of its own:
  // it returns false, "still pending").
  [[nodiscard]] std::optional<Entry> try_enter(const char* call, Clock::duration limit);

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  transport::Transport& transport() { return *transport_; }

  // Blocking point-to-point. `candidates` lists the global ranks an any-source receive may
  // hear from (the group's members). recv returns the sender's global rank.
  void send(const Tensor& tensor, int dst, const MatchKey& key);
  int recv(Tensor& tensor, int src, const MatchKey& key, const std::vector<int>& candidates,
           bool any_size = false, std::uint32_t blocked_as = kBlockedRecv);

  std::shared_ptr<Operation> isend(const Tensor& tensor, int dst, const MatchKey& key);
  // `any_size`: take a byte message of whatever size; the operation's `keep` holds it once done.
  // `consumer`: takes the bytes as they arrive (Operation::consumer); `tensor` is where a
  // transport may land them first.
  std::shared_ptr<Operation> irecv(const Tensor& tensor, int src, const MatchKey& key,
                                   const std::vector<int>& candidates, bool any_size = false,
                                   std::shared_ptr<transport::ByteConsumer> consumer = nullptr);

  // Withdraws the receive `op` if no message has matched it yet, and returns whether it did
  // (`op` then fails, saying so). For a layer above that posts a receive before it knows a
  // message will come (a collective's first data step, posted while the calls' agreement
  // runs: no message comes if they disagree).
  bool cancel_receive(Operation& op);

  // Waits for `op`; throws what it failed with. With a timeout, returns false if it is still
  // pending then; without one, throws Timeout after the process group's timeout.
  bool wait(Operation& op, std::optional<std::chrono::milliseconds> timeout);
  // Makes progress once, without blocking; returns whether `op` is done (failed counts).
  bool test(Operation& op);

  // destroy_process_group: finishes pending sends, marks this rank finalized, waits (while
  // draining) until every peer has finalized or ended, then reports to `report` the messages
  // that arrived and were never received, one line per peer. Never throws.
  void finalize(std::ostream& report);
  // The end of a rank that did not call destroy_process_group (it returned from main or called
  // exit, or its ProcessGroup was unwound by an exception): pushes out queued sends for at most
  // `flush_limit` (none if zero), then, if `mark`, marks this rank finalized (it sends nothing
  // more); never waits for the peers. Pending operations fail; unsent data is reported.
  void abandon(Clock::duration flush_limit, bool mark, std::ostream& report);

  // Registers a task that progress() drives until it is finished, and advances it once.
  void add_task(std::shared_ptr<BackgroundTask> task);
  // A blocking call of a layer above that drives itself in its caller's frame (lib/coll/'s
  // calls on the world lane): spins, then sleeps, until until() says it is done (a bool, or a
  // Look: Moved restarts the spin time), making progress on everything else meanwhile.
  // `focus` is what the hang report shows and whom the call waits for (focus.subject names it
  // in Timeout and PeerFailure texts and peer checks); `spin`, if set, how it spins (Waiter).
  // Throws Timeout after the process group's timeout, PeerFailure as every wait does, and
  // whatever until() throws.
  template <class Until>
  void wait_until(Until&& until, const WaitFocus& focus, SpinChoice spin = std::nullopt) {
    if (!block_until(until, focus, timeout_, spin)) waiter_.throw_timeout(focus, timeout_);
  }
  // The job's spin policy (for a caller that chooses its wait's SpinChoice).
  const wait::SpinPolicy& spin_policy() const { return spin_; }

  // Operations of this rank not yet complete (posted receives, queued sends, in flight).
  std::size_t pending_operations() const;

  // For a wait outside the engine that needs every rank (torch's store-based barrier):
  // throws PeerFailure naming the rank if a peer ended abnormally or the job was aborted.
  // Never blocks; peers' processes are polled at most every health-check interval.
  void check_peers(const std::string& waiting_for) { waiter_.check_peers(waiting_for); }

  // new_group's bookkeeping (groups.cpp): this rank's group `id` (1, 2, ... in creation order)
  // has the sorted global ranks `members` and signature `sig`. Every message on a group is
  // checked against this rank's group of the same id, so that ranks which created groups in
  // different orders, or skipped one, learn it from the first message instead of waiting for
  // a match that cannot come.
  void register_group(std::uint32_t id, std::uint32_t sig, std::vector<int> members);
  // The first disagreement about groups this rank has seen, naming the rank it disagrees
  // with; empty if none. Once set, every operation on a group (not the world) throws it.
  const std::string& group_disagreement() const { return group_disagreement_; }

  // Runs at every health check (a blocked call's, check_peers'): for a layer above that keeps
  // something needing a periodic look (the identity claim's listen queues,
  // bootstrap/identity_claim.hpp). Set once, before the engine is shared; must be cheap and must
  // not throw.
  void set_health_hook(std::function<void()> hook) { waiter_.set_health_hook(std::move(hook)); }

 private:
  struct Unexpected {
    transport::Envelope env;
    std::unique_ptr<std::byte[]> buffer;
    std::uint64_t seq = 0;  // arrival (start) order
    bool complete = false;
  };
  struct Inflight {  // the message currently streaming in from one source
    transport::InboundSink sink;
    transport::Envelope env;
    Operation* receiver = nullptr;
    Unexpected* unexpected = nullptr;
    std::uint64_t seq = 0;
  };
  using PostedList = boost::intrusive::list<
      Operation, boost::intrusive::member_hook<Operation, PostedHook, &Operation::posted_hook>,
      boost::intrusive::constant_time_size<false>>;

  // InboundHandler
  transport::InboundSink* on_message_start(const transport::Envelope& env) override;
  void on_message_complete(transport::InboundSink* sink, const transport::Envelope& env) override;

  // matcher.cpp
  Operation* take_posted_match(const transport::Envelope& env);
  void attach_receiver(Inflight& f, Operation& op);
  void to_unexpected(Inflight& f);
  void post_receive(Operation& op);
  void deliver(Operation& op, Unexpected& u);
  void claim_inflight(Operation& op, Unexpected& u);
  void withdraw_receive(Operation& op, bool wait_failed);
  bool settle_inbound(Inflight& f, bool wait_failed);
  std::shared_ptr<void> memory_of(Inflight& f);
  void finish_receive(Operation& op, const transport::Envelope& env);
  std::list<Unexpected>::iterator insert_unexpected(Unexpected u);
  void erase_unexpected(std::list<Unexpected>::iterator it);

  // groups.cpp
  struct GroupRecord {
    std::uint32_t sig = 0;
    std::vector<int> members;
  };
  void check_group(const transport::Envelope& env);
  std::string group_text(std::uint32_t id) const;
  // How a message's group reads on this rank: with its members if it is this rank's group of
  // that number, otherwise saying it is not.
  std::string group_text_for(std::uint32_t id, std::uint32_t sig) const;

  // engine.cpp: entry points, progress
  const std::vector<int>* intern_candidates(const std::vector<int>& candidates);
  void send_blocking(const Tensor& tensor, int dst, const MatchKey& key,
                     const transport::OutboundMessage* begun);
  int try_receive_direct(Tensor& tensor, int src, const MatchKey& key);  // sender, or -1
  void await_blocking(Operation& op, const WaitFocus& focus, void (Engine::*withdraw)(Operation&, bool));
  static std::shared_ptr<Operation> completed_send();
  void finish_operation(Operation& op);
  void fail_operation(Operation& op, std::exception_ptr e);
  // Fails every pending operation and task with `error` (destructor, finalize, abandon);
  // returns how many sends it failed.
  std::size_t fail_all_pending(std::exception_ptr error);
  bool progress(int preferred, bool full_scan);
  bool advance_tasks();

  // send_queues.cpp: one FIFO per destination
  void setup_send(Operation& op, const Tensor& tensor, int dst, const MatchKey& key);
  void start_send(Operation& op);
  bool push_sends();
  void withdraw_send(Operation& op, bool wait_failed);
  void drop_send(Operation& op, std::exception_ptr e);
  // A send whose message is done: completed, or failed if the transport says it failed on
  // the receiver's side (out.failure).
  void end_send(Operation& op);

  // finalize.cpp: destroy_process_group is drain, tally, fail what is left, report.
  struct Tally;  // the user's messages never received and receives never matched, by peer
  std::string drain();
  Tally tally_unfinished() const;
  void write_report(std::ostream& report, const Tally& tally, const std::string& problem) const;

  // The waiter's hooks into this engine (Waiter::block_until): inline, no virtual call.
  struct WaiterHooks {
    Engine* e;
    bool progress(int preferred, bool full_scan) const { return e->progress(preferred, full_scan); }
    std::size_t pending_operations() const { return e->pending_operations(); }
  };
  // Spins, then sleeps, until done() (true) or the deadline (false), making progress on
  // every pending operation meanwhile. Throws PeerFailure when the wait cannot succeed.
  template <class Done>
  bool block_until(Done&& done, const WaitFocus& focus, Clock::duration limit,
                   SpinChoice spin = std::nullopt) {
    return waiter_.block_until(done, WaiterHooks{this}, focus, limit, spin);
  }
  void wake_sleepers() { waiter_.wake_sleepers(); }

  EngineLock lock_;

  // The link (transport/link.hpp): bytes on the fast path; sleeping and peers' health only
  // on slow paths (a wait that found nothing, a timeout, destroy). Declared so that the
  // transport, which may use the other two, is destroyed first.
  std::shared_ptr<transport::Peers> peers_;
  std::shared_ptr<transport::Waker> waker_;
  std::unique_ptr<transport::Transport> transport_;
  int rank_;
  int world_;
  wait::SpinPolicy spin_;
  std::chrono::milliseconds timeout_;

  PostedList posted_;
  std::list<Unexpected> unexpected_;
  std::vector<std::uint32_t> unexpected_from_;   // entries of unexpected_ by source
  std::vector<Inflight> inflight_;                 // by source
  std::vector<std::deque<Operation*>> send_queues_;  // by destination
  std::vector<int> sending_to_;                    // destinations with queued sends
  std::vector<std::shared_ptr<BackgroundTask>> tasks_;  // unfinished collectives, in start order
  std::uint64_t arrivals_ = 0;
  std::vector<int> all_peers_;
  std::deque<std::vector<int>> candidate_lists_;  // intern_candidates (stable addresses)
  std::vector<GroupRecord> groups_;  // by id - 1
  std::string group_disagreement_;
  Waiter waiter_;  // after what it refers to: the link, lock_, spin_, all_peers_
  bool finalized_ = false;
};

}  // namespace shmdist::engine
