"""ctypes declarations of slimserve's C ABI, generated from include/slimserve/c/slimserve.h
by tools/gen_capi.py: do not edit; run `python3 tools/gen_capi.py` after changing the header
(a test fails while this file and the header disagree)."""
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int8, c_int16,
                    c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

ABI_VERSION = 3

# ---- Enum constants -------------------------------------------------------------

SLIMSERVE_OK = 0
SLIMSERVE_INVALID_ARGUMENT = 1
SLIMSERVE_OUT_OF_RANGE = 2
SLIMSERVE_UNSUPPORTED = 3
SLIMSERVE_RESOURCE_EXHAUSTED = 4
SLIMSERVE_STALE_HANDLE = 5
SLIMSERVE_FAILED_PRECONDITION = 6
SLIMSERVE_DATA_LOSS = 7
SLIMSERVE_IO_ERROR = 8
SLIMSERVE_DEVICE_ERROR = 9
SLIMSERVE_INTERNAL = 10
SLIMSERVE_HOST_TO_DEVICE = 0
SLIMSERVE_DEVICE_TO_HOST = 1
SLIMSERVE_DEVICE_TO_DEVICE = 2
SLIMSERVE_REQUEST_OK = 0
SLIMSERVE_REQUEST_STALE_TAG = 1
SLIMSERVE_REQUEST_PAGE_OUT_OF_RANGE = 2
SLIMSERVE_REQUEST_BAD_PAGE_TABLE = 3
SLIMSERVE_REQUEST_GUARD_PAGE = 4
SLIMSERVE_REQUEST_WRITE_DENIED = 5
SLIMSERVE_REQUEST_READ_DENIED = 6
SLIMSERVE_REQUEST_UNWRITTEN_SLOTS = 7
SLIMSERVE_REQUEST_APPEND_NOT_NEXT = 8
SLIMSERVE_REQUEST_RECORD_MISMATCH = 9
SLIMSERVE_REQUEST_TAGS_NOT_SYNCED = 10
SLIMSERVE_KV_BF16 = 0
SLIMSERVE_KV_FP16 = 1
SLIMSERVE_KV_FP8_E4M3 = 2
SLIMSERVE_KV_FP8_E5M2 = 3
SLIMSERVE_KV_NVFP4 = 4
SLIMSERVE_ACT_BF16 = 0
SLIMSERVE_ACT_FP16 = 1
SLIMSERVE_KV_NHD = 0
SLIMSERVE_KV_HND = 1
SLIMSERVE_SCALE_NONE = 0
SLIMSERVE_SCALE_PER_TENSOR = 1
SLIMSERVE_SCALE_PER_TOKEN = 2
SLIMSERVE_KV_ROTATION_NONE = 0
SLIMSERVE_KV_ROTATION_KEYS = 1
SLIMSERVE_KV_ROTATION_KEYS_AND_VALUES = 2
SLIMSERVE_SWAP_OUT = 0
SLIMSERVE_SWAP_IN = 1
SLIMSERVE_WEIGHT_F32 = 0
SLIMSERVE_WEIGHT_F16 = 1
SLIMSERVE_WEIGHT_BF16 = 2
SLIMSERVE_WEIGHT_K_BY_N = 0
SLIMSERVE_WEIGHT_N_BY_K = 1
SLIMSERVE_MASK_CAUSAL = 0
SLIMSERVE_MASK_NONE = 1
SLIMSERVE_KERNEL_TENSOR_CORE = 0
SLIMSERVE_KERNEL_CUDA_CORE = 1
SLIMSERVE_MLA_SCALE_NONE = 0
SLIMSERVE_MLA_SCALE_PER_TENSOR = 1
SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP = 2
SLIMSERVE_MOE_GATE_UP_SILU = 0
SLIMSERVE_MOE_DOWN_WEIGHTED_SUM = 1
SLIMSERVE_MOE_ALIGN_AUTOMATIC = 0
SLIMSERVE_MOE_ALIGN_SERIAL = 1
SLIMSERVE_MOE_ALIGN_DEVICE = 2
SLIMSERVE_SCALING_PER_WEIGHT = 0
SLIMSERVE_SCALING_PER_GROUP_SUM = 1
SLIMSERVE_CACHE_PAGED_KV = 0
SLIMSERVE_CACHE_MLA_LATENT = 1

# ---- Structs (header order) ------------------------------------------------------


class Page(Structure):
    """slimserve_page"""
    _fields_ = [
        ("id", c_int32),
        ("tag", c_uint32),
    ]


class AppendTarget(Structure):
    """slimserve_append_target"""
    _fields_ = [
        ("page", Page),
        ("copy_from", Page),
        ("needs_copy", c_int32),
    ]


class RequestRef(Structure):
    """slimserve_request_ref"""
    _fields_ = [
        ("slot", c_int32),
        ("writer", c_uint32),
    ]


class PagePlan(Structure):
    """slimserve_page_plan"""
    _fields_ = [
        ("needs_copy", c_int32),
        ("copy_from", Page),
        ("copy_to", Page),
        ("copy_tokens", c_int32),
        ("cached_tokens", c_int64),
    ]


