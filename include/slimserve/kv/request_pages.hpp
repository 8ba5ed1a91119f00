#pragma once
/// \file
/// \brief Per-request page sets: the library owns each request's page list, so admit, append,
/// fork, preempt, resume and finish release exactly what the request holds, exactly once.
///
/// A request is named by a RequestRef: its slot and its identity (WriterId). The identity is
/// new on admit, fork and resume, so a reused slot, or a preempted request resumed, is a new
/// identity: a stale reference (or a stale page table with the old identity) matches nothing.
/// Every call checks the reference first; a call with a reference that is not active (a second
/// finish, a slot now held by another request) is refused with failed_precondition, changes
/// nothing and is counted in `counts().refused`. The one exception is `finish` of a preempted
/// request: it cancels the request (frees its slot; it holds no pages), exactly once.
///
/// Write rights follow the pages: fresh pages are writable by their request, prefix hits and
/// forked pages are read-only, and `append` moves the request off a shared or cached last page
/// (copy-on-write) before granting it the page it appends into. The device check
/// (check_page_tags with `writers` = the requests' identities) enforces the same rights.
/// Thread safety: none (use SharedPagePool::with_lock, and post_finish from other threads).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// A request's slot and identity. The identity is what the device check takes (`writers`).
struct RequestRef {
  std::int32_t slot = -1;
  WriterId writer = no_writer;
  friend constexpr bool operator==(const RequestRef&, const RequestRef&) = default;
};

struct RequestPageSetsOptions {
  std::int32_t max_requests = 0;  ///< slots (active + preempted requests at once)
  std::int32_t page_size = 0;     ///< tokens per page (the prefix cache's, when there is one)
};

/// What `admit`, `resume` and `append` leave for the engine to do on the device.
struct PagePlan {
  /// Copy-on-write: copy the first `copy_tokens` tokens of `copy_from` into `copy_to` (the
  /// request's new last page) before appending; copy_pages does it under the tag check.
  /// `copy_from` stays held (read-only: no other holder can be granted it in place) until
  /// release_copy_sources(), so the copy reads a page nobody writes.
  bool needs_copy = false;
  PageHandle copy_from{};
  PageHandle copy_to{};
  std::int32_t copy_tokens = 0;
  /// Tokens already in pages (prefix hits): the step computes and writes the rest.
  std::int64_t cached_tokens = 0;
};

struct RequestPageSetsCounts {
  std::int32_t active = 0;     ///< requests holding pages
  std::int32_t preempted = 0;  ///< requests waiting for resume (holding no pages)
  std::uint64_t refused = 0;   ///< calls refused for a reference that was not active
  /// Pages the pool refused to release (released behind the sets' back, or from another pool).
  std::uint64_t release_errors = 0;
};

class RequestPageSets {
 public:
  /// Page sets over `pool` (and `cache`, optional, which must index `pool`); both outlive this
  /// object and stay where they are.
  static Result<std::unique_ptr<RequestPageSets>> create(PagePool& pool, PrefixCache* cache,
                                                         const RequestPageSetsOptions& options);

