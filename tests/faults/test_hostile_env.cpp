// Bad launch environments give a clear SetupError naming the variable (never a crash), with
// and without shmrun; an inherited "segment" descriptor that is no segment, or another job's,
// is refused; and a segment created with mode 0600 cannot be opened by another user.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>

#include "launcher/shmrun_helpers.hpp"
#include "segment/named_object.hpp"
#include "segment/segment.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// Runs `fault_rank join` directly with `env` (and nothing else of a launch environment) and
// expects it to fail cleanly: exit 3 with one ERROR line of the given type and words.
void expect_clean_error(const Env& env, const std::string& type, const std::string& words) {
  std::string shown;
  for (const auto& [k, v] : env) shown += k + "=" + v + " ";
  BOOST_TEST_CONTEXT(shown) {
    CommandOptions o = clean_options(30s);
    o.env = env;
    const CommandResult r = run_command({program("fault_rank"), "join"}, o);
    BOOST_TEST(r.exit_code == 3, "exit " << r.exit_code << "\n" << r.out << r.err);
    const auto errors = lines_starting(r.out, "ERROR");
    BOOST_REQUIRE(errors.size() == 1u);
    auto f = fields_of(errors[0]);
    BOOST_TEST(f["type"] == type);
    BOOST_TEST(contains(f["what"], words), f["what"]);
  }
}

int unique_port() { return 40'000 + static_cast<int>(getpid() % 20'000); }

}  // namespace

BOOST_FIXTURE_TEST_SUITE(hostile_environment, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(malformed_or_out_of_range_variables) {
  const std::string port = std::to_string(unique_port());
  auto with = [&](Env extra) {
    Env env = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}};
    for (auto& kv : extra) {
      std::erase_if(env, [&](const auto& e) { return e.first == kv.first; });
      env.push_back(kv);
    }
    return env;
  };
  expect_clean_error(with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "SetupError",
                     "RANK='-1' is out of range: expected an integer from 0 to 1");
  expect_clean_error(with({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}), "SetupError",
                     "RANK='abc' is not an integer");
  expect_clean_error(with({{"RANK", ""}, {"WORLD_SIZE", "2"}}), "SetupError",
                     "RANK='' is not an integer");
  expect_clean_error(with({{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "SetupError",
                     "RANK='2' is out of range");
  expect_clean_error(with({{"RANK", "99999999999999999999"}, {"WORLD_SIZE", "2"}}), "SetupError",
                     "RANK='99999999999999999999' is not an integer");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "SetupError",
                     "WORLD_SIZE='0' is out of range: expected an integer from 1 to 1024");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1025"}}), "SetupError",
                     "WORLD_SIZE='1025' is out of range");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}), "SetupError",
                     "WORLD_SIZE='2x' is not an integer");
  expect_clean_error({{"RANK", "0"}}, "SetupError", "WORLD_SIZE is not set");
  expect_clean_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, "SetupError",
                     "but MASTER_ADDR/MASTER_PORT are not: ");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "99999"}}),
                     "SetupError", "MASTER_PORT='99999' is out of range");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}),
                     "SetupError", "MASTER_PORT='http' is not an integer");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHMDIST_RING_SIZE", "5"}}),
                     "SetupError", "SHMDIST_RING_SIZE = 5 bytes: expected a power of two");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHMDIST_RING_SIZE", "lots"}}),
                     "SetupError", "SHMDIST_RING_SIZE = 'lots' is not a byte size");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHMDIST_SPIN_US", "x"}}),
                     "SetupError", "SHMDIST_SPIN_US='x' is not an integer");
  expect_clean_error(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SHMDIST_SPIN_US", "-5"}}),
                     "SetupError", "SHMDIST_SPIN_US='-5' is out of range");
  expect_clean_error({}, "SetupError", "this process was not started by a launcher");
}

BOOST_AUTO_TEST_CASE(segment_descriptors_that_are_no_segment) {
  const Env job = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  auto with_fd = [&](const std::string& fd) {
    Env env = job;
    env.push_back({"SHMDIST_SEGMENT_FD", fd});
    return env;
  };
  expect_clean_error(with_fd("999"), "SetupError", "cannot stat the shared segment");
  expect_clean_error(with_fd("abc"), "SetupError", "SHMDIST_SEGMENT_FD='abc' is not an integer");
  expect_clean_error(with_fd("-1"), "SetupError", "SHMDIST_SEGMENT_FD='-1' is out of range");
  expect_clean_error(with_fd(""), "SetupError", "SHMDIST_SEGMENT_FD='' is not an integer");

  // Inheritable descriptors (no close-on-exec) the child gets under the same numbers.
  const int devnull = open("/dev/null", O_RDONLY);
  BOOST_REQUIRE(devnull >= 0);
  expect_clean_error(with_fd(std::to_string(devnull)), "SetupError", "only 0 bytes");
  close(devnull);

  const auto real = shmdist::segment::Segment::create_anonymous(2, 4096);
  const std::size_t size = real.geometry().total_size;
  // A copy of a real segment in a memfd, changed through a mapping (page aligned, as the
  // header's alignment requires).
  auto memfd_copy = [&](auto mutate) {
    const int fd = memfd_create("shmdist-crafted", 0);
    BOOST_REQUIRE(fd >= 0);
    BOOST_REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
    void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    BOOST_REQUIRE(map != MAP_FAILED);
    std::memcpy(map, &real.header(), size);
    mutate(*static_cast<shmdist::segment::SegmentHeader*>(map));
    munmap(map, size);
    return fd;
  };
  {
    const int fd = memfd_copy([](auto& h) { h.magic = 0x1234; });
    expect_clean_error(with_fd(std::to_string(fd)), "SetupError", "wrong magic number");
    close(fd);
  }
  {
    const int fd = memfd_copy([](auto& h) { h.layout_version = 99; });
    expect_clean_error(with_fd(std::to_string(fd)), "SetupError", "layout version 99, expected " +
                           std::to_string(shmdist::segment::kLayoutVersion));
    close(fd);
  }
  {
    const int fd = memfd_copy([](auto&) {});
    Env env = {{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"SHMDIST_SEGMENT_FD", std::to_string(fd)}};
    expect_clean_error(env, "SetupError", "it was made for 2 ranks but WORLD_SIZE is 3");
    env = with_fd(std::to_string(fd));
    env.push_back({"SHMDIST_JOB_KEY", "0000000000000000"});
    expect_clean_error(env, "SetupError", "belongs to another job");
    close(fd);
  }
}

