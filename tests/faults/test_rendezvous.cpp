// The rendezvous of ranks started without shmrun (torchrun-style variables), under attack and
// under failure: a name squatted by another user (or left open to others) is refused with a
// SetupError naming the object, its owner and mode, and left untouched; a half-created
// object whose creator died does not block the job identity; a rank that dies before every
// rank has joined fails the others at once with PeerFailure naming it, and the name goes.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "launcher/shmrun_helpers.hpp"
#include "bootstrap/identity_claim.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/rendezvous_object.hpp"
#include "segment/layout.hpp"
#include "segment/segment.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

int rendezvous_port(int salt) { return 30'000 + static_cast<int>((getpid() * 13 + salt) % 20'000); }

std::string object_name(int port, int world) {
  return shmdist::detail::rendezvous_name("torch:127.0.0.1:" + std::to_string(port), world);
}

bool object_exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

CommandOptions rank_options(int rank, int world, int port) {
  CommandOptions o = clean_options(60s);
  o.env = {{"RANK", std::to_string(rank)},
           {"WORLD_SIZE", std::to_string(world)},
           {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", std::to_string(port)}};
  return o;
}

struct Ranks {
  std::vector<std::unique_ptr<LiveCommand>> procs;
  void start(int rank, int world, int port) {
    procs.push_back(std::make_unique<LiveCommand>(
        std::vector<std::string>{program("fault_rank"), "join"}, rank_options(rank, world, port)));
  }
  std::vector<CommandResult> finish() {
    std::vector<CommandResult> results;
    for (auto& p : procs) results.push_back(p->finish(60s));
    return results;
  }
};

// Plants a (non-shmdist) object under `name` with `mode`, `size` zero bytes, owned by `uid`.
void plant(const std::string& name, mode_t mode, off_t size, uid_t uid = geteuid()) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  BOOST_REQUIRE_MESSAGE(fd >= 0, "shm_open " << name << ": " << std::strerror(errno));
  BOOST_REQUIRE(ftruncate(fd, size) == 0);
  BOOST_REQUIRE(fchmod(fd, mode) == 0);
  if (uid != geteuid()) BOOST_REQUIRE(fchown(fd, uid, static_cast<gid_t>(-1)) == 0);
  close(fd);
}

// A rank that ended on an unexpected shmdist::Error (exit 3, one ERROR line): that line's fields.
std::map<std::string, std::string> error_fields(const CommandResult& r) {
  BOOST_TEST_INFO(r.out << r.err);
  BOOST_TEST(!r.timed_out);
  BOOST_TEST(r.exit_code == 3);
  const auto errors = lines_starting(r.out, "ERROR");
  BOOST_REQUIRE_MESSAGE(errors.size() == 1u, "expected one ERROR line in:\n" << r.out << r.err);
  return fields_of(errors[0]);
}

// Each rank of a 2-rank job must fail at once with a SetupError naming the object, its
// owner and mode, and the object must still be there afterwards.
void expect_refused(int port, const std::string& name, const std::string& owner,
                    const std::string& mode) {
  Ranks ranks;
  ranks.start(0, 2, port);
  ranks.start(1, 2, port);
  for (const CommandResult& r : ranks.finish()) {
    auto f = error_fields(r);
    BOOST_TEST(f["type"] == "SetupError");
    BOOST_TEST(contains(f["what"], "'/dev/shm/" + name + "' is owned by " + owner));
    BOOST_TEST(contains(f["what"], " with mode " + mode + ", but shmdist only joins objects"));
    BOOST_TEST(contains(f["what"], "It was left untouched"));
  }
  BOOST_TEST(object_exists(name));
}

std::vector<std::string> as_nobody_prefix() {
  for (const char* p : {"/usr/bin/setpriv", "/bin/setpriv"})
    if (access(p, X_OK) == 0) return {p, "--reuid=nobody", "--regid=nogroup", "--clear-groups"};
  for (const char* p : {"/usr/sbin/runuser", "/sbin/runuser"})
    if (access(p, X_OK) == 0) return {p, "-u", "nobody", "--"};
  return {};
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(rendezvous, ShmLeakCheck)

// Our own object, but open to everyone (as if made with umask 000): refused, left in place.
BOOST_AUTO_TEST_CASE(an_object_open_to_others_is_refused_and_left_in_place) {
  const int port = rendezvous_port(1);
  const std::string name = object_name(port, 2);
  plant(name, 0666, 8192);
  expect_refused(port, name, "uid " + std::to_string(geteuid()), "0666");
  shm_unlink(name.c_str());
}

// Another user squats the name (issue 11, bug 2): as user B, `umask 000; : > /dev/shm/NAME`.
BOOST_AUTO_TEST_CASE(a_name_squatted_by_another_user_is_refused_and_left_in_place) {
  if (geteuid() != 0) {
    BOOST_TEST_MESSAGE("skipped: creating an object as another user needs root (CI runs as "
                       "root); the same check runs in an_object_open_to_others_is_refused");
    return;
  }
  const auto as_nobody = as_nobody_prefix();
  if (as_nobody.empty()) {
    BOOST_TEST_MESSAGE("skipped: neither setpriv nor runuser exists to act as user nobody");
    return;
  }
  const int port = rendezvous_port(2);
  const std::string name = object_name(port, 2);
  std::vector<std::string> squat = as_nobody;
  for (const char* a : {"sh", "-c", "umask 000; : > \"$0\""}) squat.push_back(a);
  squat.push_back("/dev/shm/" + name);
  const CommandResult made = run_command(squat, clean_options(30s));
  BOOST_REQUIRE_MESSAGE(made.exit_code == 0, made.err);
  struct stat st {};
  BOOST_REQUIRE(stat(("/dev/shm/" + name).c_str(), &st) == 0);
  BOOST_REQUIRE(st.st_uid == 65534u);
  expect_refused(port, name, "uid 65534 (nobody)", "0666");
  shm_unlink(name.c_str());

  // Private to its owner but not ours (mode 0600, owned by nobody): refused as well.
  plant(name, 0600, 8192, 65534);
  expect_refused(port, name, "uid 65534 (nobody)", "0600");
  shm_unlink(name.c_str());
}

// Writes the first `bytes` of a segment header that a creator had begun to write (magic
// number first, then the layout version), as a creator killed mid-write, or one of another
// layout, leaves it.
void write_header_prefix(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  BOOST_REQUIRE(fd >= 0);
  shmdist::segment::SegmentHeader h {};
  h.magic = shmdist::segment::kMagic;
  h.layout_version = shmdist::segment::kLayoutVersion;
  BOOST_REQUIRE(pwrite(fd, &h, bytes, 0) == static_cast<ssize_t>(bytes));
  close(fd);
}

// A creator killed while sizing or writing its segment leaves an incomplete object (issue 12,
// finding 3; issue 22's second promise): an object under the name that this user created
// (O_EXCL, 0600) and whose creator died before the layout was complete is replaced by the
// next job with the same identity, whatever it holds: no bytes at all, zeros, part of a
// header (the magic number already written), or a whole header without the rest of the
// layout. Nobody holds its creation lock, so nobody is creating it.
// (Objects with a magic number used to be taken for complete, refused as "not valid" and
// left in place, so that the job identity could never start again.)
BOOST_AUTO_TEST_CASE(a_half_created_object_of_any_size_is_replaced) {
  struct Plant {
    const char* what;
    off_t size;
    std::size_t header_bytes;  // how much of a header was written (0: none)
  };
  const Plant plants[] = {
      {"an empty object", 0, 0},
      {"a zero-filled object (no magic number)", 8192, 0},
      {"the magic number of a header cut short", 16, 8},
      {"a header without the rest of the layout", sizeof(shmdist::segment::SegmentHeader),
       16},
      {"a header on a zero-filled object of the wrong size", 65536, 16},
  };
  int salt = 20;
  for (const Plant& p : plants) {
    BOOST_TEST_CONTEXT(p.what) {
      const int port = rendezvous_port(salt++);
      const std::string name = object_name(port, 2);
      plant(name, 0600, p.size);
      if (p.header_bytes) write_header_prefix(name, p.header_bytes);
      Ranks ranks;
      ranks.start(0, 2, port);
      ranks.start(1, 2, port);
      std::string err;
      for (const CommandResult& r : ranks.finish()) {
        BOOST_TEST_INFO(r.out << r.err);
        BOOST_TEST(!r.timed_out);
        BOOST_TEST(r.exit_code == 0);
        BOOST_TEST(contains(r.out, "DONE"));
        err += r.err;
      }
      BOOST_TEST(contains(err, "replacing the incomplete segment '" + name + "'"), err);
      BOOST_TEST(!object_exists(name));
      shm_unlink(name.c_str());  // in case it was refused: leave nothing behind
    }
  }
}

// A segment made by another version of shmdist (its magic number and another layout
// version) may be a live job's complete segment, whose creation lock is long released: it is
// refused at once, naming the version, and left in place; never replaced.
BOOST_AUTO_TEST_CASE(a_segment_of_another_layout_version_is_refused_not_replaced) {
  const int port = rendezvous_port(30);
  const std::string name = object_name(port, 2);
  plant(name, 0600, 65536);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  BOOST_REQUIRE(fd >= 0);
  shmdist::segment::SegmentHeader h{};
  h.magic = shmdist::segment::kMagic;
  h.layout_version = shmdist::segment::kLayoutVersion + 1;
  BOOST_REQUIRE(pwrite(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h));
  close(fd);
  Ranks ranks;
  ranks.start(0, 2, port);
  ranks.start(1, 2, port);
  for (const CommandResult& r : ranks.finish()) {
    auto f = error_fields(r);
    BOOST_TEST(f["type"] == "SetupError");
    BOOST_TEST(contains(f["what"], std::to_string(shmdist::segment::kLayoutVersion + 1)),
               f["what"]);
    BOOST_TEST(!contains(r.err, "replacing"), r.err);
  }
  BOOST_TEST(object_exists(name));
  shm_unlink(name.c_str());
}

// Issue 11, bug 4: ranks 0 and 1 of a 3-rank job have joined; one is SIGKILLed. The survivor
// gets PeerFailure naming it (no waiting out the init timeout), and the name is removed.
BOOST_AUTO_TEST_CASE(a_rank_dying_during_the_rendezvous_fails_the_others_at_once) {
  for (const int victim : {0, 1}) {  // 0 created the segment
    BOOST_TEST_CONTEXT("victim " << victim) {
      const int port = rendezvous_port(4 + victim);
      const std::string name = object_name(port, 3);
      Ranks ranks;
      ranks.start(0, 3, port);
      // Rank 0 creates the segment (the name appears before the segment is complete: wait
      // until it can be attached); then rank 1 joins it.
      shmdist::segment::NamedObject seen;  // through the one named-object path
      BOOST_REQUIRE(ranks.procs[0]->wait_until(
          [&] {
            if (!seen.segment) seen = shmdist::segment::open_named_object(name, 3, "test");
            return seen.segment && seen.segment->header().attached.load() == 1;
          },
          30s));
      ranks.start(1, 3, port);
      BOOST_REQUIRE(ranks.procs[1]->wait_until(
          [&] { return seen.segment->header().attached.load() == 2; }, 30s));
      seen = {};
      const pid_t victim_pid = ranks.procs[victim]->pid();
      ranks.procs[victim]->signal(SIGKILL);
      const CommandResult survivor = ranks.procs[1 - victim]->finish(60s);
      auto f = error_fields(survivor);
      BOOST_TEST(f["type"] == "PeerFailure");
      BOOST_TEST(contains(f["what"], "rank " + std::to_string(victim) + " (pid " +
                                         std::to_string(victim_pid) + ")"));
      BOOST_TEST(contains(f["what"], "died during the rendezvous, when 2 of 3 ranks had joined"));
      BOOST_TEST(!object_exists(name));
      ranks.procs[victim]->finish(10s);
    }
  }
}

// The torch backend's join (rank 0 creates a segment and announces it through the store):
// ranks 0 and 1 of a 3-rank job have attached, rank 2 is not there yet; one of them is
// SIGKILLed. The survivor gets PeerFailure naming it at once, not SetupError after the join
// timeout, and the name is removed. (Only the death of rank 0 used to be noticed.)
BOOST_AUTO_TEST_CASE(a_rank_dying_while_ranks_attach_through_a_store_fails_the_others_at_once) {
  for (const int victim : {0, 1}) {
    BOOST_TEST_CONTEXT("victim " << victim) {
      char dir_template[] = "/tmp/shmdist-store-XXXXXX";
      const std::string dir = mkdtemp(dir_template);
      std::vector<std::unique_ptr<LiveCommand>> ranks;
      for (int r = 0; r < 2; ++r) {
        CommandOptions o = clean_options(60s);
        o.env = {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}};
        ranks.push_back(std::make_unique<LiveCommand>(
            std::vector<std::string>{program("fault_rank"), "store_join", dir}, o));
      }
      std::string name;  // from rank 0's announcement: "<name> <job key> <pid>"
      shmdist::segment::NamedObject seen;  // through the one named-object path
      BOOST_REQUIRE(ranks[0]->wait_until(
          [&] {
            if (name.empty()) std::ifstream(dir + "/shmdist_segment") >> name;
            if (!name.empty() && !seen.segment)
              seen = shmdist::segment::open_named_object(name, 3, "test");
            return seen.segment && seen.segment->header().attached.load() == 2;
          },
          30s));
      seen = {};
      const pid_t victim_pid = ranks[victim]->pid();
      ranks[victim]->signal(SIGKILL);
      const CommandResult survivor = ranks[1 - victim]->finish(60s);
      auto f = error_fields(survivor);
      BOOST_TEST(f["type"] == "PeerFailure");
      BOOST_TEST(contains(f["what"], "rank " + std::to_string(victim) + " (pid " +
                                         std::to_string(victim_pid) + ") died while the ranks "
                                         "attached"));
      BOOST_TEST(!object_exists(name));
      ranks[victim]->finish(10s);
      shm_unlink(name.c_str());  // in case it stayed: leave nothing behind
      std::filesystem::remove_all(dir);
    }
  }
}

// Issue 12, finding 5: a slow rank of an earlier job with the same identity, removing "its"
// name after the next job has already created a fresh segment under it, must leave the fresh
// one alone. (It used to call shm_unlink on the name unconditionally.)
BOOST_AUTO_TEST_CASE(removing_a_name_never_removes_a_newer_segment) {
  namespace rv = shmdist::detail;
  const std::string name = object_name(rendezvous_port(7), 2);
  rv::NamedObject first = rv::create_named_object(name, 2, 4096);
  BOOST_REQUIRE(first.fd >= 0 && first.segment);
  BOOST_TEST(rv::create_named_object(name, 2, 4096).fd < 0);  // exclusive
  rv::remove_name_of(first.fd, name);
  BOOST_TEST(!object_exists(name));
  rv::NamedObject second = rv::create_named_object(name, 2, 4096);
  BOOST_REQUIRE(second.fd >= 0);
  rv::remove_name_of(first.fd, name);  // the slow rank of the first job
  BOOST_TEST(object_exists(name));
  BOOST_TEST(rv::still_named(second.fd, name));
  BOOST_TEST(!rv::remove_if_abandoned(second.fd, name));  // complete: not abandoned
  const rv::NamedObject found = rv::open_named_object(name, 2, "test");
  BOOST_REQUIRE(found.segment);
  BOOST_TEST(found.segment->header().job_key == second.segment->header().job_key);
  rv::remove_name_of(second.fd, name);
  BOOST_TEST(!object_exists(name));
}

// Issue 12, finding 6: every descriptor of a segment is close-on-exec (it is now from the
// moment it exists, F_DUPFD_CLOEXEC; the window of dup() + fcntl cannot be shown by a test).
BOOST_AUTO_TEST_CASE(segment_descriptors_are_close_on_exec) {
  namespace rv = shmdist::detail;
  const std::string name = object_name(rendezvous_port(8), 2);
  rv::NamedObject created = rv::create_named_object(name, 2, 4096);
  BOOST_REQUIRE(created.fd >= 0 && created.segment);
  BOOST_TEST((fcntl(created.fd, F_GETFD) & FD_CLOEXEC) != 0);
  BOOST_TEST((fcntl(created.segment->fd(), F_GETFD) & FD_CLOEXEC) != 0);
  const rv::NamedObject opened = rv::open_named_object(name, 2, "test");
  BOOST_TEST((fcntl(opened.fd, F_GETFD) & FD_CLOEXEC) != 0);
  BOOST_REQUIRE(opened.segment);
  rv::remove_name_of(created.fd, name);
}

// Issue 28: every named object goes through one path (segment/named_object.hpp, on
// Boost.Interprocess), which gives what it creates mode 0600 exactly and this user as owner,
// whatever the umask: under umask 000 it would be open to others (and every rank would refuse
// it), under 0777 unreadable to a rank that is not root. The mark a contest leaves goes
// through the same path. (The mark used to be made with the umask's mode: 0000 under 0777.)
BOOST_AUTO_TEST_CASE(named_objects_are_private_whatever_the_umask) {
  namespace rv = shmdist::detail;
  int salt = 80;
  for (const mode_t mask : {mode_t{0}, mode_t{0777}}) {
    BOOST_TEST_CONTEXT("umask " << std::oct << mask) {
      const std::string name = object_name(rendezvous_port(salt++), 2);
      const mode_t old_mask = umask(mask);
      rv::NamedObject obj = rv::create_named_object(name, 2, 4096);
      rv::mark_contested(name);
      umask(old_mask);
      BOOST_REQUIRE(obj.fd >= 0 && obj.segment);
      for (const std::string& n : {name, name + "-contested"}) {
        struct stat st {};
        BOOST_REQUIRE_MESSAGE(stat(("/dev/shm/" + n).c_str(), &st) == 0, n);
        BOOST_TEST((st.st_mode & 07777) == 0600u, n << " has mode " << std::oct << st.st_mode);
        BOOST_TEST(st.st_uid == geteuid());
      }
      BOOST_TEST(rv::contested_at(name) != 0);
      rv::remove_name_of(obj.fd, name);
      BOOST_TEST(!object_exists(name));
      shm_unlink((name + "-contested").c_str());
    }
  }
}

// Issue 27.5: jobs started with the same identity (MASTER_ADDR, MASTER_PORT, WORLD_SIZE) by
// hand or another launcher. Job A's ranks add 1 in "fault_rank sum", job B's 1000: a sum of
// 1001 would mean the jobs mixed.
namespace {

CommandOptions sum_options(int rank, int world, int port,
                           std::vector<std::pair<std::string, std::string>> extra = {}) {
  CommandOptions o = rank_options(rank, world, port);
  for (auto& e : extra) o.env.push_back(std::move(e));
  return o;
}

std::unique_ptr<LiveCommand> start_sum(int rank, int world, int port, const char* value,
                                       std::vector<std::pair<std::string, std::string>> extra = {}) {
  return std::make_unique<LiveCommand>(
      std::vector<std::string>{program("fault_rank"), "sum", value},
      sum_options(rank, world, port, std::move(extra)));
}

// A rank that failed because its identity is in use by two jobs: a SetupError (PeerFailure
// for a rank already past the rendezvous) naming the identity or saying what happened.
void expect_identity_refused(const CommandResult& r, const std::string& identity) {
  auto f = error_fields(r);
  BOOST_TEST((f["type"] == "SetupError" || f["type"] == "PeerFailure"), f["type"]);
  BOOST_TEST((contains(f["what"], "'" + identity + "'") ||
              contains(f["what"], "a second job was started with the same identity")),
             f["what"]);
  BOOST_TEST(!contains(r.err, "stale"), r.err);
}

// The sums a rank printed ("2", "2000"; "1001" if the jobs mixed).
std::string sums(const CommandResult& r) {
  const auto lines = lines_starting(r.out, "SUM");
  return lines.size() == 1 ? fields_of(lines[0])["values"] : "(" + r.out + ")";
}

}  // namespace

// A running job holds its identity: a second job started with it fails at once, every rank
// naming the identity (and rank 0 the process holding it), and the running job is left
// alone. (Job B used to create a fresh segment under the name job A had removed, and ran.)
BOOST_AUTO_TEST_CASE(a_running_job_keeps_its_identity_from_a_second_job) {
  const int port = rendezvous_port(60);
  const std::string identity = "torch:127.0.0.1:" + std::to_string(port);
  const std::string hold = std::filesystem::temp_directory_path() /
                           ("shmdist-hold-" + std::to_string(getpid()));
  std::vector<std::unique_ptr<LiveCommand>> a;
  for (int r = 0; r < 2; ++r) a.push_back(start_sum(r, 2, port, "1", {{"FAULT_RANK_HOLD", hold}}));
  for (auto& p : a)
    BOOST_REQUIRE(p->wait_until([&] { return contains(p->out(), "READY"); }, 30s));
  std::vector<CommandResult> b;
  for (int r = 0; r < 2; ++r) b.push_back(start_sum(r, 2, port, "1000")->finish(60s));
  std::ofstream(hold).put('x');
  for (auto& p : a) {
    const CommandResult r = p->finish(60s);
    BOOST_TEST_INFO(r.out << r.err);
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(sums(r) == "2");
  }
  std::filesystem::remove(hold);
  shm_unlink((object_name(port, 2) + "-contested").c_str());  // the mark a contest leaves
  for (const CommandResult& r : b) {
    BOOST_TEST(sums(r) != "2000");
    expect_identity_refused(r, identity);
  }
  BOOST_TEST(contains(b[0].out, "rank 0 cannot claim the job identity '" + identity +
                                    "' (world size 2): it is in use by process " +
                                    std::to_string(a[0]->pid())),
             b[0].out);
  BOOST_TEST(contains(b[1].out, "is already running with all 2 of its ranks"), b[1].out);
}

// A second job's rank arriving while a job still forms (2 of its 3 ranks met): as a second
// rank 0 (the claim is taken) or as a second rank 1 (its slot is taken). Either way some of
// the forming job's ranks could be the other job's, so every rank of both fails, naming the
// identity. (Only the intruder used to fail; the forming job went on and would have taken the
// other job's rank 2.)
BOOST_AUTO_TEST_CASE(a_second_job_arriving_while_a_job_forms_fails_both) {
  for (const int intruder : {0, 1}) {
    BOOST_TEST_CONTEXT("intruder rank " << intruder) {
      const int port = rendezvous_port(61 + intruder);
      const std::string name = object_name(port, 3);
      const std::string identity = "torch:127.0.0.1:" + std::to_string(port);
      std::vector<std::unique_ptr<LiveCommand>> a;
      a.push_back(start_sum(0, 3, port, "1"));
      shmdist::segment::NamedObject seen;  // through the one named-object path
      BOOST_REQUIRE(a[0]->wait_until(
          [&] {
            if (!seen.segment) seen = shmdist::segment::open_named_object(name, 3, "test");
            return seen.segment && seen.segment->header().attached.load() == 1;
          },
          30s));
      a.push_back(start_sum(1, 3, port, "1"));
      BOOST_REQUIRE(
          a[1]->wait_until([&] { return seen.segment->header().attached.load() == 2; }, 30s));
      seen = {};
      const CommandResult b = start_sum(intruder, 3, port, "1000")->finish(60s);
      expect_identity_refused(b, identity);
      for (auto& p : a) expect_identity_refused(p->finish(60s), identity);
      BOOST_TEST(!object_exists(name));
      shm_unlink((name + "-contested").c_str());  // the mark a contest leaves
    }
  }
}

// Two 2-rank jobs whose four ranks start at the same moment, 20 times. The claim decides
// which rank 0 is the job's; nothing is ever called stale (nothing crashed: "replacing the
// stale segment left by a crashed job" used to be printed), no rank waits for a rank 0 that
// lost, and every rank that fails names the identity. (Which rank 1 meets the winning rank 0
// first cannot be known by any rank: see docs/other-launchers.md.)
BOOST_AUTO_TEST_CASE(two_jobs_started_at_once_with_one_identity) {
  for (int trial = 0; trial < 20; ++trial) {
    BOOST_TEST_CONTEXT("trial " << trial) {
      const int port = rendezvous_port(100 + trial);
      const std::string name = object_name(port, 2);
      const std::string identity = "torch:127.0.0.1:" + std::to_string(port);
      const std::string go = std::filesystem::temp_directory_path() /
                             ("shmdist-go-" + std::to_string(getpid()));
      std::vector<std::unique_ptr<LiveCommand>> procs;
      for (int i = 0; i < 4; ++i)
        procs.push_back(start_sum(i / 2, 2, port, i % 2 ? "1000" : "1",
                                  {{"FAULT_RANK_START", go}}));
      std::ofstream(go).put('x');
      for (auto& p : procs) {
        const CommandResult r = p->finish(60s);
        BOOST_TEST_INFO(r.out << r.err);
        BOOST_TEST(!r.timed_out);
        BOOST_TEST(!contains(r.err, "stale"), r.err);
        if (r.exit_code == 0)
          BOOST_TEST((sums(r) == "2" || sums(r) == "2000" || sums(r) == "1001"));
        else
          expect_identity_refused(r, identity);
      }
      std::filesystem::remove(go);
      shm_unlink((name + "-contested").c_str());  // the mark a contest leaves
    }
  }
}

// Two 2-rank jobs with the same MASTER_ADDR/MASTER_PORT/WORLD_SIZE, started at the same moment,
// whose launcher gave each run its own TORCHELASTIC_RUN_ID (as torchrun does): the run id is
// part of the identity, so both jobs run, each with its own ranks, 10 times over. (Before,
// they shared the identity: one job failed, or they mixed and summed 1001.)
BOOST_AUTO_TEST_CASE(two_runs_with_their_own_run_id_never_mix) {
  for (int trial = 0; trial < 10; ++trial) {
    BOOST_TEST_CONTEXT("trial " << trial) {
      const int port = rendezvous_port(200 + trial);
      const std::string go = std::filesystem::temp_directory_path() /
                             ("shmdist-go-" + std::to_string(getpid()));
      std::vector<std::unique_ptr<LiveCommand>> procs;
      for (int i = 0; i < 4; ++i)
        procs.push_back(start_sum(i / 2, 2, port, i % 2 ? "1000" : "1",
                                  {{"FAULT_RANK_START", go},
                                   {"TORCHELASTIC_RUN_ID", i % 2 ? "run-b" : "run-a"}}));
      std::ofstream(go).put('x');
      for (int i = 0; i < 4; ++i) {
        const CommandResult r = procs[i]->finish(60s);
        BOOST_TEST_INFO(r.out << r.err);
        BOOST_TEST(r.exit_code == 0);
        BOOST_TEST(sums(r) == (i % 2 ? "2000" : "2"));
      }
      std::filesystem::remove(go);
      shm_unlink((object_name(port, 2) + "-contested").c_str());  // none is expected
    }
  }
}

// The gap of identical variables: job A's rank 0 and job B's rank 1 can finish meeting before
// A's rank 1 sees the segment (it polls every millisecond), forming a job of two jobs' ranks.
// A's rank 1 then finds "a job already running" - as it would a job that formed without any
// mix. The difference the holder can see: this rank began waiting for the identity before the
// job had all its ranks. Stand-in, made deterministic with SIGSTOP: a rank 1 (adding 1000)
// waits for its rank 0 and is stopped; ranks 0 and 1 adding 1 form a job meanwhile. Resumed,
// the waiting rank fails (naming the identity) and tells the holder, and every rank of the
// formed job fails at its next wait (PeerFailure: shared identity) instead of running on with
// numbers that may be wrong. A process that begins to join after the job formed leaves it
// alone: a_running_job_keeps_its_identity_from_a_second_job. (Before: the job ran on.)
BOOST_AUTO_TEST_CASE(a_job_that_formed_while_a_duplicate_rank_waited_is_aborted) {
  const int port = rendezvous_port(80);
  const std::string identity = "torch:127.0.0.1:" + std::to_string(port);
  const std::string tmp = std::filesystem::temp_directory_path();
  const std::string hold0 = tmp + "/shmdist-hold0-" + std::to_string(getpid());
  const std::string hold1 = tmp + "/shmdist-hold1-" + std::to_string(getpid());
  auto waiting = start_sum(1, 2, port, "1000");
  // In its rendezvous loop, it naps a millisecond at a time (before init_process_group, the
  // program does not sleep).
  auto napping = [&] {
    std::ifstream f("/proc/" + std::to_string(waiting->pid()) + "/wchan");
    std::string w;
    std::getline(f, w);
    return contains(w, "nanosleep");
  };
  BOOST_REQUIRE(waiting->wait_until(napping, 30s));
  BOOST_REQUIRE(::kill(waiting->pid(), SIGSTOP) == 0);
  std::vector<std::unique_ptr<LiveCommand>> a;
  a.push_back(start_sum(0, 2, port, "1", {{"FAULT_RANK_HOLD", hold0}}));
  a.push_back(start_sum(1, 2, port, "1", {{"FAULT_RANK_HOLD", hold1}}));
  for (auto& p : a)
    BOOST_REQUIRE(p->wait_until([&] { return contains(p->out(), "READY"); }, 30s));
  BOOST_REQUIRE(::kill(waiting->pid(), SIGCONT) == 0);
  const CommandResult late = waiting->finish(60s);
  BOOST_TEST_INFO(late.out << late.err);
  expect_identity_refused(late, identity);
  BOOST_TEST(contains(late.out, "is already running with all 2 of its ranks"), late.out);
  // Rank 0 waits in all_reduce for rank 1: its health checks read the report.
  std::ofstream(hold0).put('x');
  const CommandResult r0 = a[0]->finish(60s);
  std::ofstream(hold1).put('x');
  const CommandResult r1 = a[1]->finish(60s);
  for (const CommandResult* r : {&r0, &r1}) {
    BOOST_TEST_INFO(r->out << r->err);
    BOOST_TEST(!r->timed_out);
    BOOST_TEST(r->exit_code != 0);
    BOOST_TEST(lines_starting(r->out, "SUM").empty());
    expect_identity_refused(*r, identity);
  }
  std::filesystem::remove(hold0);
  std::filesystem::remove(hold1);
  shm_unlink((object_name(port, 2) + "-contested").c_str());  // the mark a contest leaves
}

// A process forked by rank 0 (a DataLoader worker) does not keep the job identity: once
// rank 0 destroyed its group, a new job with the same identity forms while the child still
// lives. (The child kept the claim's sockets: rank 0 found the identity "in use" and the new
// rank 1 found a job "already running".)
BOOST_AUTO_TEST_CASE(a_forked_child_does_not_keep_the_identity) {
  const int port = rendezvous_port(70);
  LiveCommand rank0({program("fault_rank"), "fork_rejoin"}, rank_options(0, 2, port));
  const CommandResult first =
      LiveCommand({program("fault_rank"), "join"}, rank_options(1, 2, port)).finish(60s);
  BOOST_TEST_INFO(first.out << first.err);
  BOOST_TEST(first.exit_code == 0);
  BOOST_REQUIRE(rank0.wait_until([&] { return contains(rank0.out(), "DESTROYED"); }, 30s));
  const CommandResult second =
      LiveCommand({program("fault_rank"), "join"}, rank_options(1, 2, port)).finish(60s);
  const CommandResult r0 = rank0.finish(60s);  // it reaps its child
  BOOST_TEST_INFO(second.out << second.err);
  BOOST_TEST(second.exit_code == 0);
  BOOST_TEST_INFO(r0.out << r0.err);
  BOOST_TEST(r0.exit_code == 0);
  BOOST_TEST(contains(r0.out, "DONE rank=0"), r0.out);
  shm_unlink((object_name(port, 2) + "-contested").c_str());  // left if it failed
  BOOST_TEST(!object_exists(object_name(port, 2)));
}

// A contest mark older than the rendezvous timeout concerns no job forming now: ranks
// whose processes started before it (long-lived processes that rendezvous later) form their
// job. (Rank 1 failed at once, "waited for its rank 0 while a second job ... was found".)
BOOST_AUTO_TEST_CASE(a_contest_older_than_the_timeout_is_ignored) {
  const int port = rendezvous_port(71);
  const std::string name = object_name(port, 2);
  const std::string go = std::filesystem::temp_directory_path() /
                         ("shmdist-go-old-mark-" + std::to_string(getpid()));
  std::vector<std::unique_ptr<LiveCommand>> procs;
  for (int r = 0; r < 2; ++r)
    procs.push_back(start_sum(r, 2, port, "1",
                              {{"FAULT_RANK_START", go}, {"FAULT_RANK_TIMEOUT_MS", "5000"}}));
  shmdist::detail::mark_contested(name);  // after both processes started
  BOOST_REQUIRE(shmdist::detail::contested_at(name) != 0);
  std::this_thread::sleep_for(6s);  // the mark is now older than the 5 s timeout
  std::ofstream(go).put('x');
  for (auto& p : procs) {
    const CommandResult r = p->finish(60s);
    BOOST_TEST_INFO(r.out << r.err);
    BOOST_TEST(r.exit_code == 0);
    BOOST_TEST(sums(r) == "2");
  }
  std::filesystem::remove(go);
  shm_unlink((name + "-contested").c_str());  // if the job did not remove it
}

// Connects to the abstract socket "@name" and closes at once: the connection stays in the
// listener's queue until it is accepted. False if refused (nobody listens, or a full queue).
static bool probe_once(const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&addr),
                          static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                                 name.size())) == 0;
  close(fd);
  return ok;
}

