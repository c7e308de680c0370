// A shared object built around the static decodegraph library (as a Python extension would be).
#include "../common/check.hpp"

extern "C" double dg_plugin_check() { return dg_consumer_check(); }
extern "C" const char* dg_plugin_version() { return decodegraph::version(); }
