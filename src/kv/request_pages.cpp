// RequestPageSets: per-request page lists with exactly-once release.
#include "slimserve/kv/request_pages.hpp"

#include <algorithm>
#include <limits>

#include "host_allocation.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {
// Releases `pages` tail first, so a sequence's leaves reach the LRU list before its parents.
// A page the pool refuses (the engine released it behind the page set's back, or it is from
// another pool) does not stop the others; the first refusal is returned and `errors` counts
// every one.
Status release_tail_first(PagePool& pool, std::span<const PageHandle> pages,
                          std::uint64_t& errors) {
  Status first;
  for (std::size_t i = pages.size(); i-- > 0;) {
    Status released = pool.release(pages[i]);
    if (!released.ok()) {
      ++errors;
      if (first.ok()) first = std::move(released);
    }
  }
  return first;
}
// The pool's refusal, said by the call that made it (which completed otherwise).
Status release_refused(const char* action, const Status& refused) {
  return make_status(refused.code(), action, ": done, but the pool refused releasing a page ",
                     "the request held: ", refused.message());
}
}  // namespace

RequestPageSets::RequestPageSets(PagePool& pool, PrefixCache* cache,
                                 const RequestPageSetsOptions& options)
    : pool_(&pool), cache_(cache), page_size_(options.page_size) {
  slots_.resize(static_cast<std::size_t>(options.max_requests));
  free_slots_.reserve(slots_.size());
  for (std::int32_t slot = options.max_requests - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

Result<std::unique_ptr<RequestPageSets>> RequestPageSets::create(
    PagePool& pool, PrefixCache* cache, const RequestPageSetsOptions& options) {
  if (options.max_requests < 1 || options.page_size < 1) {
    return make_status(StatusCode::invalid_argument, "RequestPageSets: max_requests ",
                       options.max_requests, " and page_size ", options.page_size,
                       " must be >= 1");
  }
  if (cache != nullptr && cache->page_size() != options.page_size) {
    return make_status(StatusCode::invalid_argument, "RequestPageSets: page_size ",
                       options.page_size, " differs from the prefix cache's ", cache->page_size());
  }
  const auto slots = static_cast<std::uint64_t>(options.max_requests);
  const std::uint64_t bytes = slots * (sizeof(Slot) + sizeof(std::int32_t));
  SLIMSERVE_RETURN_IF_ERROR(detail::check_host_bytes(bytes, "RequestPageSets"));
  std::unique_ptr<RequestPageSets> sets;
  SLIMSERVE_RETURN_IF_ERROR(detail::allocate_or_refuse("RequestPageSets", bytes, [&] {
    sets.reset(new RequestPageSets(pool, cache, options));
  }));
  return sets;
}

bool RequestPageSets::is_active(RequestRef request) const noexcept {
  return request.slot >= 0 && request.slot < static_cast<std::int32_t>(slots_.size()) &&
         request.writer != no_writer &&
         slots_[static_cast<std::size_t>(request.slot)].state == SlotState::active &&
         slots_[static_cast<std::size_t>(request.slot)].writer == request.writer;
}

std::span<const PageHandle> RequestPageSets::pages(RequestRef request) const noexcept {
  if (!is_active(request)) return {};
  return slots_[static_cast<std::size_t>(request.slot)].pages;
}

std::int64_t RequestPageSets::tokens(RequestRef request) const noexcept {
  if (request.slot < 0 || request.slot >= static_cast<std::int32_t>(slots_.size())) return 0;
  const Slot& slot = slots_[static_cast<std::size_t>(request.slot)];
  return slot.writer == request.writer && slot.state != SlotState::free ? slot.tokens : 0;
}

RequestPageSetsCounts RequestPageSets::counts() const noexcept {
  return RequestPageSetsCounts{active_, preempted_, refused_, release_errors_};
}

Status RequestPageSets::refuse(RequestRef request, const char* action, SlotState wanted) {
  ++refused_;
  const char* want = wanted == SlotState::active ? "active" : "preempted";
  if (request.slot < 0 || request.slot >= static_cast<std::int32_t>(slots_.size())) {
    return make_status(StatusCode::failed_precondition, action, ": request slot ", request.slot,
                       " outside [0, ", slots_.size(), "); nothing changed");
  }
  const Slot& slot = slots_[static_cast<std::size_t>(request.slot)];
  if (slot.state == SlotState::free) {
    return make_status(StatusCode::failed_precondition, action, ": request (slot ", request.slot,
                       ", identity ", request.writer, ") is not ", want,
                       ": the slot is free (a second release?); nothing changed");
  }
  if (slot.writer != request.writer) {
    return make_status(StatusCode::failed_precondition, action, ": request (slot ", request.slot,
                       ", identity ", request.writer, ") is not ", want, ": the slot now holds ",
                       "identity ", slot.writer, " (a stale reference, or a release by a ",
                       "non-holder); nothing changed");
  }
  return make_status(StatusCode::failed_precondition, action, ": request (slot ", request.slot,
                     ", identity ", request.writer, ") is ",
                     slot.state == SlotState::active ? "active" : "preempted", ", not ", want,
                     "; nothing changed");
}

Status RequestPageSets::place(Slot& slot, std::span<const TokenId> tokens,
                              const CacheKeyExtras& extras, PagePlan* plan) {
  const std::int64_t count = static_cast<std::int64_t>(tokens.size());
  std::vector<PageHandle> pages(static_cast<std::size_t>(pages_for(count)));
  std::int32_t hits = 0;
  if (cache_ != nullptr && count > 1) {
    Result<std::int32_t> matched = cache_->match_prefix(tokens.first(tokens.size() - 1), extras,
                                                        pages);
    if (!matched.ok()) return matched.status();
    hits = *matched;
  }
  const WriterId writer = pool_->new_writer();
  Status fresh = pool_->allocate(std::span(pages).subspan(static_cast<std::size_t>(hits)), writer);
  if (!fresh.ok()) {  // give the hits back: nothing taken
    Status given_back = release_tail_first(
        *pool_, std::span<const PageHandle>(pages.data(), static_cast<std::size_t>(hits)),
        release_errors_);
    return given_back.ok() ? fresh : release_refused("giving prefix hits back", given_back);
  }
  slot.pages = std::move(pages);
  slot.tokens = count;
  slot.writer = writer;
  slot.state = SlotState::active;
  if (plan != nullptr) {
    *plan = PagePlan{};
    plan->cached_tokens = static_cast<std::int64_t>(hits) * page_size_;
  }
  return {};
}

Result<RequestRef> RequestPageSets::admit(std::span<const TokenId> tokens,
                                          const CacheKeyExtras& extras, PagePlan* plan) {
  if (tokens.empty()) {
    return make_status(StatusCode::invalid_argument,
                       "admit: a request needs at least one token; nothing was taken");
  }
  if (free_slots_.empty()) {
    return make_status(StatusCode::resource_exhausted, "admit: all ", slots_.size(),
                       " request slots are in use");
  }
  const std::int32_t index = free_slots_.back();
  Slot& slot = slots_[static_cast<std::size_t>(index)];
  SLIMSERVE_RETURN_IF_ERROR(place(slot, tokens, extras, plan));
  free_slots_.pop_back();
  ++active_;
  return RequestRef{index, slot.writer};
}

Result<RequestRef> RequestPageSets::adopt(std::span<const PageHandle> pages, std::int64_t tokens) {
  const std::int64_t needed = tokens < 1 ? 0 : pages_for(tokens);
  if (tokens < 1 || needed != static_cast<std::int64_t>(pages.size())) {
    return make_status(StatusCode::invalid_argument, "adopt: ", tokens, " tokens of ", page_size_,
                       " per page need ", tokens < 1 ? "at least 1 token" : "", needed, " pages; got ",
                       pages.size(), "; nothing was taken");
  }
  if (free_slots_.empty()) {
    return make_status(StatusCode::resource_exhausted, "adopt: all ", slots_.size(),
                       " request slots are in use; nothing was taken");
  }
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const PageHandle page = pages[i];
    Status live = pool_->validate(page);
    if (!live.ok()) {
      return make_status(live.code(), "adopt: page ", i, " (id ", page.id, ", tag ", page.tag,
                         "): ", live.message(), "; nothing was taken");
    }
    const char* why = pool_->ref_count(page.id) != 1      ? "is shared (more than one holder)"
                      : pool_->is_cache_registered(page.id) ? "is indexed by the prefix cache"
                      : pool_->writer(page.id) != no_writer ? "is writable by another identity"
                                                            : nullptr;
    if (why != nullptr) {
      return make_status(StatusCode::failed_precondition, "adopt: page ", i, " (id ", page.id, ") ",
                         why, "; a received page must be the caller's alone and read-only; "
                         "nothing was taken");
    }
  }
  std::vector<PageId> ids(pages.size());
  std::transform(pages.begin(), pages.end(), ids.begin(), [](PageHandle page) { return page.id; });
  std::sort(ids.begin(), ids.end());
  if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end()) {
    return make_status(StatusCode::invalid_argument, "adopt: page ", *twice,
                       " is listed twice; nothing was taken");
  }
  const WriterId writer = pool_->new_writer();
  for (std::size_t i = 0; i < pages.size(); ++i) {
    Status granted = pool_->grant_write(pages[i], writer);
    if (!granted.ok()) {  // not expected after the checks above; undo what was granted
      for (std::size_t j = 0; j < i; ++j) (void)pool_->revoke_write(pages[j]);
      return granted;
    }
  }
  const std::int32_t index = free_slots_.back();
  free_slots_.pop_back();
  Slot& slot = slots_[static_cast<std::size_t>(index)];
  slot.pages.assign(pages.begin(), pages.end());
  slot.tokens = tokens;
  slot.writer = writer;
  slot.state = SlotState::active;
  ++active_;
  return RequestRef{index, writer};
}

