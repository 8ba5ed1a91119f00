// slimserve_quantize_int4: quantizes a Hugging Face model folder to INT4 and writes a model
// folder that vLLM and SGLang load (compressed-tensors pack-quantized, or GPTQ). See
// --help and docs/int4.md ("Quantize a model for vLLM/SGLang").
//
// Flow: open the input header-only (model_folder), decide every tensor's fate and every
// output tensor's shape (plan), create the output shards with their final headers, then
// let J workers take one tensor (or one expert of a stacked MoE tensor) at a time, convert
// it (convert) and write it in place. The folder is built under OUT.partial and renamed to
// OUT only when complete, so a failed run never leaves a half-written model behind.

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "convert.hpp"
#include "model_folder.hpp"
#include "options.hpp"
#include "output_folder.hpp"
#include "plan.hpp"
#include "progress.hpp"

namespace fs = std::filesystem;
using namespace quantize_tool;

namespace {

struct WorkItem {
  const Unit* unit;
  std::int64_t expert;  ///< -1 unless the unit is a stacked expert tensor
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

slimserve::Status run_all(const ModelFolder& model, const Options& options, const Plan& plan, OutputShards& out,
                          ErrorStats* errors) {
  std::vector<WorkItem> items;
  for (const Unit& unit : plan.units) {
    if (unit.action == Action::quantize_experts) {
      for (std::int64_t e = 0; e < unit.experts; ++e) items.push_back({&unit, e});
    } else {
      items.push_back({&unit, -1});
    }
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int jobs = std::max(1, std::min<int>(options.jobs > 0 ? options.jobs : cores, static_cast<int>(items.size())));
  const int threads_per_job = std::max(1, cores / jobs);  // a single huge tensor still uses every core

  Progress progress(options.progress, items.size(), plan.source_bytes);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  slimserve::Status first_error = slimserve::Status::success();
  std::mutex error_mutex;
  auto worker = [&] {
    while (!failed.load()) {
      const std::size_t i = next.fetch_add(1);
      if (i >= items.size()) return;
      const WorkItem& item = items[i];
      slimserve::Status status = run_unit(model, options, *item.unit, item.expert, threads_per_job, out, errors);
      if (!status.ok()) {
        std::lock_guard lock(error_mutex);
        if (!failed.exchange(true)) first_error = status;
        return;
      }
      const std::uint64_t bytes = item.expert >= 0 ? item.unit->source_bytes / static_cast<std::uint64_t>(item.unit->experts)
                                                   : item.unit->source_bytes;
      progress.add(bytes, 1);
    }
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  return first_error;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  bool wants_help = false;
  if (const std::string error = parse_options(argc, argv, options, wants_help); !error.empty()) {
    std::fprintf(stderr, "error: %s\n%s", error.c_str(), "usage: slimserve_quantize_int4 IN_MODEL_DIR OUT_MODEL_DIR [options]  (--help for more)\n");
    return 2;
  }
  if (wants_help) {
    std::fputs(help_text(), stdout);
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  const fs::path output(options.output);
  std::error_code fs_error;
  if (fs::exists(output) && !options.overwrite) {
    return fail("'" + options.output + "' exists; pass --overwrite to replace it");
  }
  auto model = ModelFolder::open(options.input);
  if (!model.ok()) return fail(model.status().to_string());
  auto plan = make_plan(**model, options);
  if (!plan.ok()) return fail(plan.status().to_string());

  const fs::path partial = output.string() + ".partial";
  fs::remove_all(partial, fs_error);
  fs::create_directories(partial, fs_error);
  if (fs_error) return fail("cannot create '" + partial.string() + "': " + fs_error.message());
  auto abandon = [&](const std::string& message) {
    fs::remove_all(partial, fs_error);
    return fail(message);
  };

  auto shards = OutputShards::create(partial.string(), plan->outputs, options.max_shard_bytes);
  if (!shards.ok()) return abandon(shards.status().to_string());
  ErrorStats errors;
  if (auto status = run_all(**model, options, *plan, **shards, options.measure_error ? &errors : nullptr); !status.ok()) {
    return abandon(status.to_string());
  }
  if (auto status = (*shards)->finish(); !status.ok()) return abandon(status.to_string());
  if (auto status = write_side_files(**model, options, *plan, (*shards)->weight_map(), (*shards)->total_tensor_bytes(),
                                     partial.string());
      !status.ok()) {
    return abandon(status.to_string());
  }
  if (fs::exists(output)) fs::remove_all(output, fs_error);
  fs::rename(partial, output, fs_error);
  if (fs_error) return abandon("cannot move the result to '" + options.output + "': " + fs_error.message());

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  if (errors.count > 0) {
    std::printf("relative error: mean %.4e, max %.4e over %zu tensors\n",
                errors.sum_relative / static_cast<double>(errors.count), errors.max_relative, errors.count);
  }
  std::printf("quantized %zu modules, left %zu in higher precision; read %.3f GB, wrote %.3f GB in %.2f s "
              "(%.2f GB/s read); peak RSS %.1f MB -> %s\n",
              plan->quantized_modules.size(), plan->ignored_modules.size(), static_cast<double>(plan->source_bytes) / 1e9,
              static_cast<double>((*shards)->total_tensor_bytes()) / 1e9, seconds,
              seconds > 0 ? static_cast<double>(plan->source_bytes) / seconds / 1e9 : 0.0,
              static_cast<double>(usage.ru_maxrss) / 1024.0, options.output.c_str());
  return 0;
}
