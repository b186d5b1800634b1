// Seed example 1: one sender. Run with: shmrun -n 2 examples/seed1_send_recv
#include <iostream>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

int main() {
  dist::init_process_group("shm");
  const int rank = dist::get_rank();
  if (rank == 0) {
    const dist::Tensor t = dist::tensor({10, 20, 30, 40});
    dist::send(t, /*dst=*/1);
  } else if (rank == 1) {
    dist::Tensor res = dist::zeros(4, dist::kLong);
    const int src_rank = dist::recv(res, /*src=*/0);
    std::cout << "Received from " << src_rank << ": " << res << std::endl;
  }
  dist::destroy_process_group();
}