// Probes of the claim by later ranks (one per rank that arrives after the job started) never
// fill its listen queues for good: the holder accepts them at its health checks, so that
// later ranks still learn who holds the identity and that its job runs. (Nothing accepted
// them once the job ran: after somaxconn probes, ranks saw no holder and waited out their
// timeout with a misleading message.)
BOOST_AUTO_TEST_CASE(probes_never_fill_the_claim_for_good) {
  const int port = rendezvous_port(72);
  const std::string name = object_name(port, 2);
  const std::string identity = "torch:127.0.0.1:" + std::to_string(port);
  // Rank 0 waits 20 s in a receive that rank 1 never satisfies, then both end.
  std::vector<std::unique_ptr<LiveCommand>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::make_unique<LiveCommand>(
        std::vector<std::string>{program("fault_rank"), "timeout", "20000"},
        rank_options(r, 2, port)));
  for (auto& p : ranks)
    BOOST_REQUIRE(p->wait_until([&] { return contains(p->out(), "READY"); }, 30s));
  // Fill both queues (somaxconn connections each), as that many later ranks' probes would.
  for (const std::string& n : {name, name + ".started"})
    for (int i = 0; i < 100'000 && probe_once(n); ++i) {
    }
  BOOST_TEST(ranks[0]->wait_until(
      [&] {
        const auto h = shmdist::detail::claim_holder(name, identity);
        return h.pid == ranks[0]->pid() && h.started;
      },
      15s));
  for (auto& p : ranks) {
    const CommandResult r = p->finish(60s);
    BOOST_TEST_INFO(r.out << r.err);
    BOOST_TEST(r.exit_code == 0);
  }
}

