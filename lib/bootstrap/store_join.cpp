// Joining a job through a key-value store (torch's c10d::Store, for the torch.distributed
// backend): rank 0 creates a fresh segment under an unguessable name and announces it; the
// others attach to what was announced, after checking that it is this job's segment. The
// named objects go through the one named-object path (segment/named_object.hpp: creation
// lock, ownership check, the one way a name is removed).

#include "bootstrap/store_join.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/config.hpp"
#include "base/cpus.hpp"
#include "base/env.hpp"
#include "base/process_alive.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/rendezvous_object.hpp"
#include "segment/job_state.hpp"

namespace shmdist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// "rank <r>", r named as the texts name it: its global rank when the job is one host's ranks
// of a job across hosts (`global_of`, checked by join_world_through_store), else r.
std::string rank_text(int r, const std::vector<int>& global_of) {
  return "rank " + std::to_string(global_of.empty() ? r : global_of[static_cast<std::size_t>(r)]);
}

constexpr const char* kSegmentKey = "shmdist/segment";
constexpr const char* kRemedy =
    "start all ranks again with a fresh store (another MASTER_PORT or init file)";

// What rank 0 announces: the segment's name, its job key and its creator's pid. The job key
// (random, in the segment header) tells this job's segment from any other under that name.
struct Announcement {
  std::string name;
  std::uint64_t job_key = 0;
  long creator_pid = 0;

  std::string text() const {
    char key[32];
    std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(job_key));
    return name + " " + key + " " + std::to_string(creator_pid);
  }
  static Announcement parse(const std::string& text) {
    Announcement a;
    std::istringstream in(text);
    std::string key;
    in >> a.name >> key >> a.creator_pid;
    if (!in || a.name.rfind("shmdist-", 0) != 0 || a.name.find('/') != std::string::npos ||
        key.size() != 16 || key.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw SetupError("the store's '" + std::string(kSegmentKey) + "' entry is '" + text +
                       "': expected '<segment name> <job key> <pid>' written by rank 0 of "
                       "shmdist; is another program using the same store?");
    a.job_key = std::stoull(key, nullptr, 16);
    return a;
  }
};

