#pragma once
/// \file
/// \brief Paged decode attention on CUDA cores: K/V read once in their stored type, converted
/// in registers, online softmax in FP32.
///
/// One block per (work item = request x KV split, KV head). Thread layout, fastest first:
///   lane  [0, lanes)        16 bytes of the stored head vector (lanes = head_dim / elements)
///   row   [0, padded_rows)  query row of this KV head: (query token, head of the GQA group)
///   group [0, token_groups) which tokens of a tile this copy of the rows handles
/// so every query head of the group is served by the block that reads the K/V once.
/// K/V tiles move global -> registers (prefetch of tile i+1 overlaps compute on tile i) ->
/// shared memory, where every row reads them. Scores are kept in log2 units (the query is
/// pre-multiplied by sm_scale * log2(e) * k_scale) so the softmax uses exp2.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

inline constexpr float log2_e = 1.4426950408889634f;
inline constexpr float ln_2 = 0.6931471805599453f;

struct DecodeParams {
  // Cache.
  const void* k_pages;  // [num_pages, page_size, H_kv, D] (NHD) or [num_pages, H_kv, page_size, D]
  const void* v_pages;
  const float* k_scale;  // per_tensor
  const float* v_scale;
  const float* k_token_scales;  // per_token: pages' layout with D = 1
  const float* v_token_scales;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t page_shift;  // log2(page_size)
  std::int32_t num_kv_heads;
  KvLayout layout;
  KvScaleMode scale_mode;
  // Page table and verdicts.
  const std::int32_t* indptr;         // [B + 1]
  const std::int32_t* indices;        // [indptr[B]]
  const std::int32_t* last_page_len;  // [B]
  const kv::RequestStatus* status;    // [B] or null
  // Queries and outputs.
  const void* q;  // [B * query_tokens, H_qo, D]
  void* o;        // [B * query_tokens, H_qo, D]
  float* lse;     // [B * query_tokens, H_qo] natural log, or null
  std::int32_t num_qo_heads;
  std::int32_t group_size;    // H_qo / H_kv
  std::int32_t query_tokens;  // per request
  float sm_scale;
  // Block shape (see decode_block_shape).
  std::int32_t rows;
  std::int32_t padded_rows;
  std::int32_t token_groups;
  // Plan (workspace).
  const std::int32_t* work_request;  // [W]
  const std::int32_t* work_split;    // [W]
  const std::int32_t* split_indptr;  // [B + 1]
  std::int32_t chunk_tokens;
  bool split_kv;
  float* partial_o;    // [W, query_tokens, H_qo, D]
  float* partial_lse;  // [W, query_tokens, H_qo]
};

/// Tile geometry for a stored type and head_dim: 8 KiB of K and 8 KiB of V per tile.
template <class KvT, int HeadDim>
struct DecodeTile {
  static constexpr int elements = vector_elements<KvT>;
  static constexpr int lanes = HeadDim / elements;
  static constexpr int tokens = 8192 / (HeadDim * static_cast<int>(sizeof(KvT)));
  static constexpr int chunks = tokens * lanes;  // 16-byte chunks of K (and of V) per tile
  static constexpr int min_threads = 128;
  static constexpr int max_threads = 512;
  static constexpr int chunks_per_thread = chunks / min_threads;
  static_assert(lanes <= 32 && (lanes & (lanes - 1)) == 0, "a head vector fits one warp");
  static_assert(chunks % min_threads == 0, "whole chunks per thread");
  static_assert(tokens <= min_threads, "one thread stages each token's scales and page check");
};

