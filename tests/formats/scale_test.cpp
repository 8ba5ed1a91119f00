// Scale helpers: amax -> scale per tensor / row / group / head, and clear rejections.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "slimserve/formats/scale.hpp"
#include "support/random.hpp"

using namespace slimserve;

namespace {
bool mentions(const Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}
}  // namespace

TEST_CASE("validate_scale accepts finite positive scales only", "[formats][scale]") {
  CHECK(validate_scale(1.0f).ok());
  CHECK(validate_scale(std::numeric_limits<float>::denorm_min()).ok());
  CHECK(validate_scale(std::numeric_limits<float>::max()).ok());
  for (float bad : {0.0f, -0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const Status status = validate_scale(bad);
    INFO(status.to_string());
    CHECK(status.code() == StatusCode::invalid_argument);
    CHECK(mentions(status, "finite and > 0"));
  }
  CHECK(mentions(validate_scale(-2.5f), "-2.5"));
}

TEST_CASE("scale_from_amax maps amax onto the format's maximum", "[formats][scale]") {
  CHECK(*scale_from_amax(448.0f, 448.0f) == 1.0f);
  CHECK(*scale_from_amax<fp8_e4m3>(896.0f) == 2.0f);
  CHECK(*scale_from_amax<fp8_e5m2>(57344.0f) == 1.0f);
  CHECK(*scale_from_amax(0.0f, 448.0f) == 1.0f);  // all zeros: any scale is exact
  // Underflow clamps to the smallest normal float (still finite and > 0).
  CHECK(*scale_from_amax(std::numeric_limits<float>::denorm_min(), 448.0f) ==
        std::numeric_limits<float>::min());
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    const Result<float> r = scale_from_amax(bad, 448.0f);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::invalid_argument);
    CHECK(mentions(r.status(), "amax"));
  }
  for (float bad : {0.0f, -448.0f, std::numeric_limits<float>::infinity()}) {
    const Result<float> r = scale_from_amax(1.0f, bad);
    REQUIRE_FALSE(r.ok());
    CHECK(mentions(r.status(), "format_max"));
  }
}

TEST_CASE("per-tensor, per-group, per-row and per-head scales", "[formats][scale]") {
  auto rng = slimserve_test::make_rng(41);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const std::size_t tokens = 5, heads = 3, head_dim = 8;
  std::vector<float> kv(tokens * heads * head_dim);  // [tokens, heads, head_dim]
  for (float& v : kv) v = normal(rng);
  kv[2 * heads * head_dim + 1 * head_dim + 3] = -300.0f;  // outlier in head 1, token 2
  const std::span<const float> values(kv);

  float amax = 0.0f;
  for (float v : kv) amax = std::fmax(amax, std::fabs(v));
  CHECK(*tensor_scale(values, 448.0f) == amax / 448.0f);
  CHECK(*amax_of(values) == 300.0f);

  std::vector<float> row(tokens * heads, -1.0f);
  REQUIRE(row_scales(values, head_dim, 448.0f, std::span<float>(row)).ok());
  for (std::size_t r = 0; r < row.size(); ++r) {
    float row_amax = 0.0f;
    for (std::size_t c = 0; c < head_dim; ++c) row_amax = std::fmax(row_amax, std::fabs(kv[r * head_dim + c]));
    CHECK(row[r] == row_amax / 448.0f);
  }

  std::vector<float> groups(tokens * heads * 2, -1.0f);  // groups of 4 along head_dim
  REQUIRE(group_scales(values, 4, 57344.0f, std::span<float>(groups)).ok());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    float group_amax = 0.0f;
    for (std::size_t c = 0; c < 4; ++c) group_amax = std::fmax(group_amax, std::fabs(kv[g * 4 + c]));
    CHECK(groups[g] == group_amax / 57344.0f);
  }

  std::vector<float> per_head(heads, -1.0f);
  REQUIRE(head_scales(values, heads, head_dim, 448.0f, std::span<float>(per_head)).ok());
  for (std::size_t h = 0; h < heads; ++h) {
    float head_amax = 0.0f;
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t c = 0; c < head_dim; ++c)
        head_amax = std::fmax(head_amax, std::fabs(kv[(t * heads + h) * head_dim + c]));
    CHECK(per_head[h] == head_amax / 448.0f);
  }
  CHECK(per_head[1] == 300.0f / 448.0f);

  // BF16 input works the same way.
  std::vector<bf16> half(kv.size());
  for (std::size_t i = 0; i < kv.size(); ++i) half[i] = from_float<bf16>(kv[i]);
  CHECK(*tensor_scale(std::span<const bf16>(half), 448.0f) == 300.0f / 448.0f);
}

TEST_CASE("scale helpers reject bad input and write nothing", "[formats][scale]") {
  std::vector<float> values{1.0f, 2.0f, 3.0f, 4.0f, std::numeric_limits<float>::quiet_NaN(), 6.0f};
  std::vector<float> scales(3, -7.0f);
  const Status nan_status =
      group_scales(std::span<const float>(values), 2, 448.0f, std::span<float>(scales));
  CHECK(nan_status.code() == StatusCode::invalid_argument);
  CHECK(mentions(nan_status, "element 4"));
  CHECK(scales == std::vector<float>(3, -7.0f));  // untouched

  values[4] = 5.0f;
  const Status shape = group_scales(std::span<const float>(values), 4, 448.0f, std::span<float>(scales));
  CHECK(mentions(shape, "not a whole number of groups of 4"));
  const Status count = group_scales(std::span<const float>(values), 3, 448.0f, std::span<float>(scales));
  CHECK(mentions(count, "scales holds 3 entries; the tensor has 2 groups"));
  CHECK(mentions(group_scales(std::span<const float>(values), 0, 448.0f, std::span<float>(scales)),
                 "group_size must be > 0"));
  CHECK(mentions(group_scales(std::span<const float>(values), 2, -1.0f, std::span<float>(scales)),
                 "format_max"));
  std::vector<float> two(2);
  CHECK(mentions(head_scales(std::span<const float>(values), 2, 2, 448.0f, std::span<float>(two)),
                 "is not [tokens, 2, 2]"));
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(1.0f);
  const Result<float> inf_tensor = tensor_scale(std::span<const float>(values), 448.0f);
  REQUIRE_FALSE(inf_tensor.ok());
  CHECK(mentions(inf_tensor.status(), "element 6 is not finite"));
  CHECK(scales == std::vector<float>(3, -7.0f));
}
