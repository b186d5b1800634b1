// Fingerprints: encoding, descriptions and the verdict every member computes alike.

#include "coll/fingerprint.hpp"

#include <cstring>
#include <functional>

#include <shmdist/distributed.hpp>

#include "coll/reduce.hpp"
#include "tensor/dtype_check.hpp"

namespace shmdist::coll {
namespace {

std::string rank_text(int group_rank, std::span<const int> members) {
  std::string s = "group rank " + std::to_string(group_rank);
  if (group_rank >= 0 && group_rank < static_cast<int>(members.size()))
    s += " (global rank " + std::to_string(members[group_rank]) + ")";
  return s;
}

bool same_call(const Fingerprint& a, const Fingerprint& b) {
  return a.magic == b.magic && a.kind == b.kind && a.op == b.op && a.dtype == b.dtype &&
         a.root == b.root && a.group_size == b.group_size && a.seq == b.seq && a.count == b.count;
}

}  // namespace

void encode(const CallDescription& call, int n, std::byte* wire) {
  std::memcpy(wire, &call.fp, sizeof(Fingerprint));
  std::byte* counts = wire + sizeof(Fingerprint);
  std::memset(counts, 0, 16 * std::size_t(n));
  for (int j = 0; j < n && j < static_cast<int>(call.send_counts.size()); ++j)
    std::memcpy(counts + 8 * j, &call.send_counts[j], 8);
  for (int j = 0; j < n && j < static_cast<int>(call.recv_counts.size()); ++j)
    std::memcpy(counts + 8 * (n + j), &call.recv_counts[j], 8);
}

CallDescription decode(const std::byte* wire, int n) {
  CallDescription call;
  std::memcpy(&call.fp, wire, sizeof(Fingerprint));
  if (has_splits(static_cast<Kind>(call.fp.kind))) {
    call.send_counts.resize(n);
    call.recv_counts.resize(n);
    const std::byte* counts = wire + sizeof(Fingerprint);
    for (int j = 0; j < n; ++j) {
      std::memcpy(&call.send_counts[j], counts + 8 * j, 8);
      std::memcpy(&call.recv_counts[j], counts + 8 * (n + j), 8);
    }
  }
  return call;
}

std::string describe_call(const CallDescription& call, std::span<const int> members) {
  const Fingerprint& fp = call.fp;
  if (fp.magic != kFingerprintMagic) return "something that is not a shmdist collective";
  const KindInfo* row = find_kind(fp.kind);
  if (!row) return "collective code " + std::to_string(fp.kind) + " (unknown to this build)";
  std::string s = std::string(row->name) + "(";
  if (fp.rejected) return s + "invalid arguments)";
  if (row->op) s += std::string("op=") + reduce_op_name(static_cast<ReduceOp>(fp.op)) + ", ";
  if (row->root) {
    s += std::string(row->root) + "=";
    s += fp.root >= 0 && fp.root < static_cast<int>(members.size())
             ? std::to_string(members[fp.root])
             : std::to_string(fp.root);
    s += ", ";
  }
  if (row->data) {
    s += fp.dtype < kNumDTypes ? std::string(dtype_name(static_cast<DType>(fp.dtype)))
                               : "dtype code " + std::to_string(fp.dtype) + " (unknown to this build)";
    if (!row->splits) s += ", " + std::to_string(fp.count) + " elements";
  }
  if (!s.empty() && s.back() == ' ') s.resize(s.size() - 2);
  return s + ")";
}

std::optional<std::string> verdict(std::span<const CallDescription> calls, int me,
                                   std::span<const int> members,
                                   const std::function<std::string()>& what) {
  const int n = static_cast<int>(calls.size());
  static constexpr const char* tail =
      ". Every member must call the same collectives in the same order, with the same op, "
      "dtype, element counts and root; this call did nothing on any member";
  // A code past this build's tables is another version's call, not a different call of ours:
  // said as such, before any comparison would call it a disagreement.
  for (int r = 0; r < n; ++r) {
    const Fingerprint& fp = calls[r].fp;
    if (fp.magic != kFingerprintMagic || r == me) continue;
    const int rank = r < static_cast<int>(members.size()) ? members[r] : r;
    const KindInfo* row = find_kind(fp.kind);
    if (!row)
      return what() + ": peer rank " + std::to_string(rank) + " sent collective code " +
             std::to_string(fp.kind) + " which this build does not know: it was built with a "
             "newer shmdist; rebuild every rank from the same version";
    if (row->data && !fp.rejected && fp.dtype >= kNumDTypes)
      return what() + ": " + detail::unknown_dtype_text(rank, fp.dtype);
  }
  for (int r = 0; r < n; ++r) {
    if (!calls[r].fp.rejected) continue;
    if (r == me) return std::nullopt;  // this member throws its own error
    return what() + ": " + rank_text(r, members) + " rejected its arguments (its own "
           "InvalidArgument says why), so no member took part; fix the call there";
  }
  for (int r = 1; r < n; ++r) {
    if (same_call(calls[r].fp, calls[0].fp)) continue;
    return what() + ": the members' calls disagree: " + rank_text(r, members) + " called " +
           describe_call(calls[r], members) + " but " + rank_text(0, members) + " called " +
           describe_call(calls[0], members) + tail;
  }
  if (n > 0 && has_splits(static_cast<Kind>(calls[0].fp.kind))) {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const std::int64_t sends = calls[i].send_counts[j];
        const std::int64_t expects = calls[j].recv_counts[i];
        if (sends == expects) continue;
        return what() + ": the members' splits disagree: " + rank_text(i, members) +
               " sends " + std::to_string(sends) + " elements to " + rank_text(j, members) +
               ", which expects " + std::to_string(expects) + " from it" + tail;
      }
  }
  return std::nullopt;
}

std::optional<std::string> verdict(std::span<const CallDescription> calls, int me,
                                   const std::vector<int>& members, const std::string& what) {
  return verdict(calls, me, std::span<const int>(members), [&] { return what; });
}

}  // namespace shmdist::coll
