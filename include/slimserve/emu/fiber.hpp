#pragma once
/// \file
/// \brief Fibers for the emulator: a stack, a saved context and a cheap switch.
///
/// On x86-64 the switch is a few pushes and pops (no system call, unlike swapcontext); other
/// targets fall back to ucontext. Each switch is announced to TSan (fibers) and ASan (stack
/// bounds), see sanitizer_hooks.hpp.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "slimserve/config.hpp"
#include "slimserve/emu/sanitizer_hooks.hpp"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__x86_64__)
// Defined as a weak symbol in every translation unit that includes this header, so no
// source file has to own it. Saves the callee-saved registers, MXCSR and the x87 control
// word on the current stack, stores the stack pointer in *save_sp, and resumes new_sp.
//   void slimserve_emu_switch_context_v1(void** save_sp, void* new_sp);
// A new fiber starts in slimserve_emu_fiber_start_v1, which calls r13(r12) and never returns.
__asm__(
    ".text\n"
    ".weak slimserve_emu_switch_context_v1\n"
    ".type slimserve_emu_switch_context_v1, @function\n"
    "slimserve_emu_switch_context_v1:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $8, %rsp\n"
    "  stmxcsr (%rsp)\n"
    "  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n"
    "  fldcw 4(%rsp)\n"
    "  addq $8, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size slimserve_emu_switch_context_v1, .-slimserve_emu_switch_context_v1\n"
    ".weak slimserve_emu_fiber_start_v1\n"
    ".type slimserve_emu_fiber_start_v1, @function\n"
    "slimserve_emu_fiber_start_v1:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size slimserve_emu_fiber_start_v1, .-slimserve_emu_fiber_start_v1\n"
    ".previous\n");
extern "C" void slimserve_emu_switch_context_v1(void** save_sp, void* new_sp);
extern "C" void slimserve_emu_fiber_start_v1();
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// Bytes of stack per emulated thread; sanitizers need much more (redzones, shadow frames).
#if defined(SLIMSERVE_EMU_ASAN) || defined(SLIMSERVE_EMU_TSAN)
inline constexpr std::size_t fiber_stack_bytes = 512 * 1024;
#else
inline constexpr std::size_t fiber_stack_bytes = 128 * 1024;
#endif

/// A saved execution context: the scheduler's own (the launching thread) or a fiber's.
struct FiberContext {
#if defined(__x86_64__)
  void* stack_pointer = nullptr;
#else
  ucontext_t context{};
  void (*start_entry)(void*) = nullptr;  // set until the fiber first runs
  void* start_argument = nullptr;
#endif
#if defined(SLIMSERVE_EMU_TSAN)
  void* tsan_fiber = nullptr;
#endif
#if defined(SLIMSERVE_EMU_ASAN)
  void* asan_fake_stack = nullptr;
#endif
  const void* stack_bottom = nullptr;  // lowest usable address; null for the launching thread
  std::size_t stack_size = 0;
};

#if !defined(__x86_64__)
// makecontext passes only int arguments: a new fiber finds its entry through this slot.
inline FiberContext*& pending_start() noexcept {
  static thread_local FiberContext* context = nullptr;
  return context;
}
inline void ucontext_trampoline() {
  FiberContext* context = pending_start();
  auto entry = context->start_entry;
  void* argument = context->start_argument;
  context->start_entry = nullptr;
  entry(argument);
  std::abort();
}
#endif

/// Whether a switch publishes the switching fiber's memory effects to the target (TSan).
enum class SwitchSync : bool { none, publish };