class PageTableView(Structure):
    """slimserve_page_table_view"""
    _fields_ = [
        ("indptr", c_void_p),
        ("indices", c_void_p),
        ("last_page_len", c_void_p),
        ("expected_tags", c_void_p),
        ("batch_size", c_int32),
        ("page_size", c_int32),
    ]


class RequestPages(Structure):
    """slimserve_request_pages"""
    _fields_ = [
        ("pages", POINTER(Page)),
        ("num_pages", c_size_t),
        ("num_tokens", c_int64),
    ]


class RequestStatus(Structure):
    """slimserve_request_status"""
    _fields_ = [
        ("state", c_int32),
        ("failed_slot", c_int32),
    ]


class TagCheckArgs(Structure):
    """slimserve_tag_check_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("table", POINTER(PageTableView)),
        ("tags", c_void_p),
        ("writers", c_void_p),
        ("append_indptr", c_void_p),
        ("statuses", c_void_p),
        ("aborted_count", c_void_p),
        ("num_entries", c_void_p),
        ("entry_capacity", c_int64),
        ("check_fill", c_int32),
        ("built_at_pool", c_uint32),
        ("built_at_epoch", c_uint64),
        ("device_built_at", c_void_p),
    ]


class KvCache(Structure):
    """slimserve_kv_cache"""
    _fields_ = [
        ("k_pages", c_void_p),
        ("v_pages", c_void_p),
        ("k_scale", c_void_p),
        ("v_scale", c_void_p),
        ("k_token_scales", c_void_p),
        ("v_token_scales", c_void_p),
        ("num_pages", c_int32),
        ("page_size", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("dtype", c_int32),
        ("layout", c_int32),
        ("scale_mode", c_int32),
    ]


class AppendArgs(Structure):
    """slimserve_append_args"""
    _fields_ = [
        ("k_new", c_void_p),
        ("v_new", c_void_p),
        ("input_dtype", c_int32),
        ("num_tokens", c_int32),
        ("token_request", c_void_p),
        ("token_position", c_void_p),
        ("append_indptr", c_void_p),
    ]


class DecodeProblem(Structure):
    """slimserve_decode_problem"""
    _fields_ = [
        ("batch_size", c_int32),
        ("num_qo_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("page_size", c_int32),
        ("query_tokens", c_int32),
        ("kv_dtype", c_int32),
    ]


class DecodeArgs(Structure):
    """slimserve_decode_args"""
    _fields_ = [
        ("q", c_void_p),
        ("o", c_void_p),
        ("lse", c_void_p),
        ("q_dtype", c_int32),
        ("sm_scale", c_float),
    ]


class PageCopy(Structure):
    """slimserve_page_copy"""
    _fields_ = [
        ("src", c_int32),
        ("src_tag", c_uint32),
        ("dst", c_int32),
        ("dst_tag", c_uint32),
        ("writer", c_uint32),
        ("tokens", c_int32),
    ]


class PageSwap(Structure):
    """slimserve_page_swap"""
    _fields_ = [
        ("page", c_int32),
        ("tag", c_uint32),
        ("writer", c_uint32),
        ("host_slot", c_int32),
    ]


class RequestPagesView(Structure):
    """slimserve_request_pages_view"""
    _fields_ = [
        ("pages", c_void_p),
        ("tags", c_void_p),
        ("num_pages", c_int32),
        ("num_tokens", c_int64),
        ("writer", c_uint32),
    ]


class RecordIdentity(Structure):
    """slimserve_record_identity"""
    _fields_ = [
        ("pool", c_uint32),
        ("writer", c_uint32),
        ("sequence", c_uint32),
    ]


class SwapArgs(Structure):
    """slimserve_swap_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", KvCache),
        ("tags", c_void_p),
        ("host_records", c_void_p),
        ("host_slots", c_int32),
        ("num_swaps", c_int32),
        ("swaps", c_void_p),
        ("direction", c_int32),
        ("statuses", c_void_p),
        ("identities", c_void_p),
    ]


class ExportArgs(Structure):
    """slimserve_export_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", KvCache),
        ("tags", c_void_p),
        ("request", RequestPagesView),
        ("buffer", c_void_p),
        ("buffer_bytes", c_int64),
        ("status", c_void_p),
        ("identity", RecordIdentity),
    ]


class ImportArgs(Structure):
    """slimserve_import_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", KvCache),
        ("tags", c_void_p),
        ("request", RequestPagesView),
        ("buffer", c_void_p),
        ("buffer_bytes", c_int64),
        ("header", c_void_p),
        ("header_bytes", c_size_t),
        ("status", c_void_p),
        ("expected", RecordIdentity),
    ]


class QuantizeOptions(Structure):
    """slimserve_quantize_options"""
    _fields_ = [
        ("group_size", c_int64),
        ("symmetric", c_int32),
        ("activation", c_int32),
    ]


class Int4WeightsInfo(Structure):
    """slimserve_int4_weights_info"""
    _fields_ = [
        ("k", c_int64),
        ("n", c_int64),
        ("group_size", c_int64),
        ("packed", POINTER(c_uint32)),
        ("packed_bytes", c_size_t),
        ("scales", POINTER(c_uint16)),
        ("scales_bytes", c_size_t),
        ("zeros", POINTER(c_uint16)),
        ("zeros_bytes", c_size_t),
    ]


