#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "slimserve/status.hpp"
#include "slimserve/version.hpp"

using slimserve::BadResultAccess;
using slimserve::make_status;
using slimserve::Result;
using slimserve::Status;
using slimserve::StatusCode;

namespace {
Result<int> parse_positive(int value) {
  if (value <= 0) return make_status(StatusCode::invalid_argument, "expected > 0, got ", value);
  return value;
}
Status chain(int value) {
  SLIMSERVE_RETURN_IF_ERROR(parse_positive(value).status());
  return {};
}
}  // namespace

TEST_CASE("Status carries a code and a message that names the value") {
  Status ok;
  CHECK(ok.ok());
  CHECK(ok.message().empty());
  CHECK(ok.to_string() == "ok");

  Status bad = make_status(StatusCode::out_of_range, "page ", 70000, " >= num_pages ", 4096);
  CHECK_FALSE(bad.ok());
  CHECK(bad.code() == StatusCode::out_of_range);
  CHECK(bad.to_string() == "out of range: page 70000 >= num_pages 4096");
  Status copy = bad;  // copies share the message
  CHECK(copy.message() == bad.message());
}

TEST_CASE("Result holds a value or the Status explaining its absence") {
  auto good = parse_positive(5);
  REQUIRE(good.ok());
  CHECK(*good == 5);
  auto bad = parse_positive(-3);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  CHECK(std::string(bad.status().message()) == "expected > 0, got -3");
  CHECK(chain(-1).code() == StatusCode::invalid_argument);
  CHECK(chain(2).ok());
  // A Result built from an ok Status is a bug in the caller: it must not look like success.
  Result<int> misuse{Status{}};
  CHECK(misuse.status().code() == StatusCode::internal);
}

TEST_CASE("Result::value() is checked; rvalue accessors move the value out") {
  Result<int> bad = parse_positive(-3);
  CHECK_THROWS_AS(bad.value(), BadResultAccess);
  try {
    (void)bad.value();
  } catch (const BadResultAccess& error) {
    CHECK(error.status().code() == StatusCode::invalid_argument);
    CHECK(std::string(error.what()).find("expected > 0, got -3") != std::string::npos);
  }
  CHECK_THROWS_AS(std::move(bad).value(), BadResultAccess);
  CHECK(parse_positive(-1).value_or(7) == 7);
  CHECK(parse_positive(4).value_or(7) == 4);

  Result<std::unique_ptr<int>> owned{std::make_unique<int>(11)};
  std::unique_ptr<int> taken = *std::move(owned);  // rvalue operator*: moves, no copy
  REQUIRE(taken != nullptr);
  CHECK(*taken == 11);
  Result<std::unique_ptr<int>> again{std::make_unique<int>(12)};
  std::unique_ptr<int> by_value = std::move(again).value();
  CHECK(*by_value == 12);
}

TEST_CASE("the linked library's version matches the headers") {
  const auto linked = slimserve::linked_version();
  CHECK(linked.major == slimserve::version.major);
  CHECK(linked.minor == slimserve::version.minor);
  CHECK(linked.patch == slimserve::version.patch);
  CHECK(slimserve::version_number == SLIMSERVE_VERSION);
}
