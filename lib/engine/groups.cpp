// Agreement on groups. new_group numbers groups in creation order on every rank (torch
// semantics: every rank calls it for every group, in the same order, members or not), and
// each message carries its group's number and member signature. A message whose number
// names, on the receiving rank, a group with other members, or one that does not contain
// its sender, proves that the two ranks disagree on the sequence: the first such message is
// reported (InvalidArgument naming the sender) to every pending and later operation on a
// group, rather than leaving the receiver to wait for a match that cannot come.
#include <algorithm>

#include <shmdist/errors.hpp>

#include "engine/engine.hpp"
#include "engine/group_name.hpp"

namespace shmdist::engine {
namespace {

std::string members_text(const std::vector<int>& members) {
  std::string s = "{";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i) s.append(", ");
    s.append(std::to_string(members[i]));
  }
  s.append("}");
  return s;
}

bool contains(const std::vector<int>& sorted, int rank) {
  return std::binary_search(sorted.begin(), sorted.end(), rank);
}

}  // namespace

std::string Engine::group_text(std::uint32_t id) const {
  std::string s = group_name(id);
  if (id != 0 && id <= groups_.size()) {
    s.push_back(' ');
    s.append(members_text(groups_[id - 1].members));
  }
  return s;
}

std::string Engine::group_text_for(std::uint32_t id, std::uint32_t sig) const {
  if (id == 0 || (id <= groups_.size() && groups_[id - 1].sig == sig)) return group_text(id);
  std::string s = group_name(id);
  if (id > groups_.size()) return s.append(" (which this rank never created)");
  return s.append(" (not this rank's group #").append(std::to_string(id)).append(")");
}

void Engine::register_group(std::uint32_t id, std::uint32_t sig, std::vector<int> members) {
  if (id != groups_.size() + 1)
    throw Error("internal error: group #" + std::to_string(id) + " registered after " +
                std::to_string(groups_.size()) + " groups");
  groups_.push_back({sig, std::move(members)});
  // Messages on this group that arrived before this rank created it.
  for (const Unexpected& u : unexpected_)
    if (u.env.key.group_id == id) check_group(u.env);
}

void Engine::check_group(const transport::Envelope& env) {
  const std::uint32_t id = env.key.group_id;
  if (id > groups_.size()) return;  // not created here yet: checked by register_group
  const GroupRecord& mine = groups_[id - 1];
  const bool sender_inside = contains(mine.members, env.src);
  if (mine.sig == env.key.group_sig && sender_inside) return;
  if (!group_disagreement_.empty()) return;  // the first one is reported
  const std::string src = std::to_string(env.src);
  std::string what = "rank " + src + " disagrees with rank " + std::to_string(rank_) +
                     " about the groups: a message from rank " + src + " arrived on its group #" +
                     std::to_string(id) + ", but group #" + std::to_string(id) + " of rank " +
                     std::to_string(rank_) + " is " + members_text(mine.members);
  what += sender_inside ? " (other members than rank " + src + "'s)"
                        : ", which does not contain rank " + src;
  for (std::size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].sig == env.key.group_sig && i + 1 != id)
      what += "; rank " + src + "'s group #" + std::to_string(id) + " has the members of group #" +
              std::to_string(i + 1) + " " + members_text(groups_[i].members) + " here";
  what += ". The two ranks created their groups in different orders, or one of them skipped "
          "or added a new_group call: every rank must call new_group for every group, in the "
          "same order, members or not";
  group_disagreement_ = what;
  // Receives waiting on a group may be waiting for exactly this message: fail them now.
  const auto error = std::make_exception_ptr(InvalidArgument(what));
  for (auto it = posted_.begin(); it != posted_.end();) {
    Operation& op = *it;
    if (op.key.group_id == 0) {
      ++it;
      continue;
    }
    it = posted_.erase(it);
    fail_operation(op, error);
  }
}

}  // namespace shmdist::engine
