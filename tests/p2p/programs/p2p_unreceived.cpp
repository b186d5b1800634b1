// Test program shmdist_p2p_unreceived (run by test_errors.cpp under `shmrun -n 3`): leaves
// messages unreceived and a receive unmatched, so that destroy_process_group has something to
// report on stderr.
//   rank 0 -> rank 1: tag 3 (5 x int64), tag 3 (4 x int64), tag 4 (10 x float32): 112 bytes,
//                     none received
//   rank 0 -> rank 2: tag 1, received
//   rank 2 -> rank 1: tag 0 (1 x float32), not received
//   rank 0: an irecv from rank 2 on tag 9 that nothing matches
#include <exception>
#include <iostream>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

int main() {
  try {
    dist::init_process_group();
    const int rank = dist::get_rank();
    dist::Tensor unmatched = dist::zeros(1);
    dist::Work never;
    if (rank == 0) {
      dist::send(dist::tensor({1, 2, 3, 4, 5}), 1, {}, 3);
      dist::send(dist::tensor({1, 2, 3, 4}), 1, {}, 3);
      dist::send(dist::zeros(10), 1, {}, 4);
      dist::send(dist::tensor({6}), 2, {}, 1);
      never = dist::irecv(unmatched, 2, {}, 9);
    } else if (rank == 2) {
      dist::Tensor t = dist::zeros(1, dist::kLong);
      dist::recv(t, 0, {}, 1);
      dist::send(dist::tensor({0.5f}), 1);
    }
    dist::barrier();
    if (rank == 0) std::cout << "p2p_unreceived: all ranks reached destroy" << std::endl;
    dist::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "p2p_unreceived: " << e.what() << std::endl;
    return 1;
  }
}