Result<PagePlan> RequestPageSets::append(RequestRef request, std::int32_t new_tokens) {
  if (!is_active(request)) return refuse(request, "append", SlotState::active);
  if (new_tokens < 0) {
    return make_status(StatusCode::invalid_argument, "append: new_tokens ", new_tokens, " < 0");
  }
  Slot& slot = slots_[static_cast<std::size_t>(request.slot)];
  PagePlan plan;
  if (new_tokens == 0) return plan;
  const auto filled_in_last = static_cast<std::int32_t>(slot.tokens % page_size_);
  const std::int32_t new_pages = pages_for(slot.tokens + new_tokens) -
                                 static_cast<std::int32_t>(slot.pages.size());
  bool copy = false;
  if (filled_in_last != 0) {
    const PageHandle last = slot.pages.back();
    copy = !(pool_->ref_count(last.id) == 1 && !pool_->is_cache_registered(last.id));
  }
  if (new_pages + (copy ? 1 : 0) > pool_->available_pages()) {
    return make_status(StatusCode::resource_exhausted, "append: need ", new_pages + (copy ? 1 : 0),
                       " pages (", copy ? "1 copy-on-write + " : "", new_pages, " new); ",
                       pool_->available_pages(), " available; nothing was taken");
  }
  if (filled_in_last != 0) {
    const PageHandle last = slot.pages.back();
    // Hold the copy source until the copy is enqueued: while held, no other holder is granted
    // it in place, so the copy never reads a page another request writes.
    if (copy) SLIMSERVE_RETURN_IF_ERROR(pool_->share(last));
    Result<AppendTarget> target = pool_->prepare_append(last, request.writer);
    if (!target.ok()) {
      if (copy) (void)pool_->release(last);
      return target.status();
    }
    if (copy) copy_sources_.push_back(last);
    if (target->needs_copy) {
      plan.needs_copy = true;
      plan.copy_from = target->copy_from;
      plan.copy_to = target->page;
      plan.copy_tokens = filled_in_last;
    }
    slot.pages.back() = target->page;
  }
  const std::size_t old_size = slot.pages.size();
  slot.pages.resize(old_size + static_cast<std::size_t>(new_pages));
  // Cannot fail: availability was checked above and prepare_append took at most one page.
  SLIMSERVE_RETURN_IF_ERROR(pool_->allocate(std::span(slot.pages).subspan(old_size), request.writer));
  slot.tokens += new_tokens;
  return plan;
}

