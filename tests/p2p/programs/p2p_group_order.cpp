// Test program shmdist_p2p_group_order (run by test_groups.cpp under `shmrun -n 3`): the ranks
// create two groups in different orders (issue 11, bug 5).
//   rank 0:     {0,1} (its group #1), then {1,2} (#2)
//   ranks 1, 2: {1,2} (their group #1), then {0,1} (#2)
//   rank 0 -> rank 1 on {0,1}, tag 0: rank 1's recv on its {0,1} must throw InvalidArgument
//              naming rank 0 (printed as "DISAGREE what=...") instead of timing out
//   rank 2 -> rank 1 on {1,2}, tag 4 (ranks 1 and 2 agree on it): never received, so that
//              destroy_process_group's report names that group
#include <iostream>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

int main() {
  try {
    dist::init_process_group();
    const int rank = dist::get_rank();
    dist::Group pair, tail;
    if (rank == 0) {
      pair = dist::new_group({0, 1});
      tail = dist::new_group({1, 2});
    } else {
      tail = dist::new_group({1, 2});
      pair = dist::new_group({0, 1});
    }
    if (rank == 0) dist::send(dist::tensor({7}), 1, pair);
    if (rank == 2) dist::send(dist::tensor({1.5f}), 1, tail, 4);
    dist::barrier();
    if (rank == 1) {
      dist::Tensor t = dist::zeros(1, dist::kLong);
      try {
        dist::recv(t, 0, pair);
        std::cout << "UNEXPECTED recv on the group returned" << std::endl;
        return 5;
      } catch (const dist::InvalidArgument& e) {
        std::cout << "DISAGREE what=" << e.what() << std::endl;
      }
      try {
        dist::send(t, 2, tail);
        std::cout << "UNEXPECTED send on a group after the disagreement returned" << std::endl;
        return 5;
      } catch (const dist::InvalidArgument& e) {
        std::cout << "STILL what=" << e.what() << std::endl;
      }
    }
    dist::barrier();
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cout << "ERROR what=" << e.what() << std::endl;
    return 3;
  }
}
