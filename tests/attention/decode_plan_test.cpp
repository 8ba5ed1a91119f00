// Host planner: split selection, workspace layout, and preflight of bad page tables.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "slimserve/attention/decode_plan.hpp"

using namespace slimserve;
using namespace slimserve::attention;

namespace {

DecodeProblem problem(std::int32_t batch) {
  DecodeProblem p;
  p.batch_size = batch;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::fp8_e4m3;
  return p;
}

struct HostTable {
  std::vector<std::int32_t> indptr{0};
  std::vector<std::int32_t> last;
  void add(std::int64_t tokens, std::int32_t page_size) {
    const auto pages = static_cast<std::int32_t>((tokens + page_size - 1) / page_size);
    indptr.push_back(indptr.back() + pages);
    last.push_back(tokens == 0 ? 0 : static_cast<std::int32_t>(tokens - (pages - 1) * page_size));
  }
};

}  // namespace

TEST_CASE("decode plan: a full batch is not split", "[attention][plan]") {
  HostTable t;
  for (int b = 0; b < 128; ++b) t.add(1000 + b, 16);
  DecodePlanArguments args{problem(128), t.indptr, t.last};
  args.max_ctas = 528;
  auto plan = make_decode_plan(args);
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->split_kv);
  CHECK(plan->num_work_items == 128);
  const auto* split_indptr = plan->host_ints.data() + 2 * 128;
  for (int b = 0; b <= 128; ++b) CHECK(split_indptr[b] == b);
  CHECK(plan->layout.partial_o == plan->layout.total_bytes);  // no partials without splits
}

TEST_CASE("decode plan: small batch, long context is split into one wave", "[attention][plan]") {
  HostTable t;
  const std::vector<std::int64_t> lengths{1, 15, 16, 17, 32768, 131072 - 3};
  for (auto len : lengths) t.add(len, 16);
  DecodePlanArguments args{problem(static_cast<std::int32_t>(lengths.size())), t.indptr, t.last};
  args.max_ctas = 528;
  auto plan = make_decode_plan(args);
  REQUIRE(plan.ok());
  CHECK(plan->split_kv);
  CHECK(plan->chunk_tokens % 16 == 0);
  CHECK(plan->chunk_tokens >= 512);
  CHECK(static_cast<std::int64_t>(plan->num_work_items) * 8 <= 528);
  // Every request's splits cover it exactly, in order.
  const std::int32_t w = plan->num_work_items;
  const auto* req = plan->host_ints.data();
  const auto* split = req + w;
  const auto* split_indptr = split + w;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::int32_t n = split_indptr[b + 1] - split_indptr[b];
    const std::int64_t needed = std::max<std::int64_t>(1, (lengths[b] + plan->chunk_tokens - 1) / plan->chunk_tokens);
    CHECK(n == needed);
    for (std::int32_t s = 0; s < n; ++s) {
      CHECK(req[split_indptr[b] + s] == static_cast<std::int32_t>(b));
      CHECK(split[split_indptr[b] + s] == s);
    }
  }
  // Workspace regions are disjoint, aligned and sized for the partial states.
  const auto& l = plan->layout;
  CHECK(l.int_bytes == plan->host_ints.size() * sizeof(std::int32_t));
  CHECK(l.partial_o >= l.int_bytes);
  CHECK(l.partial_o % 256 == 0);
  CHECK(l.partial_lse >= l.partial_o + static_cast<std::size_t>(w) * 32 * 128 * sizeof(float));
  CHECK(l.total_bytes >= l.partial_lse + static_cast<std::size_t>(w) * 32 * sizeof(float));
  // The size query runs the same code.
  auto size = decode_workspace_size(args);
  REQUIRE(size.ok());
  CHECK(*size == l.total_bytes);
}

TEST_CASE("decode plan: min_chunk_tokens bounds the split", "[attention][plan]") {
  HostTable t;
  t.add(64 * 16, 16);
  DecodePlanArguments args{problem(1), t.indptr, t.last};
  args.max_ctas = 1 << 20;
  args.min_chunk_tokens = 100;  // rounds up to 7 pages
  auto plan = make_decode_plan(args);
  REQUIRE(plan.ok());
  CHECK(plan->chunk_tokens == 7 * 16);
  CHECK(plan->num_work_items == 10);  // ceil(64 / 7)
  args.allow_split = false;
  plan = make_decode_plan(args);
  REQUIRE(plan.ok());
  CHECK(plan->num_work_items == 1);
  CHECK_FALSE(plan->split_kv);
}

