// An outside project: built against an installed shmdist, through find_package and pkg-config.
#include <iostream>

#include <shmdist/shmdist.hpp>

int main() {
  namespace dist = shmdist;
  std::cout << dist::tensor({10, 20, 30, 40}) << "\n";
  dist::LaunchOptions options;
  options.mode = dist::LaunchOptions::Mode::Threads;
  const auto outcomes = dist::launch(2, [](dist::ProcessGroup& pg) {
    if (pg.get_rank() == 0) {
      pg.send(dist::tensor({7, 8, 9}), 1);
    } else {
      dist::Tensor t = dist::zeros(3);
      const int src = pg.recv(t, 0);
      std::cout << "From " << src << ": " << t << "\n";
    }
  }, options);
  for (const auto& o : outcomes)
    if (!o.ok()) return 1;
  return 0;
}