void RequestPageSets::release_copy_sources() {
  Status released = release_tail_first(*pool_, copy_sources_, release_errors_);
  if (!released.ok()) last_release_error_ = std::move(released);
  copy_sources_.clear();
}

Result<RequestRef> RequestPageSets::fork(RequestRef parent) {
  if (!is_active(parent)) return refuse(parent, "fork", SlotState::active);
  if (free_slots_.empty()) {
    return make_status(StatusCode::resource_exhausted, "fork: all ", slots_.size(),
                       " request slots are in use");
  }
  const Slot& source = slots_[static_cast<std::size_t>(parent.slot)];
  for (std::size_t i = 0; i < source.pages.size(); ++i) {
    Status shared = pool_->share(source.pages[i]);
    if (!shared.ok()) {
      Status undone = release_tail_first(
          *pool_, std::span<const PageHandle>(source.pages.data(), i), release_errors_);
      return undone.ok() ? shared : release_refused("fork: undoing the shares", undone);
    }
  }
  const std::int32_t index = free_slots_.back();
  free_slots_.pop_back();
  Slot& child = slots_[static_cast<std::size_t>(index)];
  child.pages = source.pages;
  child.tokens = source.tokens;
  child.writer = pool_->new_writer();
  child.state = SlotState::active;
  ++active_;
  return RequestRef{index, child.writer};
}

Status RequestPageSets::release_all(Slot& slot) {
  Status released = release_tail_first(*pool_, slot.pages, release_errors_);
  slot.pages.clear();
  return released;
}