class GemmArgs(Structure):
    """slimserve_gemm_args"""
    _fields_ = [
        ("activation", c_int32),
        ("m", c_int64),
        ("n", c_int64),
        ("k", c_int64),
        ("group_size", c_int64),
        ("a", c_void_p),
        ("b", c_void_p),
        ("scales", c_void_p),
        ("zeros", c_void_p),
        ("bias", c_void_p),
        ("c", c_void_p),
    ]


class BlockTableView(Structure):
    """slimserve_block_table_view"""
    _fields_ = [
        ("block_table", c_void_p),
        ("expected_tags", c_void_p),
        ("seq_lens", c_void_p),
        ("batch_size", c_int32),
        ("max_pages_per_request", c_int32),
        ("page_size", c_int32),
    ]


class PagedAttentionProblem(Structure):
    """slimserve_paged_attention_problem"""
    _fields_ = [
        ("batch_size", c_int32),
        ("num_qo_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("page_size", c_int32),
        ("kv_dtype", c_int32),
        ("q_dtype", c_int32),
        ("mask", c_int32),
    ]


class PagedAttentionPlanArgs(Structure):
    """slimserve_paged_attention_plan_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("problem", PagedAttentionProblem),
        ("qo_indptr_host", c_void_p),
        ("kv_indptr_host", c_void_p),
        ("last_page_len_host", c_void_p),
        ("seq_lens_host", c_void_p),
        ("num_sms", c_int32),
        ("ctas_per_sm", c_int32),
        ("min_chunk_tokens", c_int32),
        ("disable_split", c_int32),
        ("warpgroup_mma", c_int32),
    ]


class PagedAttentionBound(Structure):
    """slimserve_paged_attention_bound"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("problem", PagedAttentionProblem),
        ("max_total_qo_tokens", c_int64),
        ("max_kv_tokens", c_int64),
        ("num_sms", c_int32),
        ("ctas_per_sm", c_int32),
    ]


class PagedAttentionPlanInfo(Structure):
    """slimserve_paged_attention_plan_info"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("kernel", c_int32),
        ("split_kv", c_int32),
        ("chunk_tokens", c_int32),
        ("num_work_items", c_int32),
        ("workspace_bytes", c_size_t),
        ("reason", c_char_p),
    ]


class PagedAttentionArgs(Structure):
    """slimserve_paged_attention_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", KvCache),
        ("kv_page_stride", c_int64),
        ("table", POINTER(PageTableView)),
        ("block_table", POINTER(BlockTableView)),
        ("statuses", c_void_p),
        ("qo_indptr", c_void_p),
        ("q", c_void_p),
        ("o", c_void_p),
        ("lse", c_void_p),
        ("q_token_stride", c_int64),
        ("q_head_stride", c_int64),
        ("o_token_stride", c_int64),
        ("o_head_stride", c_int64),
        ("sm_scale", c_float),
        ("sliding_window", c_int32),
        ("logit_soft_cap", c_float),
        ("sinks", c_void_p),
        ("chunk_k", c_void_p),
        ("chunk_v", c_void_p),
        ("chunk_token_stride", c_int64),
        ("chunk_head_stride", c_int64),
        ("rotation", c_int32),
        ("reserved", c_int32),
    ]


class MergeArgs(Structure):
    """slimserve_merge_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("partial_o", c_void_p),
        ("partial_lse", c_void_p),
        ("split_indptr", c_void_p),
        ("batch_size", c_int32),
        ("rows_per_request", c_int32),
        ("head_dim", c_int32),
        ("out_dtype", c_int32),
        ("o", c_void_p),
        ("lse", c_void_p),
    ]


class KvAppendArgs(Structure):
    """slimserve_kv_append_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", KvCache),
        ("kv_page_stride", c_int64),
        ("table", POINTER(PageTableView)),
        ("statuses", c_void_p),
        ("k_new", c_void_p),
        ("v_new", c_void_p),
        ("input_dtype", c_int32),
        ("num_tokens", c_int32),
        ("token_request", c_void_p),
        ("token_position", c_void_p),
        ("append_indptr", c_void_p),
        ("slot_mapping", c_void_p),
        ("k_row_stride", c_int64),
        ("v_row_stride", c_int64),
        ("rotation", c_int32),
        ("reserved", c_int32),
    ]


class RotateHeadsArgs(Structure):
    """slimserve_rotate_heads_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("input", c_void_p),
        ("output", c_void_p),
        ("dtype", c_int32),
        ("num_tokens", c_int32),
        ("num_heads", c_int32),
        ("head_dim", c_int32),
        ("input_row_stride", c_int64),
        ("output_row_stride", c_int64),
    ]


class RuntimeCounters(Structure):
    """slimserve_runtime_counters"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("synchronizations", c_int64),
        ("allocations", c_int64),
        ("frees", c_int64),
        ("copies", c_int64),
    ]


class MlaCache(Structure):
    """slimserve_mla_cache"""
    _fields_ = [
        ("pages", c_void_p),
        ("latent_scale", c_void_p),
        ("num_pages", c_int32),
        ("page_size", c_int32),
        ("dtype", c_int32),
        ("scale_mode", c_int32),
    ]