TEST_CASE("decode plan: preflight rejects bad tables and shapes", "[attention][plan]") {
  HostTable t;
  t.add(40, 16);
  t.add(16, 16);
  DecodePlanArguments args{problem(2), t.indptr, t.last};

  SECTION("last_page_len > page_size") {
    std::vector<std::int32_t> last{17, 16};
    args.last_page_len_host = last;
    auto plan = make_decode_plan(args);
    CHECK(plan.status().code() == StatusCode::invalid_argument);
    CHECK(plan.status().message().find("last_page_len[0] = 17") != std::string_view::npos);
  }
  SECTION("last_page_len 0 on a non-empty request") {
    std::vector<std::int32_t> last{8, 0};
    args.last_page_len_host = last;
    CHECK(make_decode_plan(args).status().code() == StatusCode::invalid_argument);
  }
  SECTION("nonzero last_page_len on a request with no pages") {
    std::vector<std::int32_t> indptr{0, 3, 3};
    std::vector<std::int32_t> last{8, 5};
    args.indptr_host = indptr;
    args.last_page_len_host = last;
    auto plan = make_decode_plan(args);
    CHECK(plan.status().code() == StatusCode::invalid_argument);
    CHECK(plan.status().message().find("no pages") != std::string_view::npos);
  }
  SECTION("decreasing indptr") {
    std::vector<std::int32_t> indptr{0, 3, 2};
    args.indptr_host = indptr;
    CHECK(make_decode_plan(args).status().code() == StatusCode::invalid_argument);
  }
  SECTION("indptr[0] != 0") {
    std::vector<std::int32_t> indptr{1, 3, 4};
    args.indptr_host = indptr;
    CHECK(make_decode_plan(args).status().code() == StatusCode::invalid_argument);
  }
  SECTION("wrong table size") {
    args.problem.batch_size = 3;
    CHECK(make_decode_plan(args).status().code() == StatusCode::invalid_argument);
  }
  SECTION("unsupported head_dim") {
    args.problem.head_dim = 96;
    CHECK(make_decode_plan(args).status().code() == StatusCode::unsupported);
  }
  SECTION("unsupported page size") {
    args.problem.page_size = 8;
    CHECK(make_decode_plan(args).status().code() == StatusCode::unsupported);
  }
  SECTION("query heads not a multiple of KV heads") {
    args.problem.num_qo_heads = 12;
    CHECK(make_decode_plan(args).status().code() == StatusCode::unsupported);
  }
  SECTION("too many query rows per KV head for one block") {
    args.problem.kv_dtype = KvDtype::bf16;
    args.problem.head_dim = 256;  // 32 lanes per vector
    args.problem.num_qo_heads = 64;  // group of 8
    args.problem.query_tokens = 8;  // 64 rows -> 2048 threads
    auto status = make_decode_plan(args).status();
    CHECK(status.code() == StatusCode::unsupported);
    CHECK(status.message().find("2048 threads") != std::string_view::npos);
  }
  SECTION("query_tokens out of range") {
    args.problem.query_tokens = 0;
    CHECK(make_decode_plan(args).status().code() == StatusCode::unsupported);
  }
}

TEST_CASE("decode block shape", "[attention][plan]") {
  DecodeProblem p = problem(1);
  auto shape = decode_block_shape(p);  // fp8, D=128: 8 lanes x 4 rows -> 4 token groups
  CHECK(shape.lanes == 8);
  CHECK(shape.rows == 4);
  CHECK(shape.threads() == 128);
  p.kv_dtype = KvDtype::bf16;
  p.head_dim = 256;
  p.num_qo_heads = 48;  // group 6 -> padded to 8
  shape = decode_block_shape(p);
  CHECK(shape.lanes == 32);
  CHECK(shape.padded_rows == 8);
  CHECK(shape.token_groups == 1);
  CHECK(shape.threads() == 256);
}
