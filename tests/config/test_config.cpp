// The one owner of the SHMDIST_* variables: what each reads to, what it refuses (naming the
// variable, the value and the accepted range), and that docs/launcher.md documents every one.
#include <boost/test/unit_test.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <shmdist/errors.hpp>

#include "base/config.hpp"

using namespace shmdist;

namespace {

using Env = std::map<std::string, std::string>;

config::Config read(const Env& env) {
  return config::read([&](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// Reading `env` throws SetupError whose text holds every one of `words`.
void refused(const Env& env, std::initializer_list<std::string> words) {
  try {
    read(env);
    BOOST_ERROR("accepted " << env.begin()->first << "='" << env.begin()->second << "'");
  } catch (const SetupError& e) {
    const std::string what = e.what();
    for (const auto& w : words) BOOST_TEST(what.find(w) != std::string::npos, what);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(config_tests)

BOOST_AUTO_TEST_CASE(nothing_set_gives_the_defaults) {
  const config::Config c = read({});
  BOOST_TEST(!c.segment_fd);
  BOOST_TEST(!c.job_key);
  BOOST_TEST(!c.ring_size);
  BOOST_TEST(!c.spin_us);
  BOOST_TEST(!c.local_cpus);
  BOOST_TEST(c.health_check.count() == config::kDefaultHealthCheck.count());
  BOOST_TEST(!c.hang_report);
  BOOST_TEST(!c.host_id);
  BOOST_TEST(c.shm_tag.empty());
  BOOST_TEST(config::kDefaultHealthCheck.count() == 100);
  BOOST_TEST(!c.single_copy);  // auto
  BOOST_TEST(config::kDefaultSingleCopy == 65536u);
}

BOOST_AUTO_TEST_CASE(every_variable_reads_into_its_field) {
  const config::Config c = read({{"SHMDIST_SEGMENT_FD", "7"},
                                 {"SHMDIST_JOB_KEY", "00112233445566ff"},
                                 {"SHMDIST_RING_SIZE", "64K"},
                                 {"SHMDIST_SPIN_US", "0"},
                                 {"SHMDIST_LOCAL_CPUS", "3"},
                                 {"SHMDIST_HEALTH_CHECK_MS", "3600000"},
                                 {"SHMDIST_HANG_REPORT", "1.5s"},
                                 {"SHMDIST_SINGLE_COPY", "1M"},
                                 {"SHMDIST_HOST_ID", "node-a"},
                                 {"SHMDIST_SHM_TAG", "suite_42"}});
  BOOST_TEST(c.segment_fd.value_or(-1) == 7);
  BOOST_TEST(c.job_key.value_or("") == "00112233445566ff");
  BOOST_TEST(c.ring_size.value_or(0) == 65536u);
  BOOST_TEST(c.spin_us.value_or(-1) == 0);
  BOOST_TEST(c.local_cpus.value_or(-1) == 3);
  BOOST_TEST(c.health_check.count() == 3600000);
  BOOST_TEST(c.hang_report.value_or(std::chrono::milliseconds(-1)).count() == 1500);
  BOOST_TEST(c.single_copy.value_or(0) == 1048576u);
  BOOST_TEST(read({{"SHMDIST_SINGLE_COPY", "off"}}).single_copy.value_or(1) == 0u);
  BOOST_TEST(read({{"SHMDIST_SINGLE_COPY", "0"}}).single_copy.value_or(1) == 0u);
  BOOST_TEST(read({{"SHMDIST_SINGLE_COPY", "4096"}}).single_copy.value_or(0) == 4096u);
  BOOST_TEST(!read({{"SHMDIST_SINGLE_COPY", "auto"}}).single_copy);
  BOOST_TEST(c.host_id.value_or("") == "node-a");
  BOOST_TEST(c.shm_tag == "suite_42");
  const auto off = read({{"SHMDIST_HANG_REPORT", "0"}}).hang_report;
  BOOST_TEST(off.value_or(std::chrono::milliseconds(-1)).count() == 0);
}

BOOST_AUTO_TEST_CASE(bad_values_name_the_variable_and_the_range) {
  refused({{"SHMDIST_SPIN_US", "x"}}, {"SHMDIST_SPIN_US='x' is not an integer", "0 to 1000000"});
  refused({{"SHMDIST_SPIN_US", "-5"}}, {"SHMDIST_SPIN_US='-5' is out of range", "0 to 1000000"});
  refused({{"SHMDIST_SPIN_US", "1000001"}}, {"out of range", "0 to 1000000"});
  refused({{"SHMDIST_LOCAL_CPUS", "0"}}, {"SHMDIST_LOCAL_CPUS='0' is out of range", "1 to 65536"});
  refused({{"SHMDIST_HEALTH_CHECK_MS", "0"}}, {"SHMDIST_HEALTH_CHECK_MS", "1 to 86400000"});
  refused({{"SHMDIST_HEALTH_CHECK_MS", ""}}, {"SHMDIST_HEALTH_CHECK_MS='' is not an integer"});
  refused({{"SHMDIST_SEGMENT_FD", "abc"}}, {"SHMDIST_SEGMENT_FD='abc' is not an integer", "shmrun"});
  refused({{"SHMDIST_SEGMENT_FD", "-1"}}, {"SHMDIST_SEGMENT_FD='-1' is out of range", "0 to"});
  refused({{"SHMDIST_RING_SIZE", "5"}}, {"SHMDIST_RING_SIZE = 5 bytes: expected a power of two"});
  refused({{"SHMDIST_RING_SIZE", "lots"}}, {"SHMDIST_RING_SIZE = 'lots' is not a byte size"});
  refused({{"SHMDIST_RING_SIZE", "2G"}}, {"SHMDIST_RING_SIZE", "(1G)"});
  refused({{"SHMDIST_JOB_KEY", "xyz"}}, {"SHMDIST_JOB_KEY='xyz' is not a job key", "16"});
  refused({{"SHMDIST_JOB_KEY", "00112233445566FF"}}, {"SHMDIST_JOB_KEY", "lower-case"});
  refused({{"SHMDIST_HANG_REPORT", "soon"}},
          {"SHMDIST_HANG_REPORT = 'soon' is not a duration", "30s", "or 0 to switch"});
  refused({{"SHMDIST_HANG_REPORT", "-1s"}}, {"SHMDIST_HANG_REPORT = '-1s'"});
  refused({{"SHMDIST_SINGLE_COPY", "1K"}}, {"SHMDIST_SINGLE_COPY='1K' is out of range", "4K to 1G", "auto"});
  refused({{"SHMDIST_SINGLE_COPY", "2G"}}, {"SHMDIST_SINGLE_COPY='2G' is out of range", "off"});
  refused({{"SHMDIST_SINGLE_COPY", "on"}}, {"SHMDIST_SINGLE_COPY = 'on' is not a byte size"});
  refused({{"SHMDIST_HOST_ID", ""}}, {"SHMDIST_HOST_ID is empty", "1 to 255 characters"});
  refused({{"SHMDIST_HOST_ID", std::string(256, 'h')}},
          {"SHMDIST_HOST_ID is too long (256 characters)", "1 to 255 characters"});
  // A tag becomes part of a file name in /dev/shm: no '/', no '-' (the names' separator).
  const std::vector<std::string> bad_tags = {"", "a/b", "a-b", "..", std::string(33, 't')};
  for (const std::string& bad : bad_tags)
    refused({{"SHMDIST_SHM_TAG", bad}},
            {"SHMDIST_SHM_TAG='" + bad + "' is not a tag", "1 to 32 letters, digits or '_'"});
}

BOOST_AUTO_TEST_CASE(the_table_has_every_variable_once) {
  std::map<std::string, int> seen;
  for (const auto& v : config::variables()) {
    BOOST_TEST(std::string(v.name).rfind("SHMDIST_", 0) == 0u, v.name);
    ++seen[v.name];
  }
  BOOST_TEST(seen.size() == 10u);
  for (const auto& [name, n] : seen) BOOST_TEST(n == 1, name);
}

// The table of variables in docs/launcher.md is the table in lib/base/config.cpp, row for row.
BOOST_AUTO_TEST_CASE(docs_document_every_variable) {
  std::ifstream in(SHMDIST_VARIABLES_DOC);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " SHMDIST_VARIABLES_DOC);
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const auto& v : config::variables()) {
    const std::string row = std::string("| `") + v.name + "` | " + v.accepted + " | " +
                            v.default_value + " | " + v.meaning + " |";
    BOOST_TEST(doc.find(row) != std::string::npos,
               "docs/launcher.md's table of variables lacks (or differs from) the row\n" << row);
  }
}

BOOST_AUTO_TEST_SUITE_END()