template <class KvT, int HeadDim>
struct DecodeSharedStorage {
  using Tile = DecodeTile<KvT, HeadDim>;
  union {
    struct {
      Vec16 k[Tile::chunks];  // [tokens, lanes]
      Vec16 v[Tile::chunks];
    } tile;
    // Cross-group merge; only used when token_groups > 1, which implies 128 threads.
    struct {
      float acc[Tile::min_threads * Tile::elements];  // [threads, elements]
      float max[Tile::min_threads];                    // per thread (lane 0 of a group writes)
      float sum[Tile::min_threads];
    } merge;
  } u;
  float k_token_scale[Tile::tokens];
  float v_token_scale[Tile::tokens];
  std::int32_t token_ok[Tile::tokens];  // page id inside the cache
};

/// NVFP4: a lane takes one block of a head vector, 8 bytes of codes (16 elements) and its
/// E4M3 scale. Staged as one Vec16 per lane: words 0-1 the codes (element k of a word in bits
/// 4k..4k+3), word 2 the block scale already widened to FP32 (so it is decoded once per
/// token, not once per query row). Vectors are 9 * HeadDim / 16 bytes, only 4-byte aligned
/// at head_dim 64, so the codes are two 4-byte loads and the scale a byte load.
template <int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE Vec16 load_nvfp4_block(const std::uint8_t* vector, int block) {
  static_assert((HeadDim / 2 + HeadDim / nvfp4_block_elements) % 4 == 0, "4-byte aligned vectors");
  Vec16 v = {};
  const std::uint8_t* codes = vector + block * nvfp4_block_code_bytes;
#if defined(__CUDACC__)
  v.word[0] = *reinterpret_cast<const std::uint32_t*>(codes);
  v.word[1] = *reinterpret_cast<const std::uint32_t*>(codes + 4);
#else
  std::memcpy(&v.word[0], codes, 8);
#endif
  const float scale = to_float(fp8_e4m3::from_bits(vector[HeadDim / 2 + block]));
  std::memcpy(&v.word[2], &scale, sizeof(scale));
  return v;
}

/// The 16 elements of a staged NVFP4 block: e2m1 * e4m3, exact in FP32 (at most 6 significant bits: 1.5 x 1.875).
/// A NaN block scale (0x7F) decodes the block to NaN, as the paged attention does.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void unpack_nvfp4_block(const Vec16& v, float (&out)[16]) {
  float scale;
  std::memcpy(&scale, &v.word[2], sizeof(scale));
SLIMSERVE_ATTENTION_UNROLL
  for (int w = 0; w < 2; ++w) {
SLIMSERVE_ATTENTION_UNROLL
    for (int k = 0; k < 8; ++k) out[8 * w + k] = to_float(nvfp4_code_at(v.word[w], k)) * scale;
  }
}

