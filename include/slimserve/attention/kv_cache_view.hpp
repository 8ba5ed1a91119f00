#pragma once
// Forwarding header: the paged K/V cache view moved to kv/ (the page movers use it; no kv/ <->
// attention/ include cycle). Include "slimserve/kv/kv_cache_view.hpp"; the kernel families'
// head-dim lists this path also gave are in attention/head_dims.hpp.
#include "slimserve/attention/head_dims.hpp"
#include "slimserve/kv/kv_cache_view.hpp"
