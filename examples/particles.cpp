// A gas of particles in a 1-D box, in a harmonic well, with a thermostat, split across ranks: each rank owns a
// block of particles, and two global quantities come from collectives every step:
//   - the time step, from the fastest particle anywhere (all_reduce MAX), and
//   - the total kinetic energy (all_reduce SUM of each rank's partial sum), which the
//     thermostat uses to rescale every velocity towards a target energy.
// The energy feeds back into the trajectory, so the run is reproducible only if the sum is:
// shmdist reduces in rank order, ((e0 + e1) + e2) + ..., on every rank and in every run. At
// the end rank 0 gathers the particles and checks them bit for bit against a single-process
// run that adds the same per-rank partial sums in the same order.
//
//   shmrun -n 4 examples/particles           ranks started by the launcher
//   examples/particles --ranks 4 [--threads]  the simulator starts its own ranks (launch())
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <shmdist/shmdist.hpp>

#include "run_example.hpp"

namespace dist = shmdist;

namespace {

constexpr int kParticles = 12000;  // divisible by 1-6, 8, 10, 12, 15, 16 ranks
constexpr int kSteps = 500;
constexpr double kBox = 1.0;
constexpr double kTargetEnergy = 50.0;
constexpr double kMaxMove = 1e-3;  // the fastest particle moves this far per step
constexpr double kWell = 400.0;

struct Block {
  std::vector<double> x, v;
};

Block initial(int begin, int end) {
  Block b;
  for (int i = begin; i < end; ++i) {
    b.x.push_back(std::fmod(i * 0.6180339887498949, 1.0) * kBox);
    b.v.push_back(std::sin(i * 12.9898) * 3.0 + std::cos(i * 78.233));
  }
  return b;
}

double partial_energy(const Block& b) {
  double e = 0;
  for (double v : b.v) e += 0.5 * v * v;
  return e;
}

double max_speed(const Block& b) {
  double m = 0;
  for (double v : b.v) m = std::max(m, std::fabs(v));
  return m;
}

// Kicks (the well pulls towards the middle), moves, bounces off the walls, and rescales a
// little towards the target energy.
void advance(Block& b, double dt, double energy) {
  const double scale = std::pow(kTargetEnergy / energy, 0.05);
  for (std::size_t i = 0; i < b.x.size(); ++i) {
    b.v[i] -= kWell * (b.x[i] - 0.5 * kBox) * dt;
    double x = b.x[i] + b.v[i] * dt;
    if (x < 0) x = -x, b.v[i] = -b.v[i];
    if (x > kBox) x = 2 * kBox - x, b.v[i] = -b.v[i];
    b.x[i] = x;
    b.v[i] *= scale;
  }
}

int block_begin(int rank, int size) { return kParticles * rank / size; }

// The same computation in one process: the blocks of a `size`-rank run, their partial sums
// added in rank order, exactly as the collectives do.
std::vector<double> simulate_alone(int size, double& energy) {
  std::vector<Block> blocks;
  for (int r = 0; r < size; ++r)
    blocks.push_back(initial(block_begin(r, size), block_begin(r + 1, size)));
  for (int s = 0; s < kSteps; ++s) {
    double fastest = 0;
    energy = 0;
    for (const Block& b : blocks) fastest = std::max(fastest, max_speed(b));
    for (int r = 0; r < size; ++r) energy = r == 0 ? partial_energy(blocks[0]) : energy + partial_energy(blocks[r]);
    for (Block& b : blocks) advance(b, kMaxMove / fastest, energy);
  }
  std::vector<double> x;
  for (const Block& b : blocks) x.insert(x.end(), b.x.begin(), b.x.end());
  return x;
}

bool simulate(dist::ProcessGroup& pg) {
  const int rank = pg.get_rank(), size = pg.get_world_size();
  Block b = initial(block_begin(rank, size), block_begin(rank + 1, size));
  double energy = 0;
  for (int s = 0; s < kSteps; ++s) {
    double fastest = max_speed(b);
    energy = partial_energy(b);
    dist::Tensor f = dist::Tensor::from_blob(&fastest, {1}, dist::kFloat64);
    dist::Tensor e = dist::Tensor::from_blob(&energy, {1}, dist::kFloat64);
    dist::Work w = pg.all_reduce(f, dist::ReduceOp::MAX, {}, /*async_op=*/true);
    pg.all_reduce(e);  // SUM, in rank order
    w.wait();
    advance(b, kMaxMove / fastest, energy);
  }
  // Gather every block's positions on rank 0.
  std::vector<double> all(rank == 0 ? kParticles : 0);
  std::vector<dist::Tensor> parts;
  if (rank == 0)
    for (int r = 0; r < size; ++r)
      parts.push_back(dist::Tensor::from_blob(all.data() + block_begin(r, size),
                                              {block_begin(r + 1, size) - block_begin(r, size)},
                                              dist::kFloat64));
  pg.gather(dist::Tensor::from_blob(b.x.data(), {static_cast<std::int64_t>(b.x.size())},
                                    dist::kFloat64), parts, 0);
  if (rank != 0) return true;
  double alone_energy = 0;
  const std::vector<double> alone = simulate_alone(size, alone_energy);
  const bool same = std::memcmp(all.data(), alone.data(), sizeof(double) * kParticles) == 0 &&
                    std::memcmp(&energy, &alone_energy, sizeof energy) == 0;
  std::printf("particles: %d ranks, %d particles, %d steps, kinetic energy %.12f: %s\n", size,
              kParticles, kSteps, energy,
              same ? "identical to the single-process run" : "DIFFERS from the single-process run");
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run("particles", argc, argv, simulate, [](int ranks) {
    if (ranks >= 1 && kParticles % ranks == 0) return true;
    std::fprintf(stderr, "particles: %d particles do not split equally among %d ranks\n",
                 kParticles, ranks);
    return false;
  });
}
