// The page-movement kernels (copy_pages, swap_pages, export_request, import_request) on the
// emulator (and a GPU as kv_page_movement_test_gpu): every layout and dtype, per-token scales,
// byte-exact against a host model of the whole cache, poisoned outputs, shuffled pages with
// holes, ragged lengths, and refused moves (stale tags, pages not writable by the mover, a
// corrupted header) leaving every byte untouched.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/device_buffers.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;
using attention::KvDtype;
using attention::KvLayout;
using attention::KvScaleMode;

namespace {

constexpr std::int32_t num_pages = 24;
constexpr std::int32_t page_size = 16;
constexpr std::int32_t heads = 2;
constexpr std::int32_t head_dim = 64;

using slimserve_test::device_buffer;

struct Config {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scales;
};

// A cache on the device plus its host model, array by array (K, V, K scales, V scales).
class Cache {
 public:
  Cache(const Config& config, std::mt19937_64& rng) : config_(config) {
    const std::int64_t data = static_cast<std::int64_t>(num_pages) * page_size * heads *
                              attention::head_vector_bytes(config.dtype, head_dim);
    const std::int64_t scales = static_cast<std::int64_t>(num_pages) * page_size * heads * 4;
    const int arrays = config.scales == KvScaleMode::per_token ? 4 : 2;
    for (int a = 0; a < 4; ++a) {
      const std::int64_t bytes = a < 2 ? data : (a < arrays ? scales : 16);
      model_[a].resize(static_cast<std::size_t>(bytes));
      for (auto& byte : model_[a]) byte = static_cast<unsigned char>(rng());
      device_[a] = device_buffer<unsigned char>(model_[a].size());
      REQUIRE(device_[a].upload(model_[a]).ok());
    }
    scale_ = device_buffer<float>(2);
    REQUIRE(scale_.upload(std::vector<float>{0.5f, 0.25f}).ok());
    view_.k_pages = device_[0].data();
    view_.v_pages = device_[1].data();
    if (config.scales == KvScaleMode::per_token) {
      view_.k_token_scales = reinterpret_cast<float*>(device_[2].data());
      view_.v_token_scales = reinterpret_cast<float*>(device_[3].data());
    } else if (config.scales == KvScaleMode::per_tensor) {
      view_.k_scale = scale_.data();
      view_.v_scale = scale_.data() + 1;
    }
    view_.num_pages = num_pages;
    view_.page_size = page_size;
    view_.num_kv_heads = heads;
    view_.head_dim = head_dim;
    view_.dtype = config.dtype;
    view_.layout = config.layout;
    view_.scale_mode = config.scales;
  }
  const attention::PagedKVCacheView& view() const { return view_; }
  int arrays() const { return config_.scales == KvScaleMode::per_token ? 4 : 2; }
  std::int64_t unit(int a) const {
    return a < 2 ? attention::head_vector_bytes(config_.dtype, head_dim) : 4;  // NVFP4: codes + block scales
  }
  std::int64_t page_bytes(int a) const { return unit(a) * page_size * heads; }
  // Byte offset of (slot, head) inside one page of array a.
  std::int64_t in_page(int a, std::int32_t slot, std::int32_t head) const {
    return attention::cache_offset(config_.layout, page_size, heads, 1, 0, slot, head, 0) * unit(a);
  }
  std::int64_t record_offset(int a) const {
    std::int64_t offset = 0;
    for (int i = 0; i < a; ++i) offset += page_bytes(i);
    return offset;
  }
  std::int64_t record_bytes() const { return record_offset(arrays()); }
  std::int64_t slot_bytes() const { return kv_record_header_bytes + record_bytes(); }
  // The checksum terms of slots [0, tokens) of a record, summed on the host from the model's
  // layout (independently of the kernels' runs).
  std::uint64_t record_word_sum(const unsigned char* record, std::int32_t tokens) const {
    std::uint64_t sum = 0;
    for (int a = 0; a < arrays(); ++a) {
      for (std::int32_t t = 0; t < tokens; ++t) {
        for (std::int32_t h = 0; h < heads; ++h) {
          const std::int64_t at = record_offset(a) + in_page(a, t, h);
          for (std::int64_t k = 0; k < unit(a); k += 4) {
            std::uint32_t word;
            std::memcpy(&word, record + at + k, 4);
            sum += record_word_term(at + k, word);
          }
        }
      }
    }
    return sum;
  }
  // What a slot (or an export record) holds after a sealed move: the header, then the record.
  void model_header(unsigned char* slot, const RecordIdentity& identity, std::int32_t index,
                    std::int32_t tokens, std::int32_t covered) const {
    KvRecordHeader header;
    header.identity = identity;
    header.index = index;
    header.tokens = tokens;
    header.checksum = record_checksum(record_word_sum(slot + kv_record_header_bytes, covered),
                                      identity, index, tokens);
    std::memcpy(slot, &header, sizeof header);
  }
  std::vector<unsigned char>& model(int a) { return model_[a]; }
  // Every byte of the device cache equals the model.
  void require_equal_to_model() {
    for (int a = 0; a < arrays(); ++a) {
      std::vector<unsigned char> got(model_[a].size());
      REQUIRE(device_[a].download(got).ok());
      REQUIRE(rt::stream_synchronize(nullptr).ok());
      INFO("array " << a);
      REQUIRE(std::memcmp(got.data(), model_[a].data(), got.size()) == 0);
    }
  }
  // Model: slots [0, tokens) of page src -> dst (or to/from a record).
  void model_copy(PageId src, PageId dst, std::int32_t tokens) {
    for (int a = 0; a < arrays(); ++a) {
      for (std::int32_t t = 0; t < tokens; ++t) {
        for (std::int32_t h = 0; h < heads; ++h) {
          std::memcpy(&model_[a][static_cast<std::size_t>(dst * page_bytes(a) + in_page(a, t, h))],
                      &model_[a][static_cast<std::size_t>(src * page_bytes(a) + in_page(a, t, h))],
                      static_cast<std::size_t>(unit(a)));
        }
      }
    }
  }
  void model_to_record(PageId page, std::int32_t tokens, unsigned char* record) {
    for (int a = 0; a < arrays(); ++a) {
      for (std::int32_t t = 0; t < tokens; ++t) {
        for (std::int32_t h = 0; h < heads; ++h) {
          std::memcpy(record + record_offset(a) + in_page(a, t, h),
                      &model_[a][static_cast<std::size_t>(page * page_bytes(a) + in_page(a, t, h))],
                      static_cast<std::size_t>(unit(a)));
        }
      }
    }
  }
  void model_from_record(PageId page, std::int32_t tokens, const unsigned char* record) {
    for (int a = 0; a < arrays(); ++a) {
      for (std::int32_t t = 0; t < tokens; ++t) {
        for (std::int32_t h = 0; h < heads; ++h) {
          std::memcpy(&model_[a][static_cast<std::size_t>(page * page_bytes(a) + in_page(a, t, h))],
                      record + record_offset(a) + in_page(a, t, h), static_cast<std::size_t>(unit(a)));
        }
      }
    }
  }

