// The paged attention plan orders its work longest first (LPT): a causal row tile reads K/V up
// to its own last query token, so the last row tiles of the longest request go first and the
// short ones fill the tail of the grid. Units and their work items stay consistent (each
// unit's items contiguous, in split order) whatever the order, and every (request, row tile)
// appears exactly once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "slimserve/attention/paged_attention.hpp"

using namespace slimserve;
using namespace slimserve::attention;

namespace {

struct PlanView {
  std::vector<std::int32_t> work_request, work_row_tile, work_split, work_num_splits;
  std::vector<std::int32_t> unit_request, unit_row_tile, unit_indptr;
};

PlanView view_of(const PagedAttentionPlan& plan) {
  const auto at = [&](std::size_t offset, std::size_t n) {
    const std::int32_t* base = plan.host_ints.data() + offset / sizeof(std::int32_t);
    return std::vector<std::int32_t>(base, base + n);
  };
  const auto w = static_cast<std::size_t>(plan.num_work_items);
  const auto u = static_cast<std::size_t>(plan.num_units);
  return {at(plan.layout.work_request, w),  at(plan.layout.work_row_tile, w), at(plan.layout.work_split, w),
          at(plan.layout.work_num_splits, w), at(plan.layout.unit_request, u), at(plan.layout.unit_row_tile, u),
          at(plan.layout.unit_indptr, u + 1)};
}

/// KV tokens that row tile `tile` (of `rows_per_tile` packed rows) of a request can see.
std::int64_t visible(std::int64_t kv_len, std::int64_t qo_len, std::int64_t group, std::int64_t tile,
                     std::int64_t rows_per_tile, bool causal) {
  const std::int64_t last_token = (std::min(qo_len * group, (tile + 1) * rows_per_tile) - 1) / group;
  return causal ? kv_len - qo_len + last_token + 1 : kv_len;
}

}  // namespace

TEST_CASE("paged attention plan: work items longest first (causal LPT order)", "[attention][plan]") {
  PagedAttentionProblem p;
  p.batch_size = 3;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;  // group 4: 16 query tokens per 64-row tile
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::bf16;
  // Ragged: request 0 a 100-token prefill on a 40-token prefix, 1 a 33-token chunk on a long
  // prefix, 2 a 70-token prompt. Pages per request = ceil(kv_len / 16).
  const std::vector<std::int64_t> qo{100, 33, 70}, kv{140, 1000, 70};
  std::vector<std::int32_t> qo_indptr{0}, kv_indptr{0}, last;
  for (std::size_t b = 0; b < qo.size(); ++b) {
    qo_indptr.push_back(qo_indptr.back() + static_cast<std::int32_t>(qo[b]));
    kv_indptr.push_back(kv_indptr.back() + static_cast<std::int32_t>((kv[b] + 15) / 16));
    last.push_back(static_cast<std::int32_t>((kv[b] - 1) % 16 + 1));
  }
  for (const bool causal : {true, false}) {
    for (const bool split : {false, true}) {
      CAPTURE(causal, split);
      p.causal = causal;
      PagedAttentionPlanArguments args{p, qo_indptr, kv_indptr, last};
      args.num_sms = split ? 132 : 1;
      args.allow_split = split;
      auto plan = make_paged_attention_plan(args);
      REQUIRE(plan.ok());
      REQUIRE(plan->cta_rows == 64);
      CHECK(plan->split_kv == split);
      const PlanView v = view_of(*plan);
      const std::int64_t group = p.num_qo_heads / p.num_kv_heads;
      std::set<std::pair<std::int32_t, std::int32_t>> seen;
      std::int64_t previous = INT64_MAX;
      std::int64_t expected_units = 0;
      for (std::size_t b = 0; b < qo.size(); ++b) expected_units += (qo[b] * group + 63) / 64;
      REQUIRE(plan->num_units == expected_units);
      for (std::int32_t i = 0; i < plan->num_units; ++i) {
        const std::int32_t b = v.unit_request[static_cast<std::size_t>(i)];
        const std::int32_t tile = v.unit_row_tile[static_cast<std::size_t>(i)];
        REQUIRE((b >= 0 && b < p.batch_size));
        CHECK(seen.insert({b, tile}).second);
        const std::int64_t cost = visible(kv[static_cast<std::size_t>(b)], qo[static_cast<std::size_t>(b)], group, tile, 64, causal);
        CHECK(cost <= previous);  // longest first
        previous = cost;
        // The unit's items: contiguous, its own (request, row tile), splits 0, 1, ...
        const std::int32_t first = v.unit_indptr[static_cast<std::size_t>(i)];
        const std::int32_t end = v.unit_indptr[static_cast<std::size_t>(i) + 1];
        REQUIRE(end > first);
        for (std::int32_t item = first; item < end; ++item) {
          const auto k = static_cast<std::size_t>(item);
          CHECK(v.work_request[k] == b);
          CHECK(v.work_row_tile[k] == tile);
          CHECK(v.work_split[k] == item - first);
          CHECK(v.work_num_splits[k] == end - first);
        }
      }
      CHECK(v.unit_indptr.front() == 0);
      CHECK(v.unit_indptr.back() == plan->num_work_items);
      if (causal) {
        // The first unit is request 1's (33 tokens on a 1000-token cache) last row tile; the
        // last is request 2's first (16 of 70 prompt tokens visible).
        CHECK(v.unit_request.front() == 1);
        CHECK(v.unit_row_tile.front() == (33 * 4 + 63) / 64 - 1);
        CHECK(v.unit_request.back() == 2);
        CHECK(v.unit_row_tile.back() == 0);
      } else {
        CHECK(v.unit_request.front() == 1);  // the longest cache; ties keep the row-tile order
        CHECK(v.unit_row_tile.front() == 0);
      }
    }
  }
}
