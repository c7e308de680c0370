// Runs the check through the shared object; it knows nothing of decodegraph itself.
#include <cstdio>

extern "C" double dg_plugin_check();
extern "C" const char* dg_plugin_version();

int main() {
  const double worst = dg_plugin_check();
  const bool ok = worst >= 0 && worst < 1e-5;
  std::printf("decodegraph %s via shared object: %s (max |err| %.2e)\n", dg_plugin_version(),
              ok ? "ok" : "MISMATCH", worst);
  return ok ? 0 : 1;
}
