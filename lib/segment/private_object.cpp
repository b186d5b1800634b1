#include "segment/private_object.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::segment {
namespace {

std::string user_name(uid_t uid) {
  std::string s = "uid " + std::to_string(uid);
  char buf[1024];
  passwd pw {};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr)
    s += " (" + std::string(found->pw_name) + ")";
  return s;
}

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

void require_private_object(int fd, const std::string& name, const std::string& remedy) {
  struct stat st {};
  if (fstat(fd, &st) != 0)
    throw SetupError("cannot check who owns the shared-memory object '" + name +
                     "': fstat failed: " + std::strerror(errno));
  require_private_object(st, name, remedy);
}

void require_private_object(const struct stat& st, const std::string& name,
                            const std::string& remedy) {
  const uid_t me = geteuid();
  const bool foreign_owner = st.st_uid != me;
  const bool shared = (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) != 0;
  if (!foreign_owner && !shared) return;
  std::string what = "the shared-memory object '" + name + "' is owned by " +
                     user_name(st.st_uid) + " with mode " + octal_mode(st.st_mode) +
                     ", but shmdist only joins objects owned by this process's user (" +
                     user_name(me) + ") that group and others can neither read nor write (mode "
                     "0600). ";
  what += foreign_owner
              ? "Another user may have created it to read, disturb or block this job. "
              : "Its mode lets other users read or write this job's memory. ";
  what += "It was left untouched: have its owner (or root) remove it, or " + remedy + ".";
  throw SetupError(what);
}

}  // namespace shmdist::segment