/// Suspends `from` and resumes `to`. Returns when something switches back to `from`.
inline void switch_context(FiberContext& from, FiberContext& to, SwitchSync sync) noexcept {
#if defined(__x86_64__)
  void* const target_stack_pointer = to.stack_pointer;  // read before TSan switches fibers
#endif
#if defined(SLIMSERVE_EMU_TSAN)
  __tsan_switch_to_fiber(to.tsan_fiber, sync == SwitchSync::publish
                                            ? 0u
                                            : static_cast<unsigned>(__tsan_switch_to_fiber_no_sync));
#else
  (void)sync;
#endif
#if defined(SLIMSERVE_EMU_ASAN)
  __sanitizer_start_switch_fiber(&from.asan_fake_stack, to.stack_bottom, to.stack_size);
#endif
#if defined(__x86_64__)
  slimserve_emu_switch_context_v1(&from.stack_pointer, target_stack_pointer);
#else
  if (to.start_entry != nullptr) {
    pending_start() = &to;
  }
  swapcontext(&from.context, &to.context);
#endif
#if defined(SLIMSERVE_EMU_ASAN)
  // Whoever resumed us is `to` (fibers only ever switch with the scheduler); this also
  // teaches a fiber the launching thread's stack bounds.
  const void* resumer_bottom = nullptr;
  std::size_t resumer_size = 0;
  __sanitizer_finish_switch_fiber(from.asan_fake_stack, &resumer_bottom, &resumer_size);
  if (to.stack_bottom == nullptr) {
    to.stack_bottom = resumer_bottom;
    to.stack_size = resumer_size;
  }
#endif
}

/// Must be the first thing a new fiber does (ASan: completes the switch that started it).
inline void fiber_started(FiberContext& self, FiberContext& scheduler) noexcept {
#if defined(SLIMSERVE_EMU_ASAN)
  const void* resumer_bottom = nullptr;
  std::size_t resumer_size = 0;
  __sanitizer_finish_switch_fiber(nullptr, &resumer_bottom, &resumer_size);
  if (scheduler.stack_bottom == nullptr) {
    scheduler.stack_bottom = resumer_bottom;
    scheduler.stack_size = resumer_size;
  }
#else
  (void)scheduler;
#endif
  (void)self;
}

/// An mmap'ed fiber stack with a PROT_NONE guard page below it (overflow faults at once).
class FiberStack {
 public:
  FiberStack() = default;
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  ~FiberStack() {
    if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
  }

  bool allocate(std::size_t usable_bytes) noexcept {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    usable_bytes = (usable_bytes + page - 1) / page * page;
    mapping_bytes_ = usable_bytes + page;
    void* mapping = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) return false;
    mapping_ = mapping;
    mprotect(mapping_, page, PROT_NONE);
    bottom_ = static_cast<unsigned char*>(mapping_) + page;
    size_ = usable_bytes;
    return true;
  }
  unsigned char* bottom() const noexcept { return bottom_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  unsigned char* bottom_ = nullptr;
  std::size_t size_ = 0;
};

using FiberEntry = void (*)(void*);

/// Prepares `context` so that the first switch to it calls entry(argument) on `stack`.
/// The entry function must never return.
inline void make_fiber_context(FiberContext& context, FiberStack& stack, FiberEntry entry,
                               void* argument) noexcept {
#if defined(SLIMSERVE_EMU_ASAN)
  // A fiber abandoned mid-kernel leaves poisoned redzones behind; start from a clean stack.
  __asan_unpoison_memory_region(stack.bottom(), stack.size());
  context.asan_fake_stack = nullptr;
#endif
  context.stack_bottom = stack.bottom();
  context.stack_size = stack.size();
#if defined(__x86_64__)
  // Frame popped by the switch: [mxcsr|fpucw][r15][r14][r13][r12][rbx][rbp][return address].
  auto top = reinterpret_cast<std::uintptr_t>(stack.bottom() + stack.size()) & ~std::uintptr_t{15};
  auto* frame = reinterpret_cast<std::uint64_t*>(top - 80);  // 16-byte aligned after `ret`
  frame[0] = 0x037Full << 32 | 0x1F80u;                      // default FPU control, MXCSR
  frame[1] = 0;                                              // r15
  frame[2] = 0;                                              // r14
  frame[3] = reinterpret_cast<std::uint64_t>(entry);         // r13: function to call
  frame[4] = reinterpret_cast<std::uint64_t>(argument);      // r12: its argument
  frame[5] = 0;                                              // rbx
  frame[6] = 0;                                              // rbp: ends frame-pointer walks
  frame[7] = reinterpret_cast<std::uint64_t>(&slimserve_emu_fiber_start_v1);
  context.stack_pointer = frame;
#else
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack.bottom();
  context.context.uc_stack.ss_size = stack.size();
  context.context.uc_link = nullptr;
  context.start_entry = entry;
  context.start_argument = argument;
  makecontext(&context.context, &ucontext_trampoline, 0);
#endif
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
