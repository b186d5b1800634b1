// Seed example 3: a sub-group, and an int64 message received into a float32 tensor.
// Run with: shmrun -n 2 examples/seed3_subgroup
#include <iostream>

#include <shmdist/shmdist.hpp>

namespace dist = shmdist;

int main() {
  dist::init_process_group("shm");
  const int rank = dist::get_rank();
  const dist::Group subgroup = dist::new_group({0, 1});
  if (rank == 0) {
    dist::send(dist::tensor({7, 8, 9}), /*dst=*/1, subgroup);
  } else if (rank == 1) {
    dist::Tensor res = dist::zeros(3);
    const int src_rank = dist::recv(res, /*src=*/0, subgroup);
    std::cout << "From " << src_rank << " in subgroup: " << res << std::endl;
  }
  dist::destroy_process_group();
}
