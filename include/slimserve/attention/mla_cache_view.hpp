#pragma once
// Forwarding header: the MLA latent cache view moved to kv/ (the page movers use it; no kv/ <-> attention/
// include cycle). Include "slimserve/kv/mla_cache_view.hpp".
#include "slimserve/kv/mla_cache_view.hpp"
