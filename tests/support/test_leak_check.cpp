// The leak check itself (support/shm_check.hpp, issue 27 item 15): it reports every name a
// test's own job leaves in /dev/shm, of each kind shmdist makes (a rendezvous of ranks started
// without shmrun, a segment announced through a key-value store), and none that another
// program makes meanwhile: another shmdist job without a tag, or with another test's tag.
// (It compared all of /dev/shm, so another program's object failed whichever test was
// running.) The leaks are made as a crash makes them: rank 0 of a 2-rank job creates the
// job's object, waits for rank 1, which never comes, and is killed.
#define BOOST_TEST_MODULE leak_check
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "launcher/shmrun_helpers.hpp"
#include "bootstrap/rendezvous.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

bool object_exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

int free_port(int salt) { return 30'000 + static_cast<int>((getpid() * 17 + salt) % 20'000); }

// Runs `argv` as rank 0 of a 2-rank job (torchrun-style variables, MASTER_PORT `port`) and
// kills it once `appeared()` returns a name (bounded: 60 s). Returns that name, "" if none.
std::string leave_behind(const std::vector<std::string>& argv, int port, CommandOptions o,
                         const std::function<std::string()>& appeared) {
  o.timeout = 90s;
  o.env.insert(o.env.end(), {{"RANK", "0"},
                             {"WORLD_SIZE", "2"},
                             {"MASTER_ADDR", "127.0.0.1"},
                             {"MASTER_PORT", std::to_string(port)}});
  std::string name;
  o.on_start = [&](pid_t pid) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while ((name = appeared()).empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    kill(pid, SIGKILL);
  };
  run_command(argv, o);
  return name;
}

// The rendezvous object of the job on `port` when the ranks have tag `tag` ("" for none).
std::string rendezvous_object(int port, const std::string& tag) {
  return shmdist::detail::rendezvous_name("torch:127.0.0.1:" + std::to_string(port), 2, tag);
}

std::function<std::string()> when_exists(const std::string& name) {
  return [name] { return object_exists(name) ? name : std::string(); };
}

}  // namespace

BOOST_AUTO_TEST_SUITE(leak_check)

BOOST_AUTO_TEST_CASE(every_name_the_tests_own_job_leaves_is_reported) {
  ShmLeakCheck check;
  BOOST_TEST(std::string(std::getenv("SHMDIST_SHM_TAG")) == own_shm_tag());

  // A rendezvous (env://): the name the rank computes from the inherited tag.
  const int port = free_port(1);
  const std::string rv = leave_behind({program("fault_rank"), "join"}, port, clean_options(),
                                      when_exists(rendezvous_object(port, own_shm_tag())));
  BOOST_TEST(rv.rfind(own_shm_prefix() + "rv-", 0) == 0u, rv);

  // A segment announced through a store (as the torch backend joins): a random name.
  char dir_template[] = "/tmp/shmdist-leak-check-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const auto before = shm_objects();
  const std::string st =
      leave_behind({program("fault_rank"), "store_join", dir}, free_port(2), clean_options(), [&] {
        for (const auto& name : shm_objects())
          if (!before.count(name)) return name;
        return std::string();
      });
  std::filesystem::remove_all(dir);
  BOOST_TEST(st.rfind(own_shm_prefix() + "st-", 0) == 0u, st);

  const std::set<std::string> leaked = check.leaked_objects();
  BOOST_TEST(leaked.count(rv) == 1u);
  BOOST_TEST(leaked.count(st) == 1u);
  BOOST_TEST(leaked.size() == 2u);
  for (const auto& name : {rv, st}) shm_unlink(name.c_str());
  BOOST_TEST(check.leaked_objects().empty());
}

BOOST_AUTO_TEST_CASE(a_name_another_program_makes_meanwhile_is_not_reported) {
  ShmLeakCheck check;
  // Another shmdist job (a user's, an older suite's): no tag. Another test process: its tag.
  const int untagged_port = free_port(3), other_port = free_port(4);
  CommandOptions untagged = clean_options();
  untagged.unset_env.push_back("SHMDIST_SHM_TAG");
  const std::string untagged_name =
      leave_behind({program("fault_rank"), "join"}, untagged_port, untagged,
                   when_exists(rendezvous_object(untagged_port, "")));
  CommandOptions other = clean_options();
  other.env = {{"SHMDIST_SHM_TAG", "another_test"}};
  const std::string other_name =
      leave_behind({program("fault_rank"), "join"}, other_port, other,
                   when_exists(rendezvous_object(other_port, "another_test")));
  BOOST_TEST(!untagged_name.empty());
  BOOST_TEST(!other_name.empty());
  BOOST_TEST(check.leaked_objects().empty());
  BOOST_TEST(shm_objects().count(untagged_name) == 0u);
  for (const auto& name : {untagged_name, other_name})
    if (!name.empty()) shm_unlink(name.c_str());
}

BOOST_AUTO_TEST_SUITE_END()
