#pragma once
/// \file
/// \brief What the emulator keeps per emulated CUDA thread and per warp.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/emu/fiber.hpp"
#include "slimserve/emu/sanitizer_hooks.hpp"
#include "slimserve/emu/vector_types.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

inline constexpr unsigned warp_size = 32;
inline constexpr unsigned max_threads_per_block = 1024;
/// Hopper's per-block shared memory limit (227 KB); larger launches are refused.
inline constexpr std::size_t max_shared_memory_bytes = 227 * 1024;

/// Where a kernel called a synchronisation primitive: for the divergence check and messages.
struct CallSite {
  const char* what = "";
  const char* file = "";
  int line = 0;
  bool same_place(const CallSite& other) const noexcept {
    return line == other.line && std::strcmp(file, other.file) == 0;
  }
};

enum class ThreadState : std::uint8_t {
  running,
  at_barrier,
  at_warp_op,
  at_warpgroup_op,
  yielded,
  exited,
  failed
};

class WarpGroup;
/// Computes every lane's result of one warp operation once all lanes of its mask arrived.
using WarpCombine = void (*)(WarpGroup&);
class WarpgroupView;
/// Computes every thread's result of one warpgroup operation once all 128 threads arrived.
using WarpgroupCombine = void (*)(WarpgroupView&);

/// A warpgroup: 4 consecutive warps whose first warp index is a multiple of 4 (sm_90 wgmma).
inline constexpr unsigned warpgroup_size = 128;

inline constexpr int warp_payload_words = 6;  // mma: A (2 words), B (1), C (2)
/// mma: D (4 floats); ldmatrix.x4: 4 registers; wgmma: the quad's A registers (8 words).
inline constexpr int warp_result_words = 8;

/// One in-flight cp.async copy (16 bytes), completed by cp_async_wait.
struct AsyncCopy {
  void* destination = nullptr;
  const void* source = nullptr;
  bool zero_fill = false;
  std::uint64_t group = 0;  // 0: not committed yet; otherwise the commit number
  unsigned bytes = 16;      // 4, 8 or 16
};
struct AsyncCopyQueue {
  std::vector<AsyncCopy> copies;  // oldest first
  std::uint64_t committed_groups = 0;
  std::uint64_t completed_groups = 0;
  void reset() noexcept {
    copies.clear();
    committed_groups = 0;
    completed_groups = 0;
  }
};

/// One wgmma.mma_async issued by this thread and not yet retired by wgmma.wait_group
/// (arch/wgmma.cuh). Shared operands are read when it retires; see emu/wgmma.hpp.
struct WgmmaOp {
  float* accumulator = nullptr;  // the thread's N/2 accumulator registers
  unsigned n = 0;
  unsigned input = 0;            // MmaInput
  bool a_in_registers = false;
  bool a_mn_major = false;       // imm-trans-a
  bool b_mn_major = false;       // imm-trans-b
  bool scale_d = true;           // D = A*B + D (true) or D = A*B (false)
  bool has_c = false;            // c holds the input accumulator (else it is still in flight)
  std::uint64_t desc_a = 0;
  std::uint64_t desc_b = 0;
  std::uint16_t a_rows[2][16] = {};  // A from registers: rows g and g+8 of the warp's 16
  std::vector<float> c;              // N/2 input accumulator values
  std::uint64_t group = 0;           // 0: not committed yet; otherwise the commit number
};
struct WgmmaQueue {
  std::vector<WgmmaOp> ops;  // oldest first
  std::uint64_t committed_groups = 0;
  std::uint64_t completed_groups = 0;
  bool fenced = false;  // a wgmma.fence since the start or the last wgmma.wait_group
  void reset() noexcept {
    ops.clear();
    committed_groups = 0;
    completed_groups = 0;
    fenced = false;
  }
};

struct LaunchState;
struct WarpState;

/// One emulated CUDA thread: a fiber plus its identity and its mailbox to the scheduler.
/// Fields written by one side and read by the other go through relaxed_load/relaxed_store.
struct EmulatedThread {
  // Identity, written by the scheduler before the block starts.
  uint3 thread_idx{};
  unsigned linear = 0;
  unsigned warp = 0;
  unsigned lane = 0;
  LaunchState* launch = nullptr;
  WarpState* warp_state = nullptr;

