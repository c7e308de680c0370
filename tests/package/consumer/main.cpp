// A user of the installed package (find_package(decodegraph)): checks host V1 and a host-backend
// executor step against the float64 reference through the public headers only.
#include <cstdio>

#include "../common/check.hpp"

int main() {
  const double worst = dg_consumer_check();
  const bool ok = worst >= 0 && worst < 1e-5;
  std::printf("decodegraph %s cuda=%d %s (max |err| %.2e)\n", decodegraph::version(),
              decodegraph::built_with_cuda() ? 1 : 0, ok ? "ok" : "MISMATCH", worst);
  return ok ? 0 : 1;
}
