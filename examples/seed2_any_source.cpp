// Seed example 2: dynamic source. Run with: shmrun -n 3 examples/seed2_any_source
// One of the two messages is never received: destroy_process_group reports it on stderr.
#include <iostream>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

int main() {
  dist::init_process_group("shm");
  const int rank = dist::get_rank();
  if (rank == 0) {
    dist::send(dist::tensor({1, 2, 3}), /*dst=*/2);
  } else if (rank == 1) {
    dist::send(dist::tensor({4, 5, 6}), /*dst=*/2);
  } else if (rank == 2) {
    dist::Tensor res = dist::zeros(3, dist::kLong);
    const int src_rank = dist::recv(res, dist::ANY_SOURCE);
    std::cout << "Received from " << src_rank << ": " << res << std::endl;
  }
  dist::destroy_process_group();
}
