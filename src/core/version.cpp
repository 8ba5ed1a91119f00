// The library's own record of its version, so a consumer can check that the headers it
// compiled against match the library it linked (see slimserve::linked_version()).
#include "slimserve/version.hpp"

SLIMSERVE_NAMESPACE_BEGIN

Version linked_version() noexcept { return version; }

SLIMSERVE_NAMESPACE_END