// The rank 0 whose job starts clears an older contest mark, but never one written while it
// clears: here a writer holds the mark (as mark_contested does while it writes) when the
// clear begins, and writes a new time. (clear_contested read the mark, then unlinked it
// whatever had been written meanwhile: the new contest was lost.)
BOOST_AUTO_TEST_CASE(clearing_an_old_contest_mark_keeps_one_written_meanwhile) {
  namespace d = shmdist::detail;
  const std::string name = object_name(rendezvous_port(73), 2);
  const std::string mark = name + "-contested";
  d::mark_contested(name);
  const std::int64_t old_at = d::contested_at(name);
  BOOST_REQUIRE(old_at != 0);
  const int fd = shm_open(mark.c_str(), O_RDWR, 0);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(flock(fd, LOCK_EX) == 0);
  std::thread clearer([&] { d::clear_contested(name, old_at + 1); });
  std::this_thread::sleep_for(200ms);  // the clearer reaches the mark (and waits for it)
  const std::int64_t now = d::contest_clock_ns();
  BOOST_TEST(pwrite(fd, &now, sizeof now, 0) == static_cast<ssize_t>(sizeof now));
  close(fd);
  clearer.join();
  BOOST_TEST(d::contested_at(name) == now);
  shm_unlink(mark.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
