#pragma once
/// \file
/// \brief Umbrella header of slimserve's numeric formats: BF16/FP16/FP8 storage types and
/// conversions, packed register conversions, INT4 nibbles and quantization scales.

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/int4.hpp"
#include "slimserve/formats/packed.hpp"
#include "slimserve/formats/scale.hpp"
