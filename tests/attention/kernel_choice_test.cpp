// The plan's choice between the tensor-core kernel and the CUDA-core decode kernel is the one
// that runs: where the plan picks the CUDA-core kernel (decode, GQA <= 2, 16-bit cache, a
// batch that fills the device), run_paged_attention's outputs are bit for bit those of
// run_decode, and differ from the tensor-core kernel's (so the comparison can fail); where
// the plan cannot keep it, it says why and the tensor-core kernel runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/paged_attention.hpp"

using namespace attn_test;

namespace {

struct ChoiceRun {
  std::vector<std::uint16_t> o;
  std::vector<float> lse;
};

}  // namespace

TEST_CASE("kernel choice: the CUDA-core decode kernel runs where the plan picks it", "[attention][choice]") {
  auto rng = slimserve_test::make_rng(1201);
  const std::vector<std::int64_t> lengths{1, 15, 16, 17, 300, 64};
  const HostPageTable table = make_page_table(lengths, 16, rng, true);
  const int kv_heads = 2, group = 2, head_dim = 128;
  HostCache host(CacheShape{KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, table.num_pages, 16, kv_heads, head_dim});
  std::vector<float> row(head_dim);
  for (int page = 0; page < table.num_pages; ++page) {
    for (int slot = 0; slot < 16; ++slot) {
      for (int h = 0; h < kv_heads; ++h) {
        realistic_row(rng, head_dim, row.data(), 1.0f);
        host.store(false, page, slot, h, row.data());
        realistic_row(rng, head_dim, row.data(), 0.5f);
        host.store(true, page, slot, h, row.data());
      }
    }
  }
  const auto batch = static_cast<std::int32_t>(lengths.size());
  std::vector<std::int32_t> qo_indptr;
  for (std::int32_t b = 0; b <= batch; ++b) qo_indptr.push_back(b);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> q_bits(static_cast<std::size_t>(batch * kv_heads * group * head_dim));
  for (auto& bits : q_bits) bits = to_activation(ActivationDtype::bf16, normal(rng));

  DeviceCache cache(host);
  auto indptr = upload(table.indptr);
  auto indices = upload(table.indices);
  auto last = upload(table.last_page_len);
  auto qo = upload(qo_indptr);
  auto q = upload(q_bits);
  const kv::PageTableView view{indptr.data(), indices.data(), last.data(), nullptr, batch, 16};

  PagedAttentionProblem problem;
  problem.batch_size = batch;
  problem.num_qo_heads = kv_heads * group;
  problem.num_kv_heads = kv_heads;
  problem.head_dim = head_dim;
  problem.page_size = 16;
  problem.kv_dtype = KvDtype::bf16;
  problem.q_dtype = ActivationDtype::bf16;
  PagedAttentionPlanArguments plan_args{problem, qo_indptr, table.indptr, table.last_page_len};
  plan_args.num_sms = 4;  // batch x KV heads = 12 CTAs fill it unsplit
  plan_args.ctas_per_sm = 1;

  const auto paged = [&](bool tensor_core_only) {
    auto bytes = paged_attention_workspace_size(plan_args);
    REQUIRE(bytes.ok());
    auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
    REQUIRE(workspace.ok());
    auto plan = plan_paged_attention(plan_args, workspace->data(), *bytes, nullptr);
    REQUIRE(plan.ok());
    auto o = rt::DeviceBuffer<std::uint16_t>::create(q_bits.size());
    auto lse = rt::DeviceBuffer<float>::create(q_bits.size() / head_dim);
    REQUIRE(o.ok());
    REQUIRE(lse.ok());
    REQUIRE(o->fill_bytes(0xFF).ok());
    REQUIRE(lse->fill_bytes(0xFF).ok());
    PagedAttentionArguments args;
    args.cache = cache.view;
    args.table = view;
    args.qo_indptr = qo.data();
    args.q = q.data();
    args.o = o->data();
    args.lse = lse->data();
    // A window longer than any request changes nothing but needs the tensor-core kernel.
    if (tensor_core_only) args.window_left = 1 << 20;
    CHECK(kernel_for_run(args, *plan) == (tensor_core_only ? AttentionKernel::tensor_core : plan->choice.kernel));
    const Status s = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr);
    INFO(s.to_string());
    REQUIRE(s.ok());
    return std::pair{*plan, ChoiceRun{download(*o, q_bits.size()), download(*lse, q_bits.size() / head_dim)}};
  };

  const auto [plan, chosen] = paged(false);
  INFO(plan.choice.reason);
  REQUIRE(plan.choice.kernel == AttentionKernel::cuda_core);
  REQUIRE(plan.decode.has_value());
  std::printf("  plan: %s\n", plan.choice.reason.c_str());

  // The CUDA-core decode kernel run directly, unsplit as in the plan.
  DecodePlanArguments decode_args{DecodeProblem{batch, kv_heads * group, kv_heads, head_dim, 16, 1, KvDtype::bf16},
                                  table.indptr, table.last_page_len, 4, 512, false};
  auto decode_bytes = decode_workspace_size(decode_args);
  REQUIRE(decode_bytes.ok());
  auto decode_workspace = rt::DeviceBuffer<unsigned char>::create(*decode_bytes);
  REQUIRE(decode_workspace.ok());
  auto decode_plan = plan_decode(decode_args, decode_workspace->data(), *decode_bytes, nullptr);
  REQUIRE(decode_plan.ok());
  auto o = rt::DeviceBuffer<std::uint16_t>::create(q_bits.size());
  auto lse = rt::DeviceBuffer<float>::create(q_bits.size() / head_dim);
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  DecodeArguments d;
  d.cache = cache.view;
  d.table = view;
  d.q = q.data();
  d.o = o->data();
  d.lse = lse->data();
  d.q_dtype = ActivationDtype::bf16;
  d.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  REQUIRE(run_decode(d, *decode_plan, decode_workspace->data(), *decode_bytes, nullptr).ok());
  const ChoiceRun direct{download(*o, q_bits.size()), download(*lse, q_bits.size() / head_dim)};
  CHECK(chosen.o == direct.o);
  CHECK(std::memcmp(chosen.lse.data(), direct.lse.data(), chosen.lse.size() * sizeof(float)) == 0);

  // The tensor-core kernel rounds P to bf16: its bits differ somewhere.
  const auto [tc_plan, tensor_core] = paged(true);
  CHECK((tensor_core.o != direct.o ||
         std::memcmp(tensor_core.lse.data(), direct.lse.data(), direct.lse.size() * sizeof(float)) != 0));
}

