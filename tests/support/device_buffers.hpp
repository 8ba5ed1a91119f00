#pragma once
// Device buffers for the tests: allocation (and upload) that ends the test case when the
// runtime refuses, so a test body reads as its set-up and its checks.
#include <catch2/catch.hpp>

#include <cstddef>
#include <utility>
#include <vector>

#include "slimserve/runtime/memory.hpp"

namespace slimserve_test {

/// `count` elements on the device (contents undefined: poison or upload before reading).
template <class T>
slimserve::rt::DeviceBuffer<T> device_buffer(std::size_t count) {
  auto buffer = slimserve::rt::DeviceBuffer<T>::create(count);
  REQUIRE(buffer.ok());
  return std::move(buffer).value();
}

/// A device copy of `host` (one element, undefined, when `host` is empty).
template <class T>
slimserve::rt::DeviceBuffer<T> upload(const std::vector<T>& host) {
  auto buffer = device_buffer<T>(host.empty() ? 1 : host.size());
  if (!host.empty()) REQUIRE(buffer.upload(host).ok());
  return buffer;
}

}  // namespace slimserve_test