 private:
  Config config_;
  std::vector<unsigned char> model_[4];
  rt::DeviceBuffer<unsigned char> device_[4];
  rt::DeviceBuffer<float> scale_;
  attention::PagedKVCacheView view_;
};

const Config configs[] = {
    {KvDtype::bf16, KvLayout::nhd, KvScaleMode::none},
    {KvDtype::bf16, KvLayout::hnd, KvScaleMode::none},
    {KvDtype::fp16, KvLayout::nhd, KvScaleMode::per_tensor},
    {KvDtype::fp16, KvLayout::hnd, KvScaleMode::none},
    {KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token},
    {KvDtype::fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token},
    {KvDtype::fp8_e5m2, KvLayout::nhd, KvScaleMode::per_token},
    {KvDtype::fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor},
    {KvDtype::nvfp4, KvLayout::nhd, KvScaleMode::per_tensor},  // 36-byte head vectors
    {KvDtype::nvfp4, KvLayout::hnd, KvScaleMode::per_tensor},
};

struct World {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray tags = std::move(DeviceTagArray::create(num_pages)).value();
  void sync() { REQUIRE(tags.sync(pool, nullptr).ok()); }
};

std::vector<RequestStatus> read_statuses(const rt::DeviceBuffer<RequestStatus>& device, std::size_t count) {
  std::vector<RequestStatus> host(count);
  REQUIRE(device.download(host).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  return host;
}

}  // namespace

TEST_CASE("page movement: copy_pages copies filled slots byte for byte, refused copies touch nothing", "[kv][movement]") {
  auto rng = slimserve_test::make_rng(71);
  for (const Config& config : configs) {
    INFO(attention::to_string(config.dtype) << " " << attention::to_string(config.layout) << " "
                                            << attention::to_string(config.scales));
    Cache cache(config, rng);
    World world;
    const WriterId me = world.pool.new_writer();
    const WriterId other = world.pool.new_writer();
    // Shuffled pages with holes: take every page, give some back.
    std::vector<PageHandle> pages(num_pages - 1);
    REQUIRE(world.pool.allocate(pages).ok());
    std::shuffle(pages.begin(), pages.end(), rng);
    for (int i = 0; i < 4; ++i) {
      REQUIRE(world.pool.release(pages.back()).ok());
      pages.pop_back();
    }
    // Sources: read-only (shared) pages. Destinations: pages writable by `me`.
    std::vector<PageCopy> copies;
    std::vector<RequestState> want;
    for (int i = 0; i < 6; ++i) {
      const PageHandle src = pages[static_cast<std::size_t>(2 * i)];
      const PageHandle dst = pages[static_cast<std::size_t>(2 * i + 1)];
      REQUIRE(world.pool.share(src).ok());
      REQUIRE(world.pool.grant_write(dst, me).ok());
      const std::int32_t tokens = std::array<std::int32_t, 6>{1, 15, 16, 7, 16, 3}[static_cast<std::size_t>(i)];
      copies.push_back(PageCopy{src.id, src.tag, dst.id, dst.tag, me, tokens});
      want.push_back(RequestState::ok);
    }
    // Refused: destination shared (read-only), destination writable by another, stale source.
    const PageHandle shared_dst = pages[12];
    REQUIRE(world.pool.share(shared_dst).ok());
    copies.push_back(PageCopy{pages[13].id, pages[13].tag, shared_dst.id, shared_dst.tag, me, 16});
    want.push_back(RequestState::write_denied);
    REQUIRE(world.pool.grant_write(pages[14], other).ok());
    copies.push_back(PageCopy{pages[15].id, pages[15].tag, pages[14].id, pages[14].tag, me, 16});
    want.push_back(RequestState::write_denied);
    REQUIRE(world.pool.grant_write(pages[16], me).ok());
    copies.push_back(PageCopy{pages[17].id, pages[17].tag + 1, pages[16].id, pages[16].tag, me, 9});
    want.push_back(RequestState::stale_tag);
    REQUIRE(check_page_copies(copies, cache.view()).ok());
    world.sync();

    auto d_copies = device_buffer<PageCopy>(copies.size());
    auto statuses = device_buffer<RequestStatus>(copies.size());
    REQUIRE(d_copies.upload(copies).ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(copy_pages(CopyPagesArguments{cache.view(), &world.tags, d_copies.data(),
                                          static_cast<std::int32_t>(copies.size()), statuses.data()},
                       nullptr)
                .ok());
    const auto got = read_statuses(statuses, copies.size());
    for (std::size_t i = 0; i < copies.size(); ++i) {
      INFO("copy " << i);
      CHECK(got[i].state == want[i]);
      if (want[i] == RequestState::ok) cache.model_copy(copies[i].src, copies[i].dst, copies[i].tokens);
    }
    cache.require_equal_to_model();
  }
}

TEST_CASE("page movement: swap out and in through pinned host records, byte-exact round trip", "[kv][movement]") {
  auto rng = slimserve_test::make_rng(72);
  for (const Config& config : configs) {
    INFO(attention::to_string(config.dtype) << " " << attention::to_string(config.layout));
    Cache cache(config, rng);
    World world;
    const WriterId me = world.pool.new_writer();
    const WriterId other = world.pool.new_writer();
    std::vector<PageHandle> pages(num_pages - 1);
    REQUIRE(world.pool.allocate(pages, me).ok());
    std::shuffle(pages.begin(), pages.end(), rng);
    constexpr std::int32_t slots = 8;
    const std::int64_t slot = cache.slot_bytes();
    REQUIRE(cache.record_bytes() == page_record_bytes(cache.view()));
    REQUIRE(slot == swap_slot_bytes(cache.view()));
    auto host = rt::DeviceBuffer<unsigned char>::create(static_cast<std::size_t>(slots * slot));  // emulated pinned memory
    REQUIRE(host.ok());
    std::vector<unsigned char> host_model(static_cast<std::size_t>(slots * slot));
    for (auto& byte : host_model) byte = static_cast<unsigned char>(rng() | 1u);  // poison
    REQUIRE(host->upload(host_model).ok());
    world.sync();
    // Out: 5 pages into shuffled slots under this request's identity; one stale handle refused.
    const RecordIdentity mine{world.tags.synced_pool(), me, 1};
    std::vector<PageSwap> out;
    const std::int32_t slot_order[] = {6, 1, 4, 0, 7, 3};
    for (int i = 0; i < 5; ++i) out.push_back(PageSwap{pages[static_cast<std::size_t>(i)].id, pages[static_cast<std::size_t>(i)].tag, me, slot_order[i]});
    out.push_back(PageSwap{pages[5].id, pages[5].tag + 7, me, slot_order[5]});
    REQUIRE(check_page_swaps(out, SwapDirection::device_to_host, cache.view(), slots).ok());
    auto d_swaps = device_buffer<PageSwap>(16);
    auto d_identities = device_buffer<RecordIdentity>(16);
    auto statuses = device_buffer<RequestStatus>(16);
    REQUIRE(d_swaps.upload(out).ok());
    REQUIRE(d_identities.upload(std::vector<RecordIdentity>(out.size(), mine)).ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    SwapPagesArguments swap_out{cache.view(), &world.tags, host->data(), slots, d_swaps.data(),
                                static_cast<std::int32_t>(out.size()),
                                SwapDirection::device_to_host, statuses.data(), d_identities.data()};
    REQUIRE(swap_pages(swap_out, nullptr).ok());
    auto got = read_statuses(statuses, out.size());
    for (int i = 0; i < 5; ++i) {
      CHECK(got[static_cast<std::size_t>(i)].state == RequestState::ok);
      unsigned char* at = &host_model[static_cast<std::size_t>(slot_order[i] * slot)];
      cache.model_to_record(out[static_cast<std::size_t>(i)].page, page_size, at + kv_record_header_bytes);
      // The header: nothing was recorded written in these pages (no fills tracked here).
      cache.model_header(at, mine, slot_order[i], 0, page_size);
    }
    CHECK(got[5].state == RequestState::stale_tag);
    std::vector<unsigned char> host_got(host_model.size());
    REQUIRE(host->download(host_got).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    REQUIRE(host_got == host_model);
    // A record moved to another slot with one byte changed (slot 2 was never written): its
    // index and checksum no longer match.
    std::memcpy(&host_model[static_cast<std::size_t>(2 * slot)], &host_model[static_cast<std::size_t>(slot_order[1] * slot)],
                static_cast<std::size_t>(slot));
    host_model[static_cast<std::size_t>(2 * slot + kv_record_header_bytes + 5)] ^= 0x10;
    REQUIRE(host->upload(host_model).ok());
    // In: those records into other pages; one page read-only (shared): refused. Refused on the
    // device, before any byte lands, with every byte of the (random, poison) page kept: a
    // slot holding another request's record, a stale record (an earlier sequence), a slot
    // never written, and the moved, corrupted record.
    std::vector<PageSwap> in;
    std::vector<RecordIdentity> expected;
    for (int i = 0; i < 5; ++i) {
      in.push_back(PageSwap{pages[static_cast<std::size_t>(10 + i)].id, pages[static_cast<std::size_t>(10 + i)].tag, me, slot_order[i]});
      expected.push_back(mine);
    }
    REQUIRE(world.pool.share(pages[15]).ok());
    in.push_back(PageSwap{pages[15].id, pages[15].tag, me, slot_order[0]});
    expected.push_back(mine);
    const std::vector<std::pair<std::int32_t, RecordIdentity>> refused_in{
        {slot_order[1], RecordIdentity{mine.pool, other, 1}},       // another request's record
        {slot_order[2], RecordIdentity{mine.pool, me, 2}},          // stale: an earlier swap-out
        {slot_order[3], RecordIdentity{mine.pool + 1, me, 1}},      // another pool
        {5, mine},                                                  // never written (poison)
        {2, mine}};                                                 // moved and corrupted
    for (std::size_t i = 0; i < refused_in.size(); ++i) {
      const PageHandle& page = pages[16 + i];
      in.push_back(PageSwap{page.id, page.tag, me, refused_in[i].first});
      expected.push_back(refused_in[i].second);
    }
    REQUIRE(check_page_swaps(in, SwapDirection::host_to_device, cache.view(), slots).ok());
    world.sync();
    REQUIRE(d_swaps.upload(in).ok());
    REQUIRE(d_identities.upload(expected).ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    SwapPagesArguments swap_in = swap_out;
    swap_in.num_swaps = static_cast<std::int32_t>(in.size());
    swap_in.direction = SwapDirection::host_to_device;
    REQUIRE(swap_pages(swap_in, nullptr).ok());
    got = read_statuses(statuses, in.size());
    for (int i = 0; i < 5; ++i) {
      CHECK(got[static_cast<std::size_t>(i)].state == RequestState::ok);
      cache.model_from_record(in[static_cast<std::size_t>(i)].page, page_size,
                              &host_model[static_cast<std::size_t>(slot_order[i] * slot + kv_record_header_bytes)]);
    }
    CHECK(got[5].state == RequestState::write_denied);
    for (std::size_t i = 0; i < refused_in.size(); ++i) {
      INFO("refused swap-in " << i);
      CHECK(got[6 + i].state == RequestState::record_mismatch);
    }
    cache.require_equal_to_model();
    // The healthy swap-ins recorded the header's fill (0 here) under the new pages' tags.
    {
      std::vector<PageFillWord> fills(static_cast<std::size_t>(num_pages));
      REQUIRE(rt::copy_async(fills.data(), world.tags.fills(), fills.size() * sizeof(PageFillWord),
                             rt::CopyDirection::device_to_host, nullptr).ok());
      REQUIRE(rt::stream_synchronize(nullptr).ok());
      for (int i = 0; i < 5; ++i) {
        CHECK(fills[static_cast<std::size_t>(in[static_cast<std::size_t>(i)].page)] ==
              pack_page_fill(in[static_cast<std::size_t>(i)].tag, 0));
      }
    }
    // Without identities a record names the swapping request: the same identity swaps it
    // back, another is refused.
    std::vector<PageSwap> plain_in{PageSwap{pages[21].id, pages[21].tag, me, slot_order[4]}};
    REQUIRE(d_swaps.upload(plain_in).ok());
    SwapPagesArguments plain = swap_in;
    plain.identities = nullptr;
    plain.num_swaps = 1;
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(swap_pages(plain, nullptr).ok());
    CHECK(read_statuses(statuses, 1)[0].state == RequestState::record_mismatch);  // sealed as sequence 1
    cache.require_equal_to_model();
    // An out-of-range direction (it arrives as an integer from C, Python or a cast) is refused
    // by the preflight and the launch alike, and moves nothing either way: the cache and the
    // host records keep their bytes. Before the check, 5 was preflighted as one direction
    // and launched as the other.
    for (const int raw : {2, 5, 255}) {
      const auto bad = static_cast<SwapDirection>(raw);
      CHECK(check_page_swaps(in, bad, cache.view(), slots).code() == StatusCode::invalid_argument);
      SwapPagesArguments bad_direction = swap_in;
      bad_direction.direction = bad;
      CHECK(swap_pages(bad_direction, nullptr).code() == StatusCode::invalid_argument);
    }
    REQUIRE(host->download(host_got).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    REQUIRE(host_got == host_model);
    cache.require_equal_to_model();
  }
}

TEST_CASE("page movement: export and import one request through a self-describing buffer", "[kv][movement]") {
  auto rng = slimserve_test::make_rng(73);
  for (const Config& config : configs) {
    for (const std::int64_t tokens : {std::int64_t{1}, std::int64_t{page_size - 1}, std::int64_t{page_size},
                                      std::int64_t{page_size + 1}, std::int64_t{5 * page_size + 3}}) {
      INFO(attention::to_string(config.dtype) << " " << attention::to_string(config.layout) << " tokens " << tokens);
      Cache cache(config, rng);
      World world;
      const WriterId sender = world.pool.new_writer();
      const WriterId receiver = world.pool.new_writer();
      const auto count = static_cast<std::int32_t>((tokens + page_size - 1) / page_size);
      std::vector<PageHandle> all(num_pages - 1);
      REQUIRE(world.pool.allocate(all).ok());
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<PageHandle> from(all.begin(), all.begin() + count);
      std::vector<PageHandle> to(all.begin() + count, all.begin() + 2 * count);
      for (const PageHandle& page : from) REQUIRE(world.pool.grant_write(page, sender).ok());
      for (const PageHandle& page : to) REQUIRE(world.pool.grant_write(page, receiver).ok());
      world.sync();
      auto upload_request = [&](const std::vector<PageHandle>& pages, rt::DeviceBuffer<PageId>& ids,
                                rt::DeviceBuffer<PageTag>& tags) {
        std::vector<PageId> host_ids;
        std::vector<PageTag> host_tags;
        for (const PageHandle& page : pages) {
          host_ids.push_back(page.id);
          host_tags.push_back(page.tag);
        }
        REQUIRE(ids.upload(host_ids).ok());
        REQUIRE(tags.upload(host_tags).ok());
      };
      auto from_ids = device_buffer<PageId>(static_cast<std::size_t>(count));
      auto from_tags = device_buffer<PageTag>(static_cast<std::size_t>(count));
      auto to_ids = device_buffer<PageId>(static_cast<std::size_t>(count));
      auto to_tags = device_buffer<PageTag>(static_cast<std::size_t>(count));
      upload_request(from, from_ids, from_tags);
      upload_request(to, to_ids, to_tags);
      const std::int64_t bytes = export_buffer_bytes(cache.view(), count);
      auto buffer = device_buffer<unsigned char>(static_cast<std::size_t>(bytes));
      std::vector<unsigned char> poison(static_cast<std::size_t>(bytes));
      for (auto& byte : poison) byte = static_cast<unsigned char>(rng() | 1u);
      REQUIRE(buffer.upload(poison).ok());
      auto status = device_buffer<RequestStatus>(1);
      REQUIRE(status.fill_bytes(0x5A).ok());
      const RecordIdentity sent{world.tags.synced_pool(), sender, 3};
      ExportRequestArguments export_args{cache.view(), &world.tags,
                                         RequestPagesView{from_ids.data(), from_tags.data(), count, tokens, sender},
                                         buffer.data(), bytes, status.data(), sent};
      REQUIRE(export_request(export_args, nullptr).ok());
      CHECK(read_statuses(status, 1)[0].state == RequestState::ok);
      std::vector<unsigned char> exported(static_cast<std::size_t>(bytes));
      REQUIRE(buffer.download(exported).ok());
      REQUIRE(rt::stream_synchronize(nullptr).ok());
      const auto header_bytes = std::as_bytes(std::span(exported.data(), exported.size()));
      Result<KvBufferDescriptor> descriptor = read_buffer_descriptor(header_bytes);
      REQUIRE(descriptor.ok());
      CHECK(*descriptor == describe_export(cache.view(), count, tokens));
      REQUIRE(read_buffer_identity(header_bytes).ok());
      CHECK(*read_buffer_identity(header_bytes) == sent);
      // Records hold a header and the filled slots; the rest of the buffer keeps its poison.
      std::vector<unsigned char> expected = poison;
      std::memcpy(expected.data(), &*descriptor, sizeof(KvBufferDescriptor));
      std::memcpy(expected.data() + kv_buffer_identity_offset, &sent, sizeof sent);
      auto record_of = [&](std::vector<unsigned char>& buffer_bytes, std::int32_t i) {
        return &buffer_bytes[static_cast<std::size_t>(kv_buffer_header_bytes + i * cache.slot_bytes())];
      };
      auto filled_of = [&](std::int32_t i) {
        return static_cast<std::int32_t>(std::min<std::int64_t>(page_size, tokens - std::int64_t{i} * page_size));
      };
      for (std::int32_t i = 0; i < count; ++i) {
        cache.model_to_record(from[static_cast<std::size_t>(i)].id, filled_of(i), record_of(expected, i) + kv_record_header_bytes);
        cache.model_header(record_of(expected, i), sent, i, filled_of(i), filled_of(i));
      }
      REQUIRE(exported == expected);

      ImportRequestArguments import{cache.view(), &world.tags,
                                    RequestPagesView{to_ids.data(), to_tags.data(), count, tokens, receiver},
                                    buffer.data(), bytes, *descriptor, status.data(), sent};
      // Refused, nothing written: a page of the request not writable by the importer.
      REQUIRE(world.pool.revoke_write(to.back()).ok());
      world.sync();
      REQUIRE(import_request(import, nullptr).ok());
      const RequestStatus refused = read_statuses(status, 1)[0];
      CHECK(refused.state == RequestState::write_denied);
      CHECK(refused.failed_slot == count - 1);
      cache.require_equal_to_model();
      // Refused on the host: a descriptor of another dtype or layout; no expected identity.
      ImportRequestArguments mismatched = import;
      mismatched.descriptor.layout = config.layout == KvLayout::nhd ? KvLayout::hnd : KvLayout::nhd;
      CHECK(import_request(mismatched, nullptr).code() == StatusCode::invalid_argument);
      mismatched = import;
      mismatched.expected = RecordIdentity{};
      CHECK(import_request(mismatched, nullptr).code() == StatusCode::invalid_argument);
      // Refused on the device: a header that does not say what the host read.
      REQUIRE(world.pool.grant_write(to.back(), receiver).ok());
      world.sync();
      exported[8] ^= 0x01;  // the dtype byte
      REQUIRE(buffer.upload(exported).ok());
      REQUIRE(import_request(import, nullptr).ok());
      CHECK(read_statuses(status, 1)[0].state == RequestState::bad_page_table);
      cache.require_equal_to_model();
      exported[8] ^= 0x01;
      REQUIRE(buffer.upload(exported).ok());
      // Refused on the device, every page of the (random, poison) destination kept: another
      // request's buffer of the same shape (the importer expects another exporter), a stale
      // one (an earlier sequence), one from another pool, and a record with one byte changed
      // (the last one: the status names it).
      for (const RecordIdentity& wrong : {RecordIdentity{sent.pool, receiver, sent.sequence},
                                          RecordIdentity{sent.pool, sender, sent.sequence - 1},
                                          RecordIdentity{sent.pool + 1, sender, sent.sequence}}) {
        ImportRequestArguments other = import;
        other.expected = wrong;
        REQUIRE(status.fill_bytes(0x5A).ok());
        REQUIRE(import_request(other, nullptr).ok());
        const RequestStatus verdict = read_statuses(status, 1)[0];
        CHECK(verdict.state == RequestState::record_mismatch);
        CHECK(verdict.failed_slot == 0);
        cache.require_equal_to_model();
      }
      const std::size_t flipped = static_cast<std::size_t>(record_of(exported, count - 1) - exported.data()) +
                                  kv_record_header_bytes + 3;
      exported[flipped] ^= 0x40;
      REQUIRE(buffer.upload(exported).ok());
      REQUIRE(import_request(import, nullptr).ok());
      {
        const RequestStatus verdict = read_statuses(status, 1)[0];
        CHECK(verdict.state == RequestState::record_mismatch);
        CHECK(verdict.failed_slot == count - 1);
      }
      cache.require_equal_to_model();
      exported[flipped] ^= 0x40;
      REQUIRE(buffer.upload(exported).ok());
      // Accepted: filled slots land in the receiver's pages, nothing else changes.
      REQUIRE(import_request(import, nullptr).ok());
      CHECK(read_statuses(status, 1)[0].state == RequestState::ok);
      for (std::int32_t i = 0; i < count; ++i) {
        cache.model_from_record(to[static_cast<std::size_t>(i)].id, filled_of(i),
                                record_of(exported, i) + kv_record_header_bytes);
      }
      cache.require_equal_to_model();
    }
  }
}

TEST_CASE("page movement: host preflight refuses bad lists and buffers", "[kv][movement]") {
  auto rng = slimserve_test::make_rng(74);
  Cache cache(configs[4], rng);
  const auto& view = cache.view();
  const WriterId me = 7;
  CHECK(check_page_copies(std::vector<PageCopy>{{0, 0, 3, 2, me, 4}}, view).code() == StatusCode::invalid_argument);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, num_pages, 2, me, 4}}, view).code() == StatusCode::out_of_range);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, me, 0}}, view).code() == StatusCode::invalid_argument);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, me, page_size + 1}}, view).code() == StatusCode::invalid_argument);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 2, 1, me, 4}}, view).code() == StatusCode::invalid_argument);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, no_writer, 4}}, view).code() == StatusCode::invalid_argument);
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, me, 4}, {4, 1, 3, 2, me, 4}}, view).code() == StatusCode::invalid_argument);  // dst twice
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, me, 4}, {3, 2, 5, 2, me, 4}}, view).code() == StatusCode::invalid_argument);  // dst read later
  CHECK(check_page_copies(std::vector<PageCopy>{{2, 1, 3, 2, me, 4}, {2, 1, 5, 2, me, 4}}, view).ok());  // one source, two copies
  CHECK(check_page_swaps(std::vector<PageSwap>{{3, 1, me, 8}}, SwapDirection::device_to_host, view, 8).code() == StatusCode::out_of_range);
  CHECK(check_page_swaps(std::vector<PageSwap>{{3, 1, me, 1}, {4, 1, me, 1}}, SwapDirection::device_to_host, view, 8).code() == StatusCode::invalid_argument);
  CHECK(check_page_swaps(std::vector<PageSwap>{{3, 1, me, 1}, {3, 1, me, 2}}, SwapDirection::host_to_device, view, 8).code() == StatusCode::invalid_argument);
  CHECK(check_page_swaps(std::vector<PageSwap>{{3, 1, no_writer, 1}}, SwapDirection::host_to_device, view, 8).code() == StatusCode::invalid_argument);
  CHECK(check_page_swaps(std::vector<PageSwap>{{0, 0, me, 1}}, SwapDirection::device_to_host, view, 8).code() == StatusCode::invalid_argument);
  // Descriptors.
  KvBufferDescriptor d = describe_export(view, 2, 20);
  std::vector<std::byte> bytes(sizeof d);
  std::memcpy(bytes.data(), &d, sizeof d);
  CHECK(read_buffer_descriptor(bytes).ok());
  CHECK(read_buffer_descriptor(std::span(bytes).first(10)).status().code() == StatusCode::invalid_argument);
  KvBufferDescriptor bad = d;
  bad.magic = 1;
  std::memcpy(bytes.data(), &bad, sizeof bad);
  CHECK(read_buffer_descriptor(bytes).status().code() == StatusCode::invalid_argument);
  bad = d;
  bad.num_tokens = 33;  // 2 pages of 16 hold at most 32
  std::memcpy(bytes.data(), &bad, sizeof bad);
  CHECK(read_buffer_descriptor(bytes).status().code() == StatusCode::invalid_argument);
  bad = d;
  bad.head_dim = 128;
  CHECK(check_import_compatible(bad, view).code() == StatusCode::invalid_argument);
  CHECK(check_import_compatible(d, view).ok());
  // Launch preflight: short buffer, no tag array.
  World world;
  auto ids = device_buffer<PageId>(2);
  auto tags = device_buffer<PageTag>(2);
  auto status = device_buffer<RequestStatus>(1);
  auto buffer = device_buffer<unsigned char>(64);
  CHECK(export_request(ExportRequestArguments{view, &world.tags, RequestPagesView{ids.data(), tags.data(), 2, 20, me},
                                              buffer.data(), 64, status.data(), {}},
                       nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(copy_pages(CopyPagesArguments{view, nullptr, nullptr, 0, nullptr}, nullptr).code() == StatusCode::invalid_argument);
}

TEST_CASE("page movement: the records' checksum terms keep the export format's finalizer", "[kv][movement]") {
  // Values worked out by hand from the finalizer's definition (xor-shift 33, multiply by
  // 0xFF51AFD7ED558CCD, xor-shift 33, multiply by 0xC4CEB9FE1A85EC53, xor-shift 33): buffers
  // exported by an earlier build must still verify, so the shared finalizer may never change.
  STATIC_REQUIRE(slimserve::detail::mix64(0) == 0);
  STATIC_REQUIRE(slimserve::detail::mix64(1) == 0xB456BCFC34C2CB2Cull);
  STATIC_REQUIRE(slimserve::detail::mix64(0x0123456789ABCDEFull) == 0x87CBFBFE89022CEAull);
  STATIC_REQUIRE(slimserve::detail::mix64(~0ull) == 0x64B5720B4B825F21ull);
  STATIC_REQUIRE(record_word_term(48, 0xDEADBEEFu) == 0x4728E2D7DEFC65B7ull);
}
