// Device side of the consumer: slimserve's kernel headers compile in the engine's own nvcc build.
#include <slimserve/runtime/launch.hpp>

int consumer_kernel_check() { return SLIMSERVE_PLATFORM_CUDA; }