// "shmdist-<uid>-[<tag>-]st-<128 random bits>": nobody can guess it, so nobody else creates it.
std::string fresh_name(const std::string& shm_tag) {
  std::uint64_t r[2] = {0, 0};
  if (getrandom(r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
    throw SetupError(std::string("getrandom failed: ") + std::strerror(errno));
  char random[40];
  std::snprintf(random, sizeof random, "st-%016llx%016llx", static_cast<unsigned long long>(r[0]),
                static_cast<unsigned long long>(r[1]));
  return shm_object_name(shm_tag, random);
}

// Why the announced segment cannot be joined, or "" if it can.
std::string why_not_joinable(const NamedObject& obj, const Announcement& a, int rank,
                             const std::vector<int>& global_of) {
  if (obj.fd < 0) return "its name is gone from /dev/shm";
  if (!obj.segment) return "it is incomplete";
  const auto& h = obj.segment->header();
  if (h.job_key != a.job_key) return "it belongs to another job (another job key)";
  if (static_cast<long>(h.creator_pid) != a.creator_pid ||
      !process_alive(static_cast<pid_t>(h.creator_pid)))
    return "its creator (pid " + std::to_string(a.creator_pid) + ") is gone";
  if (obj.segment->rank_control(rank).state.load(std::memory_order_acquire) != 0)
    return rank_text(rank, global_of) + " already joined it";
  return {};
}

// Attaches to the segment rank 0 announced. A store may still hold an earlier job's entry
// (an elastic restart, a reused file:// store) until this job's rank 0 overwrites it, so an
// entry that cannot be joined is read again until the deadline.
NamedObject attach_announced(int rank, int world, const KeyValueStore& store,
                             Clock::time_point deadline, std::string& name,
                             const std::vector<int>& global_of) {
  for (;;) {
    const Announcement a = Announcement::parse(store.get(kSegmentKey));
    NamedObject obj = open_named_object(a.name, world, kRemedy);  // ours and private, or throws
    if (!obj.invalid.empty())  // rank 0 completes its segment before announcing it
      throw SetupError("cannot join the segment announced through the store: " + obj.invalid);
    const std::string why = why_not_joinable(obj, a, rank, global_of);
    if (why.empty()) {
      name = a.name;
      return obj;
    }
    // The segment of a rank 0 that died before everyone attached: its name is random, so
    // nobody but the ranks it was announced to will ever remove it.
    if (obj.segment && obj.segment->header().job_key == a.job_key &&
        !process_alive(static_cast<pid_t>(a.creator_pid)))
      remove_name_of(obj.fd, a.name);
    if (Clock::now() >= deadline)
      throw SetupError(rank_text(rank, global_of) + " cannot join the segment '" + a.name +
                       "' announced through the store: " + why +
                       ". It was announced by an earlier job, or rank 0 failed; " + kRemedy + ".");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Waits until every rank has attached. Throws if the deadline passes or a rank that attached
// (or rank 0, the creator) dies first: the job cannot start then, and no launcher would say.
void await_all_attached(segment::Segment& seg, int rank, int world,
                        std::chrono::milliseconds timeout, Clock::time_point deadline,
                        const std::vector<int>& global_of) {
  auto& attached = seg.header().attached;
  auto next_check = Clock::now();
  while (attached.load(std::memory_order_acquire) < static_cast<std::uint32_t>(world)) {
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(50);
      int pid = 0;
      const int dead = dead_participant(seg, rank, pid);
      // A rank that ended once everyone had attached is the transport's business, not ours.
      const auto joined = attached.load(std::memory_order_acquire);
      if (dead != -2 && joined < static_cast<std::uint32_t>(world)) {
        if (dead >= 0) segment::record_job_failure(seg, dead, segment::EndKind::Vanished, 0);
        throw PeerFailure(rank_text(dead >= 0 ? dead : 0, global_of) + " (pid " +
                          std::to_string(pid) + ") died while the ranks attached to the job's "
                          "segment, when " + std::to_string(joined) + " of " +
                          std::to_string(world) + " ranks had attached; the job cannot start. "
                          "Start all its ranks again.");
      }
    }
    if (now >= deadline)
      throw SetupError(rank_text(rank, global_of) + ": only " +
                       std::to_string(attached.load()) + " of " + std::to_string(world) +
                       " ranks attached to the job's segment within the timeout of " +
                       std::to_string(timeout.count()) +
                       " ms; check that every rank was started with the same world size");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool g_launcher_segment_used = false;

}  // namespace

JoinedWorld join_world_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                     const KeyValueStore& store,
                                     const std::vector<int>& global_of, int machine_ranks) {
  if (world < 1 || world > segment::kMaxWorldSize || rank < 0 || rank >= world)
    throw InvalidArgument("join_through_store: rank " + std::to_string(rank) + " of " +
                          std::to_string(world) + " ranks: expected 0 <= rank < world <= " +
                          std::to_string(segment::kMaxWorldSize));
  if (!global_of.empty() && global_of.size() != static_cast<std::size_t>(world))
    throw InvalidArgument("join_through_store: " + std::to_string(global_of.size()) +
                          " global ranks for a job of " + std::to_string(world) +
                          " ranks: expected one per rank (or none)");
  if (timeout.count() <= 0)
    throw InvalidArgument("the process group timeout must be positive, got " +
                          std::to_string(timeout.count()) + " ms");
  config::Config config = config::from_environment();
  // The job's share of a machine that other jobs' ranks run on too stands in for
  // SHMDIST_LOCAL_CPUS when that is unset (the same rule as join_hosts.cpp's).
  if (!config.local_cpus) config.local_cpus = cpus::machine_share(world, machine_ranks);
  if (config.segment_fd && !g_launcher_segment_used) {
    // Started by shmrun: its segment, its supervision. The descriptor is used once; a later
    // join of this process (after destroy) goes through the store.
    g_launcher_segment_used = true;
    InitOptions options;
    options.rank = rank;
    options.world_size = world;
    options.timeout = timeout;
    return join_from_environment(options);
  }
  const auto deadline = Clock::now() + timeout;
  std::string name;
  NamedObject obj;
  if (rank == 0) {
    name = fresh_name(config.shm_tag);
    obj = create_named_object(name, world,
                              config.ring_size.value_or(segment::default_ring_size(world)));
    if (obj.fd < 0)
      throw SetupError("the fresh segment name '" + name + "' exists already; " + kRemedy);
  }
  // From here on every exit removes the name (once all attached, or on failure): it is
  // random, so nobody else would. Declared after `obj`, so it runs while obj.fd is open.
  struct RemoveNameOnExit {
    const NamedObject* obj;
    const std::string* name;
    ~RemoveNameOnExit() {
      if (obj->fd >= 0 && !name->empty()) remove_name_of(obj->fd, *name);
    }
  } guard{&obj, &name};
  if (rank == 0)
    store.set(kSegmentKey,
              Announcement{name, obj.segment->header().job_key, static_cast<long>(getpid())}
                  .text());
  else
    obj = attach_announced(rank, world, store, deadline, name, global_of);
  if (!global_of.empty()) obj.segment->name_ranks(global_of);
  JoinedWorld joined = attach_world(obj.segment, rank, timeout, config, /*supervised=*/false);
  await_all_attached(*obj.segment, rank, world, timeout, deadline, global_of);
  obj.segment->close_fd();
  return joined;
}

}  // namespace shmdist::detail
