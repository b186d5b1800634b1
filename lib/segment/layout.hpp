// The fixed layout of a job's shared segment. Plain structs at fixed offsets, no pointers:
// every process maps the segment at its own address and reaches everything through offsets.
//
//   [SegmentHeader]                        one per job, offset 0
//   [RankControl x world]                  one per rank: doorbell, ready hints, state, blocked-on
//   [RingControl x world*(world-1)]        one per ordered pair: the consumer's published tail
//   [collective slots x world*2]           per rank and parity: a kLine header (its round
//                                          flag first, CollSlotHead), then
//                                          default_coll_slot_size(world) bytes, page aligned
//   [ring data x world*(world-1)]          ring_size bytes each, page aligned, last
//
// Size, page-rounded where marked:
//   pages(2*kLine + world*4*kLine + world*(world-1)*2*kLine)
//   + world*2*pages(kLine + coll_slot_size) + world*(world-1)*ring_size
//
// Bump kLayoutVersion whenever anything here changes meaning or size. (9: the per-rank
// CollControl lines, unused since 8, are gone; the header says where the slots start.)
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace shmdist::segment {

inline constexpr std::uint64_t kMagic = 0x5453'4944'4d48'5301ULL;  // "\x01SHMDIST" little-endian
inline constexpr std::uint32_t kLayoutVersion = 9;
// 128, not 64: adjacent-line prefetchers make pairs of 64-byte lines interfere (folly Align.h).
inline constexpr std::size_t kLine = 128;
inline constexpr std::size_t kPage = 4096;
inline constexpr int kMaxWorldSize = 1024;
inline constexpr int kReadyWords = kMaxWorldSize / 64;
inline constexpr std::size_t kMinRingSize = 4096;
inline constexpr std::size_t kMaxRingSize = std::size_t{1} << 30;

// std::atomic in shared memory is only sound when it is lock-free (no hidden process-local lock).
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

enum class JobState : std::uint32_t { Running = 0, Aborted = 1 };

// Why a job was aborted without a failed rank (SegmentHeader::abort_reason).
// SharedIdentity: a rendezvous found a second job started with the same identity (pg/
// identity_claim.hpp); some of this job's ranks may be that job's.
enum class AbortReason : std::uint32_t { None = 0, Timeout = 1, Startup = 2, SharedIdentity = 3 };

// SegmentHeader::flags
inline constexpr std::uint32_t kThreadMode = 1;  // all ranks are threads of the creator
inline constexpr std::uint32_t kStartedByLaunch = 2;  // shmdist::launch, not shmrun
// SegmentHeader::failed_rank when the job was aborted (abort_reason) before any rank failed:
// a rank that ends afterwards, because of the abort, is never recorded as its cause.
inline constexpr std::int32_t kAbortedFirst = -2;

// How a rank ended, as recorded by the launcher (or by the rank itself).
enum class EndKind : std::uint32_t {
  None = 0,        // still running, or not known
  Exited = 1,      // code = exit status
  Signaled = 2,    // code = signal number
  Vanished = 3,    // detected gone by a peer (no launcher to ask); code unused
  Threw = 4,       // thread-mode rank whose function threw
  Finalized = 5,   // finalized (or exited cleanly) while a peer still needed it: the root
                   // cause of a failure (segment::record_job_failure)
};

struct SegmentHeader {
  // Written once by the creator before anyone attaches, then read-only.
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t header_size;  // sizeof(SegmentHeader)
  std::uint32_t world_size;
  std::uint32_t line_size;    // kLine
  std::uint64_t ring_size;    // data bytes per ring (power of two)
  std::uint64_t total_size;   // bytes of the whole segment
  std::uint64_t rank_control_offset;
  std::uint64_t ring_control_offset;
  std::uint64_t ring_data_offset;
  std::uint64_t job_key;      // random per job: tells a stale segment from this job's
  std::int32_t creator_pid;
  std::uint32_t flags;        // kThreadMode, ...
  std::uint64_t coll_slot_offset;     // the collective area: its slots, page aligned
  std::uint64_t coll_slot_size;       // data bytes per collective slot
  char reserved1[kLine - 104];

  // Job-wide state, changed at runtime (own line).
  alignas(kLine) std::atomic<std::uint32_t> job_state;  // JobState
  std::atomic<std::int32_t> failed_rank;  // first rank known to have failed, -1, or kAbortedFirst
  std::atomic<std::uint32_t> failed_kind;               // EndKind
  std::atomic<std::int32_t> failed_code;
  std::atomic<std::uint32_t> attached;                  // ranks that attached so far
  std::atomic<std::uint32_t> sleeping;                  // ranks armed to sleep right now
  std::atomic<std::uint32_t> abort_reason;              // AbortReason, when no rank failed
  char reserved2[kLine - 28];
};
static_assert(sizeof(SegmentHeader) == 2 * kLine);
static_assert(alignof(SegmentHeader) == kLine);

enum class RankState : std::uint32_t {
  Empty = 0,      // nobody attached yet
  Running = 1,    // attached and working
  Finalized = 2,  // called destroy_process_group: sends nothing more
  Ended = 3,      // its process or thread ended without finalizing; see end_kind/end_code
};

// BlockedOn::op: the blocking call a rank is in. New codes go at the end (the numbers are
// shared between a rank and its launcher; changing one needs a kLayoutVersion bump).
enum BlockedOp : std::uint32_t {
  kNotBlocked = 0,
  kBlockedSend = 1,
  kBlockedRecv = 2,
  kBlockedWait = 3,
  kBlockedBarrier = 4,
  kBlockedDestroy = 5,
  kBlockedCollective = 6,
};

// The name of the call a BlockedOp code stands for, as hang reports and errors print it.
constexpr const char* blocked_op_name(std::uint32_t op) {
  switch (op) {
    case kBlockedSend: return "send";
    case kBlockedRecv: return "recv";
    case kBlockedWait: return "Work::wait";
    case kBlockedBarrier: return "barrier";
    case kBlockedDestroy: return "destroy_process_group";
    case kBlockedCollective: return "collective";
    default: return "-";
  }
}

// What a rank is blocked on, for hang reports.
struct BlockedOn {
  std::atomic<std::uint32_t> version;  // odd while being written (seqlock)
  std::atomic<std::uint32_t> op;       // BlockedOp, kNotBlocked = 0
  std::atomic<std::int32_t> peer;      // global rank, -1 = any source
  std::atomic<std::uint32_t> group;    // group id
  std::atomic<std::int32_t> tag;
  std::atomic<std::uint32_t> pending_ops;  // operations of this rank still pending
  std::atomic<std::uint64_t> bytes;
  std::atomic<std::int64_t> since_ns;  // CLOCK_REALTIME nanoseconds when the wait began
};

struct RankControl {
  // Line 0: the doorbell. Peers bump `seq` and FUTEX_WAKE it when `armed` is set.
  alignas(kLine) std::atomic<std::uint32_t> doorbell_seq;
  std::atomic<std::uint32_t> armed;
  std::atomic<std::uint32_t> heavy_fences;  // 1: the owner arms with membarrier (wait/fence.hpp)
  char pad0[kLine - 12];
  // Line 1: ready hints, bit s of word s/64 = "ring from rank s may hold records".
  alignas(kLine) std::atomic<std::uint64_t> ready[kReadyWords];
  // Line 2: identity and state.
  alignas(kLine) std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> state;  // RankState
  std::atomic<std::uint32_t> end_kind;  // EndKind
  std::atomic<std::int32_t> end_code;
  // 1 + the rank whose end (finalized, exited) made this rank raise PeerFailure, 0: none.
  // Written once by the rank itself (segment::record_failure_cause); a later failure of this
  // rank (other than a signal) is then blamed on, or described with, that root cause
  // (segment::record_job_failure, describe_job_failure).
  std::atomic<std::int32_t> failed_because;
  char pad2[kLine - 20];
  // Line 3: what the rank waits for (written only on the slow path, read by the launcher).
  alignas(kLine) BlockedOn blocked;
};
static_assert(sizeof(RankControl) == 4 * kLine);
static_assert(sizeof(BlockedOn) <= kLine);

struct RingControl {
  // Written by the consumer only: bytes consumed so far (64-bit, never wraps in practice).
  alignas(kLine) std::atomic<std::uint64_t> tail;
  // Written by the producer only: bytes published so far. Diagnostics (ring fill level) only:
  // the consumer finds records through their stamps, never through this.
  alignas(kLine) std::atomic<std::uint64_t> head_hint;
  // The single-copy offer of this ring's producer (transport/single_copy.hpp): the offer's id
  // and state in one word, moved by both sides (the producer posts and revokes, the consumer
  // claims and completes). Touched once or twice per large message, so it shares the line.
  std::atomic<std::uint64_t> offer_state;
};
static_assert(sizeof(RingControl) == 2 * kLine);

// A collective slot starts with one line of header, then data. The header's first word is
// the slot's round flag: the last round whose contents (header and data) its owner has
// written there (only the owner stores it, with release, and it only increases: rounds of
// one parity). The rest of the header belongs to the collectives layer (the call's
// fingerprint, then a small payload inline, so that a small round is one line to write and
// one line to read).
struct CollSlotHead {
  std::atomic<std::uint64_t> round;
};
static_assert(sizeof(CollSlotHead) == 8 && std::atomic<std::uint64_t>::is_always_lock_free);
inline constexpr std::size_t kCollSlotHeader = kLine;

// Data bytes per collective slot: two slots per rank (rounds alternate between them).
inline constexpr std::uint64_t default_coll_slot_size(std::uint32_t world_size) {
  return world_size <= 8 ? 256 * 1024 : world_size <= 16 ? 128 * 1024
         : world_size <= 64 ? 64 * 1024 : 32 * 1024;
}

inline constexpr std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Offsets and sizes of everything in a segment for a given world and ring size.
struct Geometry {
  std::uint32_t world_size = 0;
  std::uint64_t ring_size = 0;
  std::uint64_t rank_control_offset = 0;
  std::uint64_t ring_control_offset = 0;
  std::uint64_t ring_data_offset = 0;
  std::uint64_t coll_slot_offset = 0;
  std::uint64_t coll_slot_size = 0;    // data bytes per slot
  std::uint64_t coll_slot_stride = 0;  // kCollSlotHeader + data, page aligned
  std::uint64_t total_size = 0;

  static Geometry compute(std::uint32_t world_size, std::uint64_t ring_size) {
    Geometry g;
    g.world_size = world_size;
    g.ring_size = ring_size;
    const std::uint64_t rings = std::uint64_t{world_size} * (world_size - 1);
    g.rank_control_offset = sizeof(SegmentHeader);
    g.ring_control_offset = g.rank_control_offset + std::uint64_t{world_size} * sizeof(RankControl);
    // The collective area sits before the ring data, so that the last ring ends the segment
    // (a guard page follows every mapping: a read past the last ring faults).
    g.coll_slot_offset = align_up(g.ring_control_offset + rings * sizeof(RingControl), kPage);
    g.coll_slot_size = default_coll_slot_size(world_size);
    g.coll_slot_stride = align_up(kCollSlotHeader + g.coll_slot_size, kPage);
    g.ring_data_offset = g.coll_slot_offset + std::uint64_t{world_size} * 2 * g.coll_slot_stride;
    g.total_size = g.ring_data_offset + rings * ring_size;
    return g;
  }
  // Slot `parity` (0 or 1) of `rank`, from the segment's base.
  std::uint64_t coll_slot(int rank, int parity) const {
    return coll_slot_offset + (std::uint64_t(rank) * 2 + std::uint64_t(parity)) * coll_slot_stride;
  }
  // Index of the ring carrying messages from `src` to `dst` (src != dst).
  std::uint64_t ring_index(int src, int dst) const {
    return std::uint64_t(src) * (world_size - 1) + std::uint64_t(dst < src ? dst : dst - 1);
  }
};

}  // namespace shmdist::segment