  unsigned pool_index = 0;  // the slot always runs the block's thread of this linear index
  FiberContext context;
  FiberStack stack;
  bool needs_fresh_fiber = true;  // never started, or abandoned mid-kernel

  // Mailbox: the fiber's request when it yields, and the scheduler's answer.
  ThreadState state = ThreadState::running;
  CallSite site;
  unsigned barrier_predicate = 0;
  unsigned warp_mask = 0;
  WarpCombine combine = nullptr;
  WarpgroupCombine warpgroup_combine = nullptr;
  std::uint64_t payload[warp_payload_words] = {};
  std::uint64_t result[warp_result_words] = {};
  std::string error;  // written by a failing fiber right before its last switch

  AsyncCopyQueue async_copies;  // cp.async emulation (arch/cp_async.cuh)
  WgmmaQueue wgmma;             // wgmma emulation (arch/wgmma.cuh)
  unsigned atomics_since_yield = 0;  // a spin loop on atomics yields now and then

  void post_site(const CallSite& where) noexcept {
    relaxed_store(site.what, where.what);
    relaxed_store(site.file, where.file);
    relaxed_store(site.line, where.line);
  }
  CallSite posted_site() const noexcept {
    return CallSite{relaxed_load(site.what), relaxed_load(site.file), relaxed_load(site.line)};
  }
};

/// Per warp: which lanes exist and have exited, and warp operations waiting for lanes.
struct PendingWarpOp {
  unsigned mask = 0;
  unsigned arrived = 0;
  WarpCombine combine = nullptr;
  EmulatedThread* first = nullptr;  // for messages
};
struct WarpState {
  EmulatedThread* lanes[warp_size] = {};
  unsigned present = 0;  // lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;
  std::vector<PendingWarpOp> pending;
  int sync_object = 0;  // TSan: __syncwarp's happens-before edges
};

/// A warp operation whose lanes have all arrived: lanes read payloads, write results.
class WarpGroup {
 public:
  WarpGroup(WarpState& warp, unsigned mask) : warp_(warp), mask_(mask) {}
  unsigned mask() const noexcept { return mask_; }
  bool contains(unsigned lane) const noexcept { return lane < warp_size && (mask_ >> lane & 1u); }
  std::uint64_t payload(unsigned lane, int word) const noexcept {
    return relaxed_load(warp_.lanes[lane]->payload[word]);
  }
  void set_result(unsigned lane, int word, std::uint64_t value) noexcept {
    relaxed_store(warp_.lanes[lane]->result[word], value);
  }
  /// Reports a broken contract on behalf of `lane` (the first report wins).
  void fail(unsigned lane, std::string message) {
    if (failed_lane_ < 0) {
      failed_lane_ = static_cast<int>(lane);
      error_ = std::move(message);
    }
  }
  int failed_lane() const noexcept { return failed_lane_; }
  const std::string& error() const noexcept { return error_; }

 private:
  WarpState& warp_;
  unsigned mask_;
  int failed_lane_ = -1;
  std::string error_;
};

/// A warpgroup operation whose 128 threads have all arrived (index 0..127 within the group).
class WarpgroupView {
 public:
  explicit WarpgroupView(EmulatedThread* const* threads) : threads_(threads) {}
  const EmulatedThread& thread(unsigned index) const noexcept { return *threads_[index]; }
  std::uint64_t payload(unsigned index, int word) const noexcept {
    return relaxed_load(threads_[index]->payload[word]);
  }
  void set_result(unsigned index, int word, std::uint64_t value) noexcept {
    relaxed_store(threads_[index]->result[word], value);
  }
  /// Reports a broken contract on behalf of thread `index` (the first report wins).
  void fail(unsigned index, std::string message) {
    if (failed_ < 0) {
      failed_ = static_cast<int>(index);
      error_ = std::move(message);
    }
  }
  int failed_index() const noexcept { return failed_; }
  const std::string& error() const noexcept { return error_; }

 private:
  EmulatedThread* const* threads_;
  int failed_ = -1;
  std::string error_;
};

/// What every emulated thread of the running launch can see.
struct LaunchState {
  dim3 grid_dim;
  dim3 block_dim;
  uint3 block_idx{};
  unsigned char* dynamic_smem = nullptr;
  std::size_t dynamic_smem_bytes = 0;
  void (*run_kernel)(const void*) = nullptr;  // calls the kernel with its bound arguments
  const void* bound_kernel = nullptr;
};

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
