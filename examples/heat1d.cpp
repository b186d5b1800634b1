// A 1-D heat-diffusion simulator split across ranks: each rank owns a slice of the rod and
// exchanges one halo cell with each neighbour every step. At the end rank 0 gathers the rod
// and checks it against a single-process run: the results must be bit-for-bit identical.
//
// Two ways to run it:
//   shmrun -n 4 examples/heat1d            ranks started by the launcher (free functions)
//   examples/heat1d --ranks 4 [--threads]   the simulator starts its own ranks (launch())
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <shmdist/shmdist.hpp>

#include "run_example.hpp"

namespace dist = shmdist;

namespace {

constexpr int kCells = 4096;
constexpr int kSteps = 2000;
constexpr double kAlpha = 0.25;  // diffusion number; <= 0.5 keeps the explicit scheme stable

double initial(int i) { return i > kCells / 3 && i < kCells / 2 ? 100.0 : 0.0; }

// One explicit step on cells [1, n] of `u` (u[0] and u[n+1] are the neighbours' values).
void step(const std::vector<double>& u, std::vector<double>& next) {
  for (std::size_t i = 1; i + 1 < u.size(); ++i)
    next[i] = u[i] + kAlpha * (u[i - 1] - 2 * u[i] + u[i + 1]);
}

std::vector<double> simulate_alone() {
  std::vector<double> u(kCells + 2, 0.0), next(kCells + 2, 0.0);  // ends held at 0
  for (int i = 0; i < kCells; ++i) u[i + 1] = initial(i);
  for (int s = 0; s < kSteps; ++s) {
    step(u, next);
    std::swap(u, next);
  }
  return {u.begin() + 1, u.end() - 1};
}

// The distributed run on `pg`; returns true on rank 0 if the rod matches simulate_alone().
bool simulate(dist::ProcessGroup& pg) {
  const int rank = pg.get_rank(), size = pg.get_world_size();
  const int begin = kCells * rank / size, end = kCells * (rank + 1) / size;
  const int n = end - begin;
  std::vector<double> u(n + 2, 0.0), next(n + 2, 0.0);
  for (int i = 0; i < n; ++i) u[i + 1] = initial(begin + i);
  const int left = rank - 1, right = rank + 1 < size ? rank + 1 : -1;
  for (int s = 0; s < kSteps; ++s) {
    // Halo exchange: post both receives, send both edges, wait. Tags keep directions apart.
    dist::Tensor from_left = dist::Tensor::from_blob(&u[0], {1}, dist::kFloat64);
    dist::Tensor from_right = dist::Tensor::from_blob(&u[n + 1], {1}, dist::kFloat64);
    std::vector<dist::Work> works;
    if (left >= 0) {
      works.push_back(pg.irecv(from_left, left, {}, 0));
      works.push_back(pg.isend(dist::Tensor::from_blob(&u[1], {1}, dist::kFloat64), left, {}, 1));
    }
    if (right >= 0) {
      works.push_back(pg.irecv(from_right, right, {}, 1));
      works.push_back(pg.isend(dist::Tensor::from_blob(&u[n], {1}, dist::kFloat64), right, {}, 0));
    }
    for (auto& w : works) w.wait();
    step(u, next);
    std::swap(u, next);
  }
  // Gather the slices on rank 0.
  if (rank != 0) {
    pg.send(dist::Tensor::from_blob(&u[1], {n}, dist::kFloat64), 0, {}, 2);
    return true;
  }
  std::vector<double> rod(u.begin() + 1, u.end() - 1);
  for (int r = 1; r < size; ++r) {
    const int b = kCells * r / size, e = kCells * (r + 1) / size;
    std::vector<double> part(e - b);
    dist::Tensor t = dist::Tensor::from_blob(part.data(), {e - b}, dist::kFloat64);
    pg.recv(t, r, {}, 2);
    rod.insert(rod.end(), part.begin(), part.end());
  }
  const std::vector<double> alone = simulate_alone();
  const bool same = std::memcmp(rod.data(), alone.data(), sizeof(double) * kCells) == 0;
  double total = 0;
  for (double v : rod) total += v;
  std::printf("heat1d: %d ranks, %d cells, %d steps, total heat %.6f: %s\n", size, kCells,
              kSteps, total,
              same ? "identical to the single-process run" : "DIFFERS from the single-process run");
  return same;
}

}  // namespace

int main(int argc, char** argv) { return example::run("heat1d", argc, argv, simulate); }