class MlaAppendArgs(Structure):
    """slimserve_mla_append_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", MlaCache),
        ("table", POINTER(PageTableView)),
        ("statuses", c_void_p),
        ("latent_new", c_void_p),
        ("rope_new", c_void_p),
        ("latent_stride", c_int64),
        ("rope_stride", c_int64),
        ("input_dtype", c_int32),
        ("num_tokens", c_int32),
        ("token_request", c_void_p),
        ("token_position", c_void_p),
        ("append_indptr", c_void_p),
    ]


class MlaProblem(Structure):
    """slimserve_mla_problem"""
    _fields_ = [
        ("batch_size", c_int32),
        ("num_heads", c_int32),
        ("query_tokens", c_int32),
        ("page_size", c_int32),
        ("kv_dtype", c_int32),
        ("scale_mode", c_int32),
        ("q_dtype", c_int32),
        ("ragged_queries", c_int32),
    ]


class MlaPlanArgs(Structure):
    """slimserve_mla_plan_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("problem", MlaProblem),
        ("kv_indptr_host", c_void_p),
        ("last_page_len_host", c_void_p),
        ("seq_lens_host", c_void_p),
        ("qo_indptr_host", c_void_p),
        ("num_sms", c_int32),
        ("ctas_per_sm", c_int32),
        ("min_chunk_tokens", c_int32),
        ("disable_split", c_int32),
        ("warpgroup_mma", c_int32),
    ]


class MlaBound(Structure):
    """slimserve_mla_bound"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("problem", MlaProblem),
        ("num_sms", c_int32),
        ("ctas_per_sm", c_int32),
        ("warpgroup_mma", c_int32),
    ]


class MlaDecodeArgs(Structure):
    """slimserve_mla_decode_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", MlaCache),
        ("table", POINTER(PageTableView)),
        ("block_table", POINTER(BlockTableView)),
        ("statuses", c_void_p),
        ("q", c_void_p),
        ("o", c_void_p),
        ("lse", c_void_p),
        ("q_token_stride", c_int64),
        ("q_head_stride", c_int64),
        ("o_token_stride", c_int64),
        ("o_head_stride", c_int64),
        ("sm_scale", c_float),
    ]


class MlaGatherArgs(Structure):
    """slimserve_mla_gather_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("cache", MlaCache),
        ("table", POINTER(PageTableView)),
        ("statuses", c_void_p),
        ("token_indptr", c_void_p),
        ("out", c_void_p),
        ("out_stride", c_int64),
        ("num_rows", c_int32),
    ]


class MoeRoutingArgs(Structure):
    """slimserve_moe_routing_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("num_tokens", c_int64),
        ("top_k", c_int64),
        ("num_experts", c_int64),
        ("topk_ids", c_void_p),
        ("max_tokens", c_int64),
        ("align", c_int32),
    ]


class MoeRoutingStatus(Structure):
    """slimserve_moe_routing_status"""
    _fields_ = [
        ("invalid_pairs", c_int32),
        ("first_invalid", c_int32),
        ("first_id", c_int32),
        ("reserved", c_int32),
    ]


class MoeRouting(Structure):
    """slimserve_moe_routing"""
    _fields_ = [
        ("topk_ids", c_void_p),
        ("tile_expert", c_void_p),
        ("tile_rows", c_void_p),
        ("tiles_used", c_void_p),
        ("status", c_void_p),
        ("num_tokens", c_int64),
        ("top_k", c_int64),
        ("num_experts", c_int64),
        ("max_tiles", c_int64),
    ]