// A bad SHMDIST_* variable: a rank started without shmrun fails cleanly with SetupError
// naming it; under shmrun, shmrun refuses it once before starting any rank (issue 27, item 9;
// every rank used to fail at its join).
BOOST_AUTO_TEST_CASE(bad_variables_fail_a_rank_cleanly_and_shmrun_refuses_them) {
  CommandOptions o = clean_options();
  o.env = {{"SHMDIST_SPIN_US", "fast"}, {"RANK", "0"}, {"WORLD_SIZE", "1"},
           {"MASTER_ADDR", "127.0.0.1"},
           {"MASTER_PORT", std::to_string(30'000 + getpid() % 20'000)}};
  const CommandResult rank = run_command({program("fault_rank"), "join"}, o);
  BOOST_TEST(rank.exit_code == 3, rank.err);
  BOOST_TEST(lines_starting(rank.out, "ERROR").size() == 1u, rank.out);
  for (const auto& line : lines_starting(rank.out, "ERROR"))
    BOOST_TEST(contains(line, "type=SetupError what=environment variable SHMDIST_SPIN_US='fast'"));

  o.env = {{"SHMDIST_SPIN_US", "fast"}};
  const CommandResult r = run_command(shmrun({"-n", "2", program("fault_rank"), "join"}), o);
  BOOST_TEST(r.exit_code == 1, r.err);
  BOOST_TEST(r.out.empty(), "a rank ran: " << r.out);
  BOOST_TEST(r.err.rfind("shmrun: environment variable SHMDIST_SPIN_US='fast'", 0) == 0u, r.err);
}

// Mode 0600: another user cannot open the segment. Needs root (to create it as one user and
// try as another) and setpriv or runuser.
BOOST_AUTO_TEST_CASE(another_user_cannot_attach) {
  if (geteuid() != 0) {
    BOOST_TEST_MESSAGE("skipped: the permission test needs root");
    return;
  }
  std::vector<std::string> as_nobody;
  for (const char* p : {"/usr/bin/setpriv", "/bin/setpriv"})
    if (as_nobody.empty() && access(p, X_OK) == 0)
      as_nobody = {p, "--reuid=nobody", "--regid=nogroup", "--clear-groups"};
  for (const char* p : {"/usr/sbin/runuser", "/sbin/runuser"})
    if (as_nobody.empty() && access(p, X_OK) == 0) as_nobody = {p, "-u", "nobody", "--"};
  if (as_nobody.empty()) {
    BOOST_TEST_MESSAGE("skipped: neither setpriv nor runuser exists");
    return;
  }
  // A copy of the program where 'nobody' can run it (the build tree may be private).
  char dir_template[] = "/tmp/shmdist-perm-XXXXXX";
  const fs::path dir = mkdtemp(dir_template);
  fs::permissions(dir, fs::perms(0755));
  const fs::path copy = dir / "attach_named";
  fs::copy_file(program("attach_named"), copy);
  fs::permissions(copy, fs::perms(0755));

  // Through the one named-object path, as the rendezvous makes its segments.
  const std::string name = shmdist::segment::shm_object_name(
      own_shm_tag(), "perm-" + std::to_string(getpid()));
  const shmdist::segment::NamedObject seg = shmdist::segment::create_named_object(name, 2, 4096);
  BOOST_REQUIRE(seg.segment);
  struct stat st {};
  BOOST_REQUIRE(stat(("/dev/shm/" + name).c_str(), &st) == 0);
  BOOST_TEST((st.st_mode & 0777) == 0600u);
  BOOST_TEST(st.st_uid == 0u);

  const CommandResult owner = run_command({copy.string(), name}, clean_options());
  BOOST_TEST(owner.exit_code == 0, owner.out << owner.err);
  BOOST_TEST(contains(owner.out, "ATTACHED world=2"), owner.out);

  std::vector<std::string> argv = as_nobody;
  argv.push_back(copy.string());
  argv.push_back(name);
  const CommandResult other = run_command(argv, clean_options());
  BOOST_TEST_INFO(other.out << other.err);
  BOOST_TEST(contains(other.out, "WHO uid=65534"));
  BOOST_TEST(other.exit_code == 3);
  // It cannot open the object (mode 0600, root's); the error says whose it is.
  BOOST_TEST(contains(other.out, "ERROR type=SetupError what=the shared-memory object '/dev/shm/" +
                                     name + "' is owned by uid 0"));
  BOOST_TEST(contains(other.out, "with mode 0600"));
  BOOST_TEST(contains(other.out, "It was left untouched"));
  BOOST_TEST(stat(("/dev/shm/" + name).c_str(), &st) == 0);
  shmdist::segment::remove_name_of(seg.fd, name);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
