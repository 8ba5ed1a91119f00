// num_sms 0 means "the current device" in every plan-sizing call, as the headers say: the
// workspace bounds and size queries of paged attention and MLA decode ask the device once
// (the emulator answers rt::emulated_sm_count) and give exactly what an explicit count gives,
// and the plans made with num_sms 0 fit them. The shapes are chosen so that the bound depends
// on the SM count (a short batch that the plan would split across the device).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "slimserve/attention/mla.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/runtime/memory.hpp"

using namespace slimserve;
using namespace slimserve::attention;

namespace {

/// bound(n) is a workspace bound computed for n SMs. 0 must give what the device's own count
/// gives; another count must give another bound (so that check can fail); a negative count is
/// refused, naming num_sms. Returns the device's bound.
template <class Bound>
std::size_t check_bound_follows_device(const Bound& bound, std::int32_t device_sms) {
  auto device = bound(0);
  REQUIRE(device.ok());
  auto explicit_count = bound(device_sms);
  REQUIRE(explicit_count.ok());
  CHECK(*device == *explicit_count);
  auto other = bound(device_sms + 100);
  REQUIRE(other.ok());
  CHECK(*other != *device);
  auto negative = bound(-1);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().code() == StatusCode::invalid_argument);
  CHECK(negative.status().message().find("num_sms") != std::string::npos);
  return *device;
}

}  // namespace

TEST_CASE("num_sms 0: the current device's SM count", "[attention][plan]") {
  auto sms = rt::current_device_sm_count();
  REQUIRE(sms.ok());
#if defined(SLIMSERVE_EMULATE)
  CHECK(*sms == rt::emulated_sm_count);
#endif
  CHECK(*sms >= 1);
}

TEST_CASE("paged attention: workspace bound and size query with num_sms 0", "[attention][plan]") {
  const std::int32_t sms = *rt::current_device_sm_count();
  PagedAttentionProblem p;
  p.batch_size = 2;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::fp8_e4m3;

  const std::size_t device = check_bound_follows_device(
      [&](std::int32_t num_sms) {
        return paged_attention_workspace_bound(PagedAttentionWorkspaceBound{p, 2, 4000, num_sms, 2});
      },
      sms);

  // Two decode requests of 2000 and 1 tokens: the plan splits the long one over the device.
  const std::vector<std::int32_t> qo_indptr{0, 1, 2}, seq_lens{2000, 1};
  PagedAttentionPlanArguments args;
  args.problem = p;
  args.qo_indptr_host = qo_indptr;
  args.seq_lens_host = seq_lens;
  args.min_chunk_tokens = 16;
  args.num_sms = 0;
  auto size = paged_attention_workspace_size(args);
  REQUIRE(size.ok());
  args.num_sms = sms;
  auto size_explicit = paged_attention_workspace_size(args);
  REQUIRE(size_explicit.ok());
  CHECK(*size == *size_explicit);
  CHECK(*size <= device);

  args.num_sms = 0;
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*size);
  REQUIRE(workspace.ok());
  auto plan = plan_paged_attention(args, workspace->data(), *size, nullptr);
  REQUIRE(plan.ok());
  CHECK(plan->layout.total_bytes == *size);
  CHECK(plan->workspace_bytes() == *size);
  CHECK(plan->split_kv);

  // The host-only planner cannot ask the device: 0 is refused with what to do instead.
  args.num_sms = 0;
  auto unresolved = make_paged_attention_plan(args);
  REQUIRE_FALSE(unresolved.ok());
  CHECK(unresolved.status().code() == StatusCode::invalid_argument);
  CHECK(unresolved.status().message().find("plan_paged_attention") != std::string::npos);
  args.num_sms = sms;
  CHECK(make_paged_attention_plan(args).ok());
}

TEST_CASE("MLA decode: workspace bound and size query with num_sms 0", "[attention][mla][plan]") {
  const std::int32_t sms = *rt::current_device_sm_count();
  MlaDecodeProblem p;
  p.batch_size = 1;
  p.num_heads = 16;
  p.query_tokens = 1;
  p.page_size = 64;
  p.kv_dtype = KvDtype::bf16;

  const std::size_t device = check_bound_follows_device(
      [&](std::int32_t num_sms) { return mla_decode_workspace_bound(MlaDecodeWorkspaceBound{p, num_sms, 1}); },
      sms);

  const std::vector<std::int32_t> seq_lens{3000};
  MlaDecodePlanArguments args;
  args.problem = p;
  args.seq_lens_host = seq_lens;
  args.min_chunk_tokens = 64;
  auto size = mla_decode_workspace_size(args);
  REQUIRE(size.ok());
  args.num_sms = sms;
  auto size_explicit = mla_decode_workspace_size(args);
  REQUIRE(size_explicit.ok());
  CHECK(*size == *size_explicit);
  CHECK(*size <= device);

  args.num_sms = 0;
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*size);
  REQUIRE(workspace.ok());
  auto plan = plan_mla_decode(args, workspace->data(), *size, nullptr);
  REQUIRE(plan.ok());
  CHECK(plan->layout.total_bytes == *size);
  CHECK(plan->split_kv);
}
