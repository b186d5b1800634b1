// A build without MPI (lib/transport/mpi_stub.cpp, compiled here on its own whatever this
// build has): a job across hosts cannot start and says that the build lacks MPI support.
#define BOOST_TEST_MODULE shmdist without MPI
#include <boost/test/unit_test.hpp>

#include <string>

#include <shmdist/errors.hpp>

#include "transport/mpi_transport.hpp"

BOOST_AUTO_TEST_CASE(a_job_across_hosts_says_the_build_has_no_mpi_support) {
  BOOST_TEST(!shmdist::transport::MpiSession::built_with_mpi());
  try {
    shmdist::transport::MpiSession::start();
    BOOST_FAIL("MpiSession::start() succeeded in a build without MPI");
  } catch (const shmdist::SetupError& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("no MPI support") != std::string::npos, what);
    BOOST_TEST(what.find("libopenmpi-dev") != std::string::npos, what);
  }
}
