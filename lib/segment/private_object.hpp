// The ownership check for every shared-memory object a job opens by a predictable name
// (rendezvous segments today; any store-based rendezvous tomorrow). Such a name can be
// created first by another local user ("squatting"): joining it would hand that user our
// messages, or let it block or corrupt the job. So an object opened by name is used only if
// this process's effective uid owns it and neither group nor others may read or write it.
#pragma once

#include <sys/stat.h>

#include <string>

namespace shmdist::segment {

// Throws SetupError unless the object behind `fd` is owned by the effective uid and has no
// read/write permission for group or others. `name` is how the error names the object (for
// example "/dev/shm/shmdist-1000-rv-..."); `remedy` says what the user should do, for
// example "give each job its own MASTER_PORT". Never removes or changes the object: a
// squatter's object is reported, not touched (its owner or root removes it).
void require_private_object(int fd, const std::string& name, const std::string& remedy);
// The same check on a stat result (for an object this process could not even open).
void require_private_object(const struct stat& st, const std::string& name,
                            const std::string& remedy);

}  // namespace shmdist::segment
