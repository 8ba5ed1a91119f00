// num_sms 0 means "the current device" in every plan-sizing call, as the headers say: the
// workspace bounds and size queries of paged attention and MLA decode ask the device once
// (the emulator answers rt::emulated_sm_count) and give exactly what an explicit count gives,
// and the plans made with num_sms 0 fit them. The shapes are chosen so that the bound depends
// on the SM count (a short batch that the plan would split across the device).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "slimserve/attention/mla.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/runtime/memory.hpp"

using namespace slimserve;
using namespace slimserve::attention;

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

  auto bound = [&](std::int32_t num_sms) {
    return paged_attention_workspace_bound(PagedAttentionWorkspaceBound{p, 2, 4000, num_sms, 2});
  };
  auto device = bound(0);
  REQUIRE(device.ok());
  auto explicit_count = bound(sms);
  REQUIRE(explicit_count.ok());
  CHECK(*device == *explicit_count);
  auto other = bound(sms + 100);
  REQUIRE(other.ok());
  CHECK(*other != *device);  // the bound depends on the count: the check above can fail

  auto negative = bound(-1);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().code() == StatusCode::invalid_argument);
  CHECK(negative.status().message().find("num_sms") != std::string::npos);

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
  CHECK(*size <= *device);

  args.num_sms = 0;
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*size);
  REQUIRE(workspace.ok());
  auto plan = plan_paged_attention(args, workspace->data(), *size, nullptr);
  REQUIRE(plan.ok());
  CHECK(plan->layout.total_bytes == *size);
  CHECK(plan->split_kv);
}

TEST_CASE("MLA decode: workspace bound and size query with num_sms 0", "[attention][mla][plan]") {
  const std::int32_t sms = *rt::current_device_sm_count();
  MlaDecodeProblem p;
  p.batch_size = 1;
  p.num_heads = 16;
  p.query_tokens = 1;
  p.page_size = 64;
  p.kv_dtype = KvDtype::bf16;

  auto device = mla_decode_workspace_bound(MlaDecodeWorkspaceBound{p, 0, 1});
  REQUIRE(device.ok());
  auto explicit_count = mla_decode_workspace_bound(MlaDecodeWorkspaceBound{p, sms, 1});
  REQUIRE(explicit_count.ok());
  CHECK(*device == *explicit_count);
  auto other = mla_decode_workspace_bound(MlaDecodeWorkspaceBound{p, sms + 100, 1});
  REQUIRE(other.ok());
  CHECK(*other != *device);
  auto negative = mla_decode_workspace_bound(MlaDecodeWorkspaceBound{p, -3, 1});
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().message().find("num_sms") != std::string::npos);

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
  CHECK(*size <= *device);

  args.num_sms = 0;
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*size);
  REQUIRE(workspace.ok());
  auto plan = plan_mla_decode(args, workspace->data(), *size, nullptr);
  REQUIRE(plan.ok());
  CHECK(plan->layout.total_bytes == *size);
  CHECK(plan->split_kv);
}