class MoeGemmArgs(Structure):
    """slimserve_moe_gemm_args"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("activation", c_int32),
        ("epilogue", c_int32),
        ("num_tokens", c_int64),
        ("top_k", c_int64),
        ("num_experts", c_int64),
        ("k", c_int64),
        ("n", c_int64),
        ("group_size", c_int64),
        ("a", c_void_p),
        ("b", c_void_p),
        ("scales", c_void_p),
        ("zeros", c_void_p),
        ("topk_ids", c_void_p),
        ("topk_weights", c_void_p),
        ("c", c_void_p),
        ("max_tokens", c_int64),
    ]


class MoeGemmPlanInfo(Structure):
    """slimserve_moe_gemm_plan_info"""
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int64),
        ("max_tiles", c_int64),
        ("workspace_bytes", c_size_t),
        ("scaling", c_int32),
    ]


class CacheArray(Structure):
    """slimserve_cache_array"""
    _fields_ = [
        ("address", c_uint64),
        ("page_stride", c_int64),
        ("bytes", c_int64),
    ]


class CacheLayout(Structure):
    """slimserve_cache_layout"""
    _fields_ = [
        ("magic", c_uint32),
        ("version", c_uint32),
        ("kind", c_uint8),
        ("dtype", c_uint8),
        ("layout", c_uint8),
        ("scale_mode", c_uint8),
        ("num_pages", c_int32),
        ("page_size", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("token_bytes", c_int32),
        ("num_arrays", c_int32),
        ("reserved", c_int32),
        ("k", CacheArray),
        ("v", CacheArray),
        ("k_scales", CacheArray),
        ("v_scales", CacheArray),
    ]


class TransferEntry(Structure):
    """slimserve_transfer_entry"""
    _fields_ = [
        ("src", c_uint64),
        ("dst", c_uint64),
        ("bytes", c_int64),
    ]


# ---- Functions: name -> (restype, argtypes), header order ---------------------

SIGNATURES = {
    "slimserve_last_error": (c_char_p, []),
    "slimserve_status_name": (c_char_p, [c_int32]),
    "slimserve_c_abi_version": (c_int32, []),
    "slimserve_version": (c_int32, []),
    "slimserve_is_emulated": (c_int32, []),
    "slimserve_device_alloc": (c_int32, [c_size_t, POINTER(c_void_p)]),
    "slimserve_device_free": (c_int32, [c_void_p]),
    "slimserve_memcpy_async": (c_int32, [c_void_p, c_void_p, c_size_t, c_int32, c_void_p]),
    "slimserve_memset_async": (c_int32, [c_void_p, c_int32, c_size_t, c_void_p]),
    "slimserve_stream_synchronize": (c_int32, [c_void_p]),
    "slimserve_host_alloc": (c_int32, [c_size_t, POINTER(c_void_p)]),
    "slimserve_host_free": (c_int32, [c_void_p]),
    "slimserve_page_pool_create": (c_int32, [c_int32, POINTER(c_void_p)]),
    "slimserve_page_pool_destroy": (None, [c_void_p]),
    "slimserve_page_pool_allocate": (c_int32, [c_void_p, POINTER(Page), c_size_t]),
    "slimserve_page_pool_release": (c_int32, [c_void_p, POINTER(Page), c_size_t]),
    "slimserve_page_pool_share": (c_int32, [c_void_p, Page]),
    "slimserve_page_pool_validate": (c_int32, [c_void_p, Page]),
    "slimserve_page_pool_available": (c_int32, [c_void_p]),
    "slimserve_page_pool_prepare_append": (c_int32, [c_void_p, Page, POINTER(AppendTarget)]),
    "slimserve_prefix_cache_create": (c_int32, [c_void_p, c_int32, c_uint64, POINTER(c_void_p)]),
    "slimserve_prefix_cache_destroy": (None, [c_void_p]),
    "slimserve_prefix_cache_match": (c_int32, [c_void_p, c_void_p, c_size_t, c_uint64, c_uint64, POINTER(Page), c_size_t, c_void_p]),
    "slimserve_prefix_cache_insert": (c_int32, [c_void_p, c_void_p, c_size_t, c_uint64, c_uint64, POINTER(Page), c_size_t, c_void_p]),
    "slimserve_request_sets_create": (c_int32, [c_void_p, c_void_p, c_int32, c_int32, POINTER(c_void_p)]),
    "slimserve_request_sets_destroy": (None, [c_void_p]),
    "slimserve_request_sets_admit": (c_int32, [c_void_p, c_void_p, c_size_t, c_uint64, c_uint64, POINTER(RequestRef), POINTER(PagePlan)]),
    "slimserve_request_sets_append": (c_int32, [c_void_p, RequestRef, c_int32, POINTER(PagePlan)]),
    "slimserve_request_sets_release_copy_sources": (None, [c_void_p]),
    "slimserve_request_sets_fork": (c_int32, [c_void_p, RequestRef, POINTER(RequestRef)]),
    "slimserve_request_sets_preempt": (c_int32, [c_void_p, RequestRef]),
    "slimserve_request_sets_resume": (c_int32, [c_void_p, RequestRef, c_void_p, c_size_t, c_uint64, c_uint64, POINTER(RequestRef), POINTER(PagePlan)]),
    "slimserve_request_sets_finish": (c_int32, [c_void_p, RequestRef, c_void_p, c_size_t, c_uint64, c_uint64]),
    "slimserve_request_sets_is_active": (c_int32, [c_void_p, RequestRef]),
    "slimserve_request_sets_pages": (c_int32, [c_void_p, RequestRef, POINTER(Page), c_size_t, c_void_p]),
    "slimserve_request_sets_tokens": (c_int64, [c_void_p, RequestRef]),
    "slimserve_request_sets_adopt": (c_int32, [c_void_p, POINTER(Page), c_size_t, c_int64, POINTER(RequestRef)]),
    "slimserve_page_table_create": (c_int32, [c_int32, c_int64, c_int32, c_int32, POINTER(c_void_p)]),
    "slimserve_page_table_destroy": (None, [c_void_p]),
    "slimserve_page_table_build": (c_int32, [c_void_p, POINTER(RequestPages), c_int32, c_void_p, POINTER(PageTableView), POINTER(PageTableView)]),
    "slimserve_device_tags_create": (c_int32, [c_int32, POINTER(c_void_p)]),
    "slimserve_device_tags_destroy": (None, [c_void_p]),
    "slimserve_device_tags_sync": (c_int32, [c_void_p, c_void_p, c_void_p]),
    "slimserve_check_page_tags": (c_int32, [POINTER(PageTableView), c_void_p, c_void_p, c_void_p, c_void_p]),
    "slimserve_check_page_tags_owned": (c_int32, [POINTER(PageTableView), c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "slimserve_check_page_tags_with": (c_int32, [POINTER(TagCheckArgs), c_void_p]),
    "slimserve_page_pool_table_age": (c_int32, [c_void_p, c_void_p, c_void_p]),
    "slimserve_device_tags_fills": (c_int32, [c_void_p, POINTER(c_void_p)]),
    "slimserve_append_kv": (c_int32, [POINTER(KvCache), POINTER(PageTableView), c_void_p, POINTER(AppendArgs), c_void_p]),
    "slimserve_decode_workspace_size": (c_int32, [POINTER(DecodeProblem), c_void_p, c_void_p, c_void_p]),
    "slimserve_decode_plan_create": (c_int32, [POINTER(DecodeProblem), c_void_p, c_void_p, c_void_p, c_size_t, c_void_p, POINTER(c_void_p)]),
    "slimserve_decode_plan_destroy": (None, [c_void_p]),
    "slimserve_decode_run": (c_int32, [c_void_p, POINTER(KvCache), POINTER(PageTableView), c_void_p, POINTER(DecodeArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_check_page_copies": (c_int32, [POINTER(KvCache), c_void_p, c_int32]),
    "slimserve_copy_pages": (c_int32, [POINTER(KvCache), c_void_p, c_void_p, c_int32, c_void_p, c_void_p]),
    "slimserve_page_record_bytes": (c_int64, [POINTER(KvCache)]),
    "slimserve_check_page_swaps": (c_int32, [POINTER(KvCache), c_void_p, c_int32, c_int32, c_int32]),
    "slimserve_swap_pages": (c_int32, [POINTER(KvCache), c_void_p, c_void_p, c_int32, c_void_p, c_int32, c_int32, c_void_p, c_void_p]),
    "slimserve_export_buffer_bytes": (c_int64, [POINTER(KvCache), c_int32]),
    "slimserve_export_request": (c_int32, [POINTER(KvCache), c_void_p, POINTER(RequestPagesView), c_void_p, c_int64, c_void_p, c_void_p]),
    "slimserve_import_request": (c_int32, [POINTER(KvCache), c_void_p, POINTER(RequestPagesView), c_void_p, c_int64, c_void_p, c_size_t, c_void_p, c_void_p]),
    "slimserve_swap_pages_with": (c_int32, [POINTER(SwapArgs), c_void_p]),
    "slimserve_export_request_with": (c_int32, [POINTER(ExportArgs), c_void_p]),
    "slimserve_import_request_with": (c_int32, [POINTER(ImportArgs), c_void_p]),
    "slimserve_read_buffer_identity": (c_int32, [c_void_p, c_size_t, c_void_p]),
    "slimserve_int4_quantize": (c_int32, [c_void_p, c_int32, c_int32, c_int64, c_int64, POINTER(QuantizeOptions), POINTER(c_void_p)]),
    "slimserve_int4_weights_destroy": (None, [c_void_p]),
    "slimserve_int4_weights_get_info": (c_int32, [c_void_p, POINTER(Int4WeightsInfo)]),
    "slimserve_int4_weights_dequantize": (c_int32, [c_void_p, c_void_p, c_size_t]),
    "slimserve_gemm_plan_create": (c_int32, [POINTER(GemmArgs), POINTER(c_void_p)]),
    "slimserve_gemm_plan_destroy": (None, [c_void_p]),
    "slimserve_gemm_plan_workspace_bytes": (c_size_t, [c_void_p]),
    "slimserve_gemm_run": (c_int32, [c_void_p, POINTER(GemmArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_validate_block_table": (c_int32, [POINTER(BlockTableView), c_int32]),
    "slimserve_check_block_tags": (c_int32, [POINTER(BlockTableView), c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "slimserve_paged_attention_workspace_size": (c_int32, [POINTER(PagedAttentionPlanArgs), c_void_p]),
    "slimserve_paged_attention_workspace_bound": (c_int32, [POINTER(PagedAttentionBound), c_void_p]),
    "slimserve_paged_attention_plan_create": (c_int32, [POINTER(PagedAttentionPlanArgs), c_void_p, c_size_t, c_void_p, POINTER(c_void_p)]),
    "slimserve_paged_attention_plan_destroy": (None, [c_void_p]),
    "slimserve_paged_attention_plan_get_info": (c_int32, [c_void_p, POINTER(PagedAttentionPlanInfo)]),
    "slimserve_paged_attention_run": (c_int32, [c_void_p, POINTER(PagedAttentionArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_merge_attention_states": (c_int32, [POINTER(MergeArgs), c_void_p]),
    "slimserve_dequantize_pages": (c_int32, [POINTER(KvCache), c_void_p, c_int32, c_void_p, c_void_p, c_void_p]),
    "slimserve_kv_append": (c_int32, [POINTER(KvAppendArgs), c_void_p]),
    "slimserve_rotate_heads": (c_int32, [POINTER(RotateHeadsArgs), c_void_p]),
    "slimserve_get_runtime_counters": (c_int32, [POINTER(RuntimeCounters)]),
    "slimserve_page_pool_new_writer": (c_int32, [c_void_p, c_void_p]),
    "slimserve_page_pool_grant_write": (c_int32, [c_void_p, Page, c_uint32]),
    "slimserve_page_pool_revoke_write": (c_int32, [c_void_p, Page]),
    "slimserve_mla_record_bytes": (c_int64, [c_int32, c_int32]),
    "slimserve_mla_append": (c_int32, [POINTER(MlaAppendArgs), c_void_p]),
    "slimserve_mla_workspace_size": (c_int32, [POINTER(MlaPlanArgs), c_void_p]),
    "slimserve_mla_workspace_bound": (c_int32, [POINTER(MlaBound), c_void_p]),
    "slimserve_mla_plan_create": (c_int32, [POINTER(MlaPlanArgs), c_void_p, c_size_t, c_void_p, POINTER(c_void_p)]),
    "slimserve_mla_plan_destroy": (None, [c_void_p]),
    "slimserve_mla_decode_run": (c_int32, [c_void_p, POINTER(MlaDecodeArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_mla_gather": (c_int32, [POINTER(MlaGatherArgs), c_void_p]),
    "slimserve_moe_routing_workspace_size": (c_int32, [POINTER(MoeRoutingArgs), c_void_p]),
    "slimserve_moe_routing_plan_create": (c_int32, [POINTER(MoeRoutingArgs), POINTER(c_void_p)]),
    "slimserve_moe_routing_plan_destroy": (None, [c_void_p]),
    "slimserve_moe_routing_run": (c_int32, [c_void_p, POINTER(MoeRoutingArgs), c_void_p, c_size_t, c_void_p, POINTER(MoeRouting)]),
    "slimserve_moe_routing_read_status": (c_int32, [POINTER(MoeRouting), c_void_p]),
    "slimserve_moe_validate_routing": (c_int32, [c_void_p, c_int64, c_int64, c_int64]),
    "slimserve_moe_gemm_workspace_size": (c_int32, [POINTER(MoeGemmArgs), c_void_p]),
    "slimserve_moe_gemm_plan_create": (c_int32, [POINTER(MoeGemmArgs), POINTER(c_void_p)]),
    "slimserve_moe_gemm_plan_destroy": (None, [c_void_p]),
    "slimserve_moe_gemm_plan_get_info": (c_int32, [c_void_p, POINTER(MoeGemmPlanInfo)]),
    "slimserve_moe_gemm_run": (c_int32, [c_void_p, POINTER(MoeGemmArgs), POINTER(MoeRouting), c_void_p, c_size_t, c_void_p]),
    "slimserve_describe_kv_cache": (c_int32, [POINTER(KvCache), c_int64, POINTER(CacheLayout)]),
    "slimserve_describe_mla_cache": (c_int32, [POINTER(MlaCache), POINTER(CacheLayout)]),
    "slimserve_cache_layout_parse": (c_int32, [c_void_p, c_size_t, POINTER(CacheLayout)]),
    "slimserve_cache_layout_check_compatible": (c_int32, [POINTER(CacheLayout), POINTER(CacheLayout)]),
    "slimserve_transfer_list_capacity": (c_int64, [POINTER(CacheLayout), c_int32]),
    "slimserve_build_transfer_list": (c_int32, [POINTER(CacheLayout), c_void_p, POINTER(CacheLayout), c_void_p, c_int32, c_int64, POINTER(TransferEntry), c_size_t, c_void_p]),
    "slimserve_coalesce_transfer_list": (c_int32, [POINTER(TransferEntry), c_size_t, c_void_p]),
    "slimserve_page_pool_writer": (c_uint32, [c_void_p, c_int32]),
    "slimserve_cache_registration_regions": (c_int32, [POINTER(CacheLayout), POINTER(CacheArray)]),
}

STRUCTS = (
    Page,
    AppendTarget,
    RequestRef,
    PagePlan,
    PageTableView,
    RequestPages,
    RequestStatus,
    TagCheckArgs,
    KvCache,
    AppendArgs,
    DecodeProblem,
    DecodeArgs,
    PageCopy,
    PageSwap,
    RequestPagesView,
    RecordIdentity,
    SwapArgs,
    ExportArgs,
    ImportArgs,
    QuantizeOptions,
    Int4WeightsInfo,
    GemmArgs,
    BlockTableView,
    PagedAttentionProblem,
    PagedAttentionPlanArgs,
    PagedAttentionBound,
    PagedAttentionPlanInfo,
    PagedAttentionArgs,
    MergeArgs,
    KvAppendArgs,
    RotateHeadsArgs,
    RuntimeCounters,
    MlaCache,
    MlaAppendArgs,
    MlaProblem,
    MlaPlanArgs,
    MlaBound,
    MlaDecodeArgs,
    MlaGatherArgs,
    MoeRoutingArgs,
    MoeRoutingStatus,
    MoeRouting,
    MoeGemmArgs,
    MoeGemmPlanInfo,
    CacheArray,
    CacheLayout,
    TransferEntry,
)

__all__ = [
    "Page",
    "AppendTarget",
    "RequestRef",
    "PagePlan",
    "PageTableView",
    "RequestPages",
    "RequestStatus",
    "TagCheckArgs",
    "KvCache",
    "AppendArgs",
    "DecodeProblem",
    "DecodeArgs",
    "PageCopy",
    "PageSwap",
    "RequestPagesView",
    "RecordIdentity",
    "SwapArgs",
    "ExportArgs",
    "ImportArgs",
    "QuantizeOptions",
    "Int4WeightsInfo",
    "GemmArgs",
    "BlockTableView",
    "PagedAttentionProblem",
    "PagedAttentionPlanArgs",
    "PagedAttentionBound",
    "PagedAttentionPlanInfo",
    "PagedAttentionArgs",
    "MergeArgs",
    "KvAppendArgs",
    "RotateHeadsArgs",
    "RuntimeCounters",
    "MlaCache",
    "MlaAppendArgs",
    "MlaProblem",
    "MlaPlanArgs",
    "MlaBound",
    "MlaDecodeArgs",
    "MlaGatherArgs",
    "MoeRoutingArgs",
    "MoeRoutingStatus",
    "MoeRouting",
    "MoeGemmArgs",
    "MoeGemmPlanInfo",
    "CacheArray",
    "CacheLayout",
    "TransferEntry",
    "SLIMSERVE_OK",
    "SLIMSERVE_INVALID_ARGUMENT",
    "SLIMSERVE_OUT_OF_RANGE",
    "SLIMSERVE_UNSUPPORTED",
    "SLIMSERVE_RESOURCE_EXHAUSTED",
    "SLIMSERVE_STALE_HANDLE",
    "SLIMSERVE_FAILED_PRECONDITION",
    "SLIMSERVE_DATA_LOSS",
    "SLIMSERVE_IO_ERROR",
    "SLIMSERVE_DEVICE_ERROR",
    "SLIMSERVE_INTERNAL",
    "SLIMSERVE_HOST_TO_DEVICE",
    "SLIMSERVE_DEVICE_TO_HOST",
    "SLIMSERVE_DEVICE_TO_DEVICE",
    "SLIMSERVE_REQUEST_OK",
    "SLIMSERVE_REQUEST_STALE_TAG",
    "SLIMSERVE_REQUEST_PAGE_OUT_OF_RANGE",
    "SLIMSERVE_REQUEST_BAD_PAGE_TABLE",
    "SLIMSERVE_REQUEST_GUARD_PAGE",
    "SLIMSERVE_REQUEST_WRITE_DENIED",
    "SLIMSERVE_REQUEST_READ_DENIED",
    "SLIMSERVE_REQUEST_UNWRITTEN_SLOTS",
    "SLIMSERVE_REQUEST_APPEND_NOT_NEXT",
    "SLIMSERVE_REQUEST_RECORD_MISMATCH",
    "SLIMSERVE_REQUEST_TAGS_NOT_SYNCED",
    "SLIMSERVE_KV_BF16",
    "SLIMSERVE_KV_FP16",
    "SLIMSERVE_KV_FP8_E4M3",
    "SLIMSERVE_KV_FP8_E5M2",
    "SLIMSERVE_KV_NVFP4",
    "SLIMSERVE_ACT_BF16",
    "SLIMSERVE_ACT_FP16",
    "SLIMSERVE_KV_NHD",
    "SLIMSERVE_KV_HND",
    "SLIMSERVE_SCALE_NONE",
    "SLIMSERVE_SCALE_PER_TENSOR",
    "SLIMSERVE_SCALE_PER_TOKEN",
    "SLIMSERVE_KV_ROTATION_NONE",
    "SLIMSERVE_KV_ROTATION_KEYS",
    "SLIMSERVE_KV_ROTATION_KEYS_AND_VALUES",
    "SLIMSERVE_SWAP_OUT",
    "SLIMSERVE_SWAP_IN",
    "SLIMSERVE_WEIGHT_F32",
    "SLIMSERVE_WEIGHT_F16",
    "SLIMSERVE_WEIGHT_BF16",
    "SLIMSERVE_WEIGHT_K_BY_N",
    "SLIMSERVE_WEIGHT_N_BY_K",
    "SLIMSERVE_MASK_CAUSAL",
    "SLIMSERVE_MASK_NONE",
    "SLIMSERVE_KERNEL_TENSOR_CORE",
    "SLIMSERVE_KERNEL_CUDA_CORE",
    "SLIMSERVE_MLA_SCALE_NONE",
    "SLIMSERVE_MLA_SCALE_PER_TENSOR",
    "SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP",
    "SLIMSERVE_MOE_GATE_UP_SILU",
    "SLIMSERVE_MOE_DOWN_WEIGHTED_SUM",
    "SLIMSERVE_MOE_ALIGN_AUTOMATIC",
    "SLIMSERVE_MOE_ALIGN_SERIAL",
    "SLIMSERVE_MOE_ALIGN_DEVICE",
    "SLIMSERVE_SCALING_PER_WEIGHT",
    "SLIMSERVE_SCALING_PER_GROUP_SUM",
    "SLIMSERVE_CACHE_PAGED_KV",
    "SLIMSERVE_CACHE_MLA_LATENT",
]
