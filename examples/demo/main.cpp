// slimserve end-to-end demo (grows with each component).
#include <fmt/core.h>

#include "slimserve/version.hpp"

int main() {
  fmt::print("slimserve {}.{}.{}\n", slimserve::version.major, slimserve::version.minor,
             slimserve::version.patch);
  return 0;
}
