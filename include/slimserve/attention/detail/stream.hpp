#pragma once
/// \file
/// \brief Kept for code that included it: the stream type now comes from one runtime header
/// shared by kv, attention and int4.

#include "slimserve/runtime/stream.hpp"
