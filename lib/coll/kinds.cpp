// The collectives' table: look-ups by name, and the names for error messages.

#include "coll/kinds.hpp"

namespace shmdist::coll {

const char* kind_name(Kind kind) {
  const KindInfo* k = find_kind(static_cast<std::uint8_t>(kind));
  return k ? k->name : "an unknown collective";
}

std::optional<Kind> kind_from_name(std::string_view name) {
  for (const KindInfo& k : kKinds)
    if (name == k.name) return k.kind;
  return std::nullopt;
}

std::string kind_names(bool data_only) {
  std::string list;
  for (const KindInfo& k : kKinds)
    if (k.data || !data_only) list += (list.empty() ? "" : ", ") + std::string(k.name);
  return list;
}

}  // namespace shmdist::coll