/// Sum over the `Lanes` threads of a head vector.
template <int Lanes>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float group_sum(float x) {
SLIMSERVE_ATTENTION_UNROLL
  for (int offset = Lanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// Tokens of request b per the device page table; -1 when the table is inconsistent.
SLIMSERVE_DEVICE inline std::int64_t device_request_length(const DecodeParams& p, std::int32_t b) {
  const std::int32_t pages = p.indptr[b + 1] - p.indptr[b];
  if (pages == 0) return 0;
  const std::int32_t last = p.last_page_len[b];
  if (pages < 0 || last < 1 || last > p.page_size) return -1;
  return (static_cast<std::int64_t>(pages - 1) << p.page_shift) + last;
}

template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(512) decode_kernel(const DecodeParams p) {
  using Tile = DecodeTile<KvT, HeadDim>;
  constexpr int E = Tile::elements;
  constexpr int lanes = Tile::lanes;
  constexpr bool block_scaled = std::is_same_v<KvT, nvfp4>;
  static_assert(!block_scaled || E == nvfp4_block_elements, "an NVFP4 lane holds one block");
  auto& smem = rt::shared_storage<DecodeSharedStorage<KvT, HeadDim>>();

  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = tid % lanes;
  const int row = (tid / lanes) % p.padded_rows;
  const int group = tid / (lanes * p.padded_rows);
  const std::int32_t work = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t kv_head = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t b = p.work_request[work];
  const std::int32_t split = p.work_split[work];

  // Query row -> (token of the request, query head).
  const bool row_valid = row < p.rows;
  const std::int32_t q_token = row / p.group_size;
  const std::int32_t qo_head = kv_head * p.group_size + row % p.group_size;
  const std::int64_t out_row =
      (static_cast<std::int64_t>(b) * p.query_tokens + q_token) * p.num_qo_heads + qo_head;
  const bool writer = row_valid && group == 0;

  const std::int64_t length = device_request_length(p, b);
  const bool aborted = length < 0 || (p.status != nullptr && !kv::request_ok(p.status[b]));
  if (aborted) {
    // No page is read. Unsplit: mark the output (NaN, lse = -inf). Split: mark the partial
    // (lse = NaN), which the merge kernel turns into the same marked output.
    if (writer) {
      if (p.split_kv) {
        if (lane == 0) {
          p.partial_lse[(static_cast<std::int64_t>(work) * p.query_tokens + q_token) * p.num_qo_heads +
                        qo_head] = NAN;
        }
      } else {
        QT* o = static_cast<QT*>(p.o) + out_row * HeadDim + lane * E;
        for (int i = 0; i < E; ++i) o[i] = from_float<QT>(NAN);
        if (p.lse != nullptr && lane == 0) p.lse[out_row] = -INFINITY;
      }
    }
    return;
  }

  // This block's token range.
  const std::int32_t num_splits = p.split_indptr[b + 1] - p.split_indptr[b];
  const std::int64_t begin = static_cast<std::int64_t>(split) * p.chunk_tokens;
  const std::int64_t end =
      split == num_splits - 1 ? length : (length < begin + p.chunk_tokens ? length : begin + p.chunk_tokens);
  // Causal limit of speculative rows: token t of q sees positions <= length - q + t.
  const std::int64_t row_limit = length - p.query_tokens + q_token;

  // Query in registers, pre-scaled into log2 units.
  float q[E];
  {
    float k_static = p.scale_mode == KvScaleMode::per_tensor ? *p.k_scale : 1.0f;
    if constexpr (block_scaled) k_static = nvfp4_checked_tensor_scale(k_static);
    const float factor = p.sm_scale * log2_e * k_static;
    const QT* q_ptr = static_cast<const QT*>(p.q) + out_row * HeadDim + lane * E;
    constexpr int q_vectors = E / vector_elements<QT>;  // 1 (16-bit cache) or 2 (FP8)
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < q_vectors; ++j) {
      Vec16 raw = {};
      if (row_valid) raw = load16(q_ptr + j * vector_elements<QT>);
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < vector_elements<QT>; ++i) {
        q[j * vector_elements<QT> + i] = element_to_float<QT>(raw, i) * factor;
      }
    }
  }

  float acc[E];
SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < E; ++i) acc[i] = 0.0f;
  float running_max = -INFINITY;
  float running_sum = 0.0f;

  const std::int32_t page_base = p.indptr[b];
  const KvT* k_pages = static_cast<const KvT*>(p.k_pages);
  const KvT* v_pages = static_cast<const KvT*>(p.v_pages);
  const bool per_token = p.scale_mode == KvScaleMode::per_token;

  // Registers of the tile being fetched.
  Vec16 k_fetch[Tile::chunks_per_thread];
  Vec16 v_fetch[Tile::chunks_per_thread];
  float k_scale_fetch = 1.0f, v_scale_fetch = 1.0f;
  std::int32_t ok_fetch = 0;

  auto page_of = [&](std::int64_t position) -> std::int32_t {
    const std::int32_t page = p.indices[page_base + static_cast<std::int32_t>(position >> p.page_shift)];
    return (page >= 0 && page < p.num_pages) ? page : -1;
  };
  auto fetch = [&](std::int64_t tile_begin, int count) {
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < Tile::chunks_per_thread; ++j) {
      const int chunk = tid + j * threads;
      k_fetch[j] = Vec16{};
      v_fetch[j] = Vec16{};
      const int t = chunk / lanes;
      if (chunk < Tile::chunks && t < count) {
        const std::int64_t position = tile_begin + t;
        const std::int32_t page = page_of(position);
        if (page >= 0) {
          if constexpr (block_scaled) {
            // Packed pages (the preflight refuses other strides): vector index * vector bytes.
            constexpr std::int64_t vector_bytes = HeadDim / 2 + HeadDim / nvfp4_block_elements;
            const std::int64_t offset =
                cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, page,
                             static_cast<std::int32_t>(position & (p.page_size - 1)), kv_head, 0) *
                vector_bytes;
            k_fetch[j] = load_nvfp4_block<HeadDim>(&k_pages[offset].bits, chunk % lanes);
            v_fetch[j] = load_nvfp4_block<HeadDim>(&v_pages[offset].bits, chunk % lanes);
          } else {
            const std::int64_t offset =
                cache_offset(p.layout, p.page_size, p.num_kv_heads, HeadDim, page,
                             static_cast<std::int32_t>(position & (p.page_size - 1)), kv_head,
                             (chunk % lanes) * E);
            k_fetch[j] = load16(k_pages + offset);
            v_fetch[j] = load16(v_pages + offset);
          }
        }
      }
    }
    if (tid < count) {
      const std::int64_t position = tile_begin + tid;
      const std::int32_t page = page_of(position);
      ok_fetch = page >= 0;
      if (per_token && page >= 0) {
        const std::int64_t s = cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, page,
                                            static_cast<std::int32_t>(position & (p.page_size - 1)),
                                            kv_head, 0);
        k_scale_fetch = p.k_token_scales[s];
        v_scale_fetch = p.v_token_scales[s];
      }
    }
  };

  const std::int64_t span = end > begin ? end - begin : 0;
  const std::int64_t num_tiles = (span + Tile::tokens - 1) / Tile::tokens;
  auto tile_count = [&](std::int64_t i) {
    const std::int64_t left = span - i * Tile::tokens;
    return static_cast<int>(left < Tile::tokens ? left : Tile::tokens);
  };
  if (num_tiles > 0) fetch(begin, tile_count(0));

  for (std::int64_t i = 0; i < num_tiles; ++i) {
    const std::int64_t tile_begin = begin + i * Tile::tokens;
    const int count = tile_count(i);
    __syncthreads();  // the previous tile is no longer read
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < Tile::chunks_per_thread; ++j) {
      const int chunk = tid + j * threads;
      if (chunk < Tile::chunks) {
        smem.u.tile.k[chunk] = k_fetch[j];
        smem.u.tile.v[chunk] = v_fetch[j];
      }
    }
    if (tid < count) {
      smem.k_token_scale[tid] = k_scale_fetch;
      smem.v_token_scale[tid] = v_scale_fetch;
      smem.token_ok[tid] = ok_fetch;
    }
    __syncthreads();
    if (i + 1 < num_tiles) fetch(tile_begin + Tile::tokens, tile_count(i + 1));

    // Uniform trip count across the block: the shuffles need every lane.
    for (int base = 0; base < count; base += p.token_groups) {
      const int t = base + group;
      const bool in_tile = t < count;
      float k[E];
      if constexpr (block_scaled) {
        unpack_nvfp4_block(in_tile ? smem.u.tile.k[t * lanes + lane] : Vec16{}, k);
      } else {
        unpack<KvT>(in_tile ? smem.u.tile.k[t * lanes + lane] : Vec16{}, k);
      }
      float dot = 0.0f;
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < E; ++e) dot = fmaf(q[e], k[e], dot);
      dot = group_sum<lanes>(dot);
      if (!in_tile || !row_valid || smem.token_ok[t] == 0 || tile_begin + t > row_limit) continue;
      const float score = per_token ? dot * smem.k_token_scale[t] : dot;
      if (score > running_max) {
        const float rescale = exp2f(running_max - score);  // 0 on the first token
        running_sum *= rescale;
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < E; ++e) acc[e] *= rescale;
        running_max = score;
      }
      const float weight = exp2f(score - running_max);
      running_sum += weight;
      const float v_weight = per_token ? weight * smem.v_token_scale[t] : weight;
      float v[E];
      if constexpr (block_scaled) {
        unpack_nvfp4_block(smem.u.tile.v[t * lanes + lane], v);
      } else {
        unpack<KvT>(smem.u.tile.v[t * lanes + lane], v);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < E; ++e) acc[e] = fmaf(v_weight, v[e], acc[e]);
    }
  }

  // Fold the token groups into group 0.
  if (p.token_groups > 1) {
    __syncthreads();  // tiles are dead; the merge scratch overlays them
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < E; ++e) smem.u.merge.acc[tid * E + e] = acc[e];
    smem.u.merge.max[tid] = running_max;
    smem.u.merge.sum[tid] = running_sum;
    __syncthreads();
    if (group == 0) {
      float total_max = running_max;
      for (int g = 1; g < p.token_groups; ++g) {
        total_max = fmaxf(total_max, smem.u.merge.max[tid + g * lanes * p.padded_rows]);
      }
      if (total_max != -INFINITY) {
        float total_sum = 0.0f;
        float total[E];
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < E; ++e) total[e] = 0.0f;
        for (int g = 0; g < p.token_groups; ++g) {
          const int other = tid + g * lanes * p.padded_rows;
          const float w = exp2f(smem.u.merge.max[other] - total_max);  // 0 for empty groups
          total_sum += w * smem.u.merge.sum[other];
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < E; ++e) total[e] = fmaf(w, smem.u.merge.acc[other * E + e], total[e]);
        }
        running_sum = total_sum;
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < E; ++e) acc[e] = total[e];
      }
      running_max = total_max;
    }
  }
  if (!writer) return;

  // Normalized output (0 for an empty range) and natural-log LSE (-inf for an empty range).
  const bool empty = running_sum == 0.0f;
  float v_static = p.scale_mode == KvScaleMode::per_tensor ? *p.v_scale : 1.0f;
  if constexpr (block_scaled) v_static = nvfp4_checked_tensor_scale(v_static);
  float norm = empty ? 0.0f : v_static / running_sum;
  float lse = empty ? -INFINITY : (running_max + log2f(running_sum)) * ln_2;
  if constexpr (block_scaled) {
    // NaN scores never raise the running max, so an invalid K tensor scale could read as "no
    // visible token" (empty): mark the row NaN instead (a split's NaN partial lse merges to
    // the same marked row).
    if (std::isnan(nvfp4_checked_tensor_scale(*p.k_scale))) norm = lse = NAN;
  }
  if (p.split_kv) {
    const std::int64_t partial_row =
        (static_cast<std::int64_t>(work) * p.query_tokens + q_token) * p.num_qo_heads + qo_head;
    float* o = p.partial_o + partial_row * HeadDim + lane * E;
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < E; e += 4) {
      Vec16 packed;
      float four[4] = {acc[e] * norm, acc[e + 1] * norm, acc[e + 2] * norm, acc[e + 3] * norm};
      std::memcpy(&packed, four, sizeof(four));
      store16(o + e, packed);
    }
    if (lane == 0) p.partial_lse[partial_row] = lse;
  } else {
    QT out[E];
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < E; ++e) out[e] = from_float<QT>(acc[e] * norm);
    QT* o = static_cast<QT*>(p.o) + out_row * HeadDim + lane * E;
    constexpr int QE = vector_elements<QT>;
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < E / QE; ++j) {
      QT part[QE];
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < QE; ++i) part[i] = out[j * QE + i];
      store_packed(o + j * QE, part);
    }
    if (p.lse != nullptr && lane == 0) p.lse[out_row] = lse;
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
