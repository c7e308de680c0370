// decodegraph::Error: the one exception type the library throws.
// Messages name the parameter, the offending value and what is allowed, e.g.
//   "head_size = 100 is not supported; allowed: 64, 80, 96, 112, 128, 192, 256"
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace decodegraph {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename T>
std::string to_text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace detail

/// Throws Error("<param> = <value> is invalid; allowed: <allowed>").
template <typename T>
[[noreturn]] void throw_invalid(std::string_view param, const T& value, std::string_view allowed) {
  throw Error(std::string(param) + " = " + detail::to_text(value) + " is invalid; allowed: " +
              std::string(allowed));
}

/// Checks `ok`; otherwise throws as throw_invalid does.
template <typename T>
void require(bool ok, std::string_view param, const T& value, std::string_view allowed) {
  if (!ok) throw_invalid(param, value, allowed);
}

}  // namespace decodegraph
