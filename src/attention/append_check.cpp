#include <cstdint>
#include <unordered_set>

#include "slimserve/attention/append.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

Status check_append_destinations(const AppendDestinationsHost& h) {
  const auto batch = static_cast<std::int64_t>(h.last_page_len.size());
  if (h.indptr.size() != static_cast<std::size_t>(batch) + 1 || h.indptr[0] != 0 ||
      h.indices.size() < static_cast<std::size_t>(h.indptr[static_cast<std::size_t>(batch)])) {
    return make_status(StatusCode::invalid_argument, "page table: indptr of ", h.indptr.size(),
                       " entries, indices of ", h.indices.size(), ", last_page_len of ", batch);
  }
  const bool explicit_form = !h.token_request.empty() || !h.token_position.empty();
  if (explicit_form == !h.append_indptr.empty() ||
      (explicit_form && (h.token_request.size() != static_cast<std::size_t>(h.num_tokens) ||
                         h.token_position.size() != static_cast<std::size_t>(h.num_tokens))) ||
      (!explicit_form && (h.append_indptr.size() != static_cast<std::size_t>(batch) + 1 ||
                          h.append_indptr[0] != 0 ||
                          h.append_indptr[static_cast<std::size_t>(batch)] != h.num_tokens))) {
    return make_status(StatusCode::invalid_argument,
                       "destinations: give token_request/token_position of num_tokens = ",
                       h.num_tokens, " entries, or append_indptr of batch_size + 1 = ", batch + 1,
                       " entries from 0 to num_tokens");
  }
  auto length = [&](std::int64_t b) -> std::int64_t {
    const std::int32_t pages = h.indptr[static_cast<std::size_t>(b) + 1] - h.indptr[static_cast<std::size_t>(b)];
    const std::int32_t last = h.last_page_len[static_cast<std::size_t>(b)];
    if (pages == 0) return 0;
    if (pages < 0 || last < 1 || last > h.page_size) return -1;
    return static_cast<std::int64_t>(pages - 1) * h.page_size + last;
  };
  std::unordered_set<std::int64_t> slots;
  for (std::int32_t t = 0; t < h.num_tokens; ++t) {
    std::int64_t b = 0, position = 0;
    if (explicit_form) {
      b = h.token_request[static_cast<std::size_t>(t)];
      if (b < 0 || b >= batch) {
        return make_status(StatusCode::out_of_range, "token ", t, " names request ", b,
                           " of a batch of ", batch);
      }
      position = h.token_position[static_cast<std::size_t>(t)];
    } else {
      while (h.append_indptr[static_cast<std::size_t>(b) + 1] <= t) ++b;
      const std::int64_t count = h.append_indptr[static_cast<std::size_t>(b) + 1] - h.append_indptr[static_cast<std::size_t>(b)];
      position = length(b) - count + (t - h.append_indptr[static_cast<std::size_t>(b)]);
    }
    const std::int64_t len = length(b);
    if (len < 0) {
      return make_status(StatusCode::invalid_argument, "request ", b, " has last_page_len ",
                         h.last_page_len[static_cast<std::size_t>(b)], " outside [1, ", h.page_size, "]");
    }
    if (position < 0 || position >= len) {
      return make_status(StatusCode::out_of_range, "token ", t, " of request ", b, " goes to position ",
                         position, "; the request's pages hold positions [0, ", len, ")");
    }
    const std::int32_t page = h.indices[static_cast<std::size_t>(h.indptr[static_cast<std::size_t>(b)] + position / h.page_size)];
    if (page < 0 || page >= h.num_pages) {
      return make_status(StatusCode::out_of_range, "token ", t, " of request ", b, " maps to page ", page,
                         " outside [0, ", h.num_pages, ")");
    }
    const std::int64_t slot = static_cast<std::int64_t>(page) * h.page_size + position % h.page_size;
    if (!slots.insert(slot).second) {
      return make_status(StatusCode::invalid_argument, "token ", t, " of request ", b,
                         " writes page ", page, " slot ", position % h.page_size,
                         ", which an earlier token of this append also writes");
    }
  }
  return {};
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