Status RequestPageSets::preempt(RequestRef request) {
  if (!is_active(request)) return refuse(request, "preempt", SlotState::active);
  Slot& slot = slots_[static_cast<std::size_t>(request.slot)];
  Status released = release_all(slot);
  slot.state = SlotState::preempted;
  --active_;
  ++preempted_;
  return released.ok() ? released : release_refused("preempt", released);
}

Result<RequestRef> RequestPageSets::resume(RequestRef preempted, std::span<const TokenId> tokens,
                                           const CacheKeyExtras& extras, PagePlan* plan) {
  const bool ok = preempted.slot >= 0 && preempted.slot < static_cast<std::int32_t>(slots_.size()) &&
                  slots_[static_cast<std::size_t>(preempted.slot)].state == SlotState::preempted &&
                  slots_[static_cast<std::size_t>(preempted.slot)].writer == preempted.writer;
  if (!ok) return refuse(preempted, "resume", SlotState::preempted);
  Slot& slot = slots_[static_cast<std::size_t>(preempted.slot)];
  if (static_cast<std::int64_t>(tokens.size()) != slot.tokens) {
    return make_status(StatusCode::invalid_argument, "resume: ", tokens.size(),
                       " tokens given, the request had ", slot.tokens);
  }
  SLIMSERVE_RETURN_IF_ERROR(place(slot, tokens, extras, plan));  // a new identity
  --preempted_;
  ++active_;
  return RequestRef{preempted.slot, slot.writer};
}

Status RequestPageSets::finish(RequestRef request, std::span<const TokenId> tokens,
                               const CacheKeyExtras& extras) {
  const bool preempted =
      request.slot >= 0 && request.slot < static_cast<std::int32_t>(slots_.size()) &&
      request.writer != no_writer &&
      slots_[static_cast<std::size_t>(request.slot)].state == SlotState::preempted &&
      slots_[static_cast<std::size_t>(request.slot)].writer == request.writer;
  if (!is_active(request) && !preempted) return refuse(request, "finish", SlotState::active);
  Slot& slot = slots_[static_cast<std::size_t>(request.slot)];
  if (!preempted && cache_ != nullptr && !tokens.empty()) {
    if (static_cast<std::int64_t>(tokens.size()) != slot.tokens) {
      return make_status(StatusCode::invalid_argument, "finish: ", tokens.size(),
                         " tokens given, the request holds ", slot.tokens, "; nothing changed");
    }
    Result<std::int32_t> indexed = cache_->insert(tokens, extras, slot.pages);
    if (!indexed.ok()) return indexed.status();
  }
  Status released = release_all(slot);
  if (preempted) {
    --preempted_;
  } else {
    --active_;
  }
  slot.state = SlotState::free;
  slot.tokens = 0;
  slot.writer = no_writer;
  free_slots_.push_back(request.slot);
  return released.ok() ? released : release_refused("finish", released);
}

Status RequestPageSets::check_invariants() const {
  std::vector<std::int32_t> holders(static_cast<std::size_t>(pool_->num_pages()), 0);
  std::vector<WriterId> holder(static_cast<std::size_t>(pool_->num_pages()), no_writer);
  std::int32_t active = 0;
  std::int32_t preempted = 0;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.state == SlotState::preempted) ++preempted;
    if (slot.state != SlotState::active) {
      if (!slot.pages.empty()) {
        return make_status(StatusCode::internal, "slot ", s, " holds pages but is not active");
      }
      continue;
    }
    ++active;
    if (static_cast<std::int64_t>(slot.pages.size()) != pages_for(slot.tokens)) {
      return make_status(StatusCode::internal, "slot ", s, ": ", slot.pages.size(),
                         " pages for ", slot.tokens, " tokens");
    }
    for (const PageHandle page : slot.pages) {
      SLIMSERVE_RETURN_IF_ERROR(pool_->validate(page));
      ++holders[static_cast<std::size_t>(page.id)];
      holder[static_cast<std::size_t>(page.id)] = slot.writer;
    }
  }
  if (active != active_ || preempted != preempted_) {
    return make_status(StatusCode::internal, "request counts disagree");
  }
  for (PageId page = 1; page < pool_->num_pages(); ++page) {
    const auto at = static_cast<std::size_t>(page);
    if (holders[at] > pool_->ref_count(page)) {
      return make_status(StatusCode::internal, "page ", page, " held by ", holders[at],
                         " requests with ", pool_->ref_count(page), " references");
    }
    const WriterId writer = pool_->writer(page);
    if (writer != no_writer && (holders[at] != 1 || holder[at] != writer)) {
      return make_status(StatusCode::internal, "page ", page, " writable by ", writer,
                         " but held by ", holders[at], " requests");
    }
  }
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