  /// A new request for `tokens` (its prompt, at least one token): prefix hits for all but the
  /// last token, fresh writable pages for the rest. All or nothing (resource_exhausted:
  /// nothing taken).
  Result<RequestRef> admit(std::span<const TokenId> tokens, const CacheKeyExtras& extras,
                           PagePlan* plan = nullptr);
  /// A request whose pages were filled elsewhere (a transfer engine moved another engine's KV
  /// into them, docs/disaggregation.md): takes over the caller's reference to each of `pages`
  /// (sequence order, pages_for(tokens) of them, each live, held by the caller alone, not
  /// indexed by the prefix cache, read-only) for `tokens` tokens, under a new identity that
  /// may write them from now on. All or nothing: refused (the caller keeps its references,
  /// nothing changed) for a wrong page count, a stale, shared, cached or writable page, a page
  /// listed twice, or no free slot.
  Result<RequestRef> adopt(std::span<const PageHandle> pages, std::int64_t tokens);
  /// Room for `new_tokens` more tokens: copy-on-write of a shared or cached last page (see
  /// the plan), then fresh pages, all writable by the request. All or nothing.
  Result<PagePlan> append(RequestRef request, std::int32_t new_tokens);
  /// Drops the references that kept copy-on-write sources read-only: call it once the step's
  /// copies are enqueued (stream order puts them before any later write). A page the pool
  /// refuses is counted (`counts().release_errors`) and kept in last_release_error().
  void release_copy_sources();
  /// The pool's most recent refusal in release_copy_sources (ok when none).
  const Status& last_release_error() const noexcept { return last_release_error_; }
  /// Copy-on-write sources still held.
  std::span<const PageHandle> pending_copy_sources() const noexcept { return copy_sources_; }
  /// A child sharing every page of `parent` (all read-only now; each side copies on its next
  /// append). All or nothing.
  Result<RequestRef> fork(RequestRef parent);
  /// Releases every page (tail first) and keeps the token count for `resume`; the reference
  /// stops being active. Preempt and finish complete even when the pool refuses a page (it was
  /// released behind the sets' back): they release the rest and return the pool's error.
  Status preempt(RequestRef request);
  /// Pages again for a preempted request's `tokens` (prefix hits, then fresh pages), under a
  /// new identity: tables of the preempted incarnation no longer match. All or nothing.
  Result<RequestRef> resume(RequestRef preempted, std::span<const TokenId> tokens,
                            const CacheKeyExtras& extras, PagePlan* plan = nullptr);
  /// Indexes the full pages of `tokens` (when there is a cache and tokens are given), then
  /// releases every page tail first and frees the slot. Exactly once per request. On a
  /// preempted request it is a cancel: the slot is freed and `tokens` are ignored.
  Status finish(RequestRef request, std::span<const TokenId> tokens = {},
                const CacheKeyExtras& extras = {});

  bool is_active(RequestRef request) const noexcept;
  /// The request's pages in sequence order (empty when not active).
  std::span<const PageHandle> pages(RequestRef request) const noexcept;
  /// Tokens stored in the request's pages (also for a preempted request).
  std::int64_t tokens(RequestRef request) const noexcept;
  RequestPageSetsCounts counts() const noexcept;
  std::int32_t page_size() const noexcept { return page_size_; }
  PagePool& pool() noexcept { return *pool_; }
  /// Audit: every active request's pages are live, and every page's reference count is at
  /// least the number of sets holding it; writable pages belong to exactly their writer.
  Status check_invariants() const;

 private:
  enum class SlotState : std::uint8_t { free, active, preempted };
  struct Slot {
    std::vector<PageHandle> pages;
    std::int64_t tokens = 0;
    WriterId writer = no_writer;
    SlotState state = SlotState::free;
  };
  RequestPageSets(PagePool& pool, PrefixCache* cache, const RequestPageSetsOptions& options);
  Status refuse(RequestRef request, const char* action, SlotState wanted);
  Status place(Slot& slot, std::span<const TokenId> tokens, const CacheKeyExtras& extras,
               PagePlan* plan);
  Status release_all(Slot& slot);
  std::int32_t pages_for(std::int64_t tokens) const noexcept {
    return static_cast<std::int32_t>((tokens + page_size_ - 1) / page_size_);
  }

  PagePool* pool_;
  PrefixCache* cache_;
  std::int32_t page_size_;
  std::vector<Slot> slots_;
  std::vector<std::int32_t> free_slots_;
  std::vector<PageHandle> copy_sources_;  // one extra reference each, until release_copy_sources
  std::int32_t active_ = 0;
  std::int32_t preempted_ = 0;
  std::uint64_t refused_ = 0;
  std::uint64_t release_errors_ = 0;
  Status last_release_error_;
};

}  // namespace kv
SLIMSERVE_NAMESPACE_END