TEST_CASE("kernel choice: where the plan keeps the tensor-core kernel, it says why", "[attention][choice]") {
  PagedAttentionProblem p;
  p.batch_size = 3;
  p.num_qo_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::bf16;
  const std::vector<std::int32_t> kv_indptr{0, 1, 3, 5}, last{16, 3, 8};
  const std::vector<std::int32_t> uniform{0, 1, 2, 3}, ragged{0, 1, 3, 4};
  PagedAttentionPlanArguments args{p, uniform, kv_indptr, last};
  args.num_sms = 4;
  auto cuda_core = make_paged_attention_plan(args);
  REQUIRE(cuda_core.ok());
  CHECK(cuda_core->choice.kernel == AttentionKernel::cuda_core);
  CHECK(cuda_core->decode.has_value());
  CHECK(cuda_core->layout.total_bytes >= cuda_core->decode_offset + cuda_core->decode->layout.total_bytes);
  // The workspace bound covers the plan with the decode schedule.
  auto bound = paged_attention_workspace_bound(PagedAttentionWorkspaceBound{p, 3, 80, 4, 2});
  REQUIRE(bound.ok());
  CHECK(cuda_core->layout.total_bytes <= *bound);

  args.num_sms = 132;  // 6 CTAs on 132 SMs: the tensor-core kernel splits the KV
  auto idle = make_paged_attention_plan(args);
  REQUIRE(idle.ok());
  CHECK(idle->choice.kernel == AttentionKernel::tensor_core);
  CHECK(idle->choice.reason.find("idle") != std::string::npos);
  CHECK_FALSE(idle->decode.has_value());

  args.num_sms = 4;
  p.num_qo_heads = 2;  // GQA 1: 2 query rows per KV head even with 2 tokens
  args.problem = p;
  args.qo_indptr_host = ragged;
  auto ragged_plan = make_paged_attention_plan(args);
  REQUIRE(ragged_plan.ok());
  CHECK(ragged_plan->choice.kernel == AttentionKernel::tensor_core);
  CHECK(ragged_plan->choice.reason.find("qo_len") != std::string::npos);

  args.qo_indptr_host = uniform;
  p.num_qo_heads = 4;
  p.kv_dtype = KvDtype::fp8_e4m3;  // FP8: the tensor-core kernel always
  args.problem = p;
  auto fp8 = make_paged_attention_plan(args);
  REQUIRE(fp8.ok());
  CHECK(fp8->choice.kernel == AttentionKernel::tensor_core);
  p.kv_dtype = KvDtype::bf16;
  p.num_qo_heads = 16;  // GQA 8
  args.problem = p;
  auto gqa8 = make_paged_attention_plan(args);
  REQUIRE(gqa8.ok());
  CHECK(gqa8->choice.kernel == AttentionKernel::tensor_core);
}
