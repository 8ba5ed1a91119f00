"""ctypes declarations of the C ABI (include/slimserve/c/slimserve.h), ABI version 2.

Kept in the same order as the header; `load()` finds the shared library, checks the ABI
version (the library's must be at least ABI_VERSION) and declares every function's argument and
result types, so a mismatch is a Python TypeError rather than memory corruption. Structs of ABI 2
that begin with `struct_size` get it set by `versioned()`. tests/test_capi_layout.py compiles the
header and compares every struct's size and fields' offsets with these declarations.
"""
from __future__ import annotations

import ctypes
import glob
import os
from ctypes import POINTER, Structure, c_char_p, c_float, c_int32, c_int64, c_size_t, c_uint32, c_uint16, c_uint64, c_void_p

ABI_VERSION = 2

# Status codes (slimserve_status).
OK = 0
STATUS_NAMES = {
    0: "ok", 1: "invalid_argument", 2: "out_of_range", 3: "unsupported", 4: "resource_exhausted",
    5: "stale_handle", 6: "failed_precondition", 7: "data_loss", 8: "io_error", 9: "device_error",
    10: "internal",
}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


class Page(Structure):
    _fields_ = [("id", c_int32), ("tag", c_uint32)]


class AppendTarget(Structure):
    _fields_ = [("page", Page), ("copy_from", Page), ("needs_copy", c_int32)]


class RequestRef(Structure):
    _fields_ = [("slot", c_int32), ("writer", c_uint32)]


class PagePlan(Structure):
    _fields_ = [("needs_copy", c_int32), ("copy_from", Page), ("copy_to", Page),
                ("copy_tokens", c_int32), ("cached_tokens", c_int64)]


class PageCopy(Structure):
    _fields_ = [("src", c_int32), ("src_tag", c_uint32), ("dst", c_int32), ("dst_tag", c_uint32),
                ("writer", c_uint32), ("tokens", c_int32)]


class PageTableView(Structure):
    _fields_ = [("indptr", c_void_p), ("indices", c_void_p), ("last_page_len", c_void_p),
                ("expected_tags", c_void_p), ("batch_size", c_int32), ("page_size", c_int32)]


class RequestPages(Structure):
    _fields_ = [("pages", POINTER(Page)), ("num_pages", c_size_t), ("num_tokens", c_int64)]


class RequestStatus(Structure):
    _fields_ = [("state", c_int32), ("failed_slot", c_int32)]


class KvCache(Structure):
    _fields_ = [("k_pages", c_void_p), ("v_pages", c_void_p), ("k_scale", c_void_p),
                ("v_scale", c_void_p), ("k_token_scales", c_void_p), ("v_token_scales", c_void_p),
                ("num_pages", c_int32), ("page_size", c_int32), ("num_kv_heads", c_int32),
                ("head_dim", c_int32), ("dtype", c_int32), ("layout", c_int32),
                ("scale_mode", c_int32)]


class AppendArgs(Structure):
    _fields_ = [("k_new", c_void_p), ("v_new", c_void_p), ("input_dtype", c_int32),
                ("num_tokens", c_int32), ("token_request", c_void_p),
                ("token_position", c_void_p), ("append_indptr", c_void_p)]


class DecodeProblem(Structure):
    _fields_ = [("batch_size", c_int32), ("num_qo_heads", c_int32), ("num_kv_heads", c_int32),
                ("head_dim", c_int32), ("page_size", c_int32), ("query_tokens", c_int32),
                ("kv_dtype", c_int32)]


class DecodeArgs(Structure):
    _fields_ = [("q", c_void_p), ("o", c_void_p), ("lse", c_void_p), ("q_dtype", c_int32),
                ("sm_scale", c_float)]


class QuantizeOptions(Structure):
    _fields_ = [("group_size", c_int64), ("symmetric", c_int32), ("activation", c_int32)]


class Int4WeightsInfo(Structure):
    _fields_ = [("k", c_int64), ("n", c_int64), ("group_size", c_int64),
                ("packed", POINTER(c_uint32)), ("packed_bytes", c_size_t),
                ("scales", POINTER(c_uint16)), ("scales_bytes", c_size_t),
                ("zeros", POINTER(c_uint16)), ("zeros_bytes", c_size_t)]


class GemmArgs(Structure):
    _fields_ = [("activation", c_int32), ("m", c_int64), ("n", c_int64), ("k", c_int64),
                ("group_size", c_int64), ("a", c_void_p), ("b", c_void_p), ("scales", c_void_p),
                ("zeros", c_void_p), ("bias", c_void_p), ("c", c_void_p)]


# ---- ABI 2: block tables, paged attention, MLA -------------------------------------------------

class BlockTableView(Structure):
    _fields_ = [("block_table", c_void_p), ("expected_tags", c_void_p), ("seq_lens", c_void_p),
                ("batch_size", c_int32), ("max_pages_per_request", c_int32), ("page_size", c_int32)]


class PagedAttentionProblem(Structure):
    _fields_ = [("batch_size", c_int32), ("num_qo_heads", c_int32), ("num_kv_heads", c_int32),
                ("head_dim", c_int32), ("page_size", c_int32), ("kv_dtype", c_int32),
                ("q_dtype", c_int32), ("mask", c_int32)]


class PagedAttentionPlanArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("problem", PagedAttentionProblem),
                ("qo_indptr_host", c_void_p), ("kv_indptr_host", c_void_p),
                ("last_page_len_host", c_void_p), ("seq_lens_host", c_void_p),
                ("num_sms", c_int32), ("ctas_per_sm", c_int32), ("min_chunk_tokens", c_int32),
                ("disable_split", c_int32), ("warpgroup_mma", c_int32)]


class PagedAttentionBound(Structure):
    _fields_ = [("struct_size", c_size_t), ("problem", PagedAttentionProblem),
                ("max_total_qo_tokens", c_int64), ("max_kv_tokens", c_int64), ("num_sms", c_int32),
                ("ctas_per_sm", c_int32)]


class PagedAttentionPlanInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("kernel", c_int32), ("split_kv", c_int32),
                ("chunk_tokens", c_int32), ("num_work_items", c_int32), ("workspace_bytes", c_size_t),
                ("reason", c_char_p)]


class PagedAttentionArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("cache", KvCache), ("kv_page_stride", c_int64),
                ("table", POINTER(PageTableView)), ("block_table", POINTER(BlockTableView)),
                ("statuses", c_void_p), ("qo_indptr", c_void_p), ("q", c_void_p), ("o", c_void_p),
                ("lse", c_void_p), ("q_token_stride", c_int64), ("q_head_stride", c_int64),
                ("o_token_stride", c_int64), ("o_head_stride", c_int64), ("sm_scale", c_float),
                ("sliding_window", c_int32), ("logit_soft_cap", c_float), ("sinks", c_void_p),
                ("chunk_k", c_void_p), ("chunk_v", c_void_p), ("chunk_token_stride", c_int64),
                ("chunk_head_stride", c_int64)]


class KvAppendArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("cache", KvCache), ("kv_page_stride", c_int64),
                ("table", POINTER(PageTableView)), ("statuses", c_void_p), ("k_new", c_void_p),
                ("v_new", c_void_p), ("input_dtype", c_int32), ("num_tokens", c_int32),
                ("token_request", c_void_p), ("token_position", c_void_p), ("append_indptr", c_void_p),
                ("slot_mapping", c_void_p)]


class RuntimeCounters(Structure):
    _fields_ = [("struct_size", c_size_t), ("synchronizations", c_int64), ("allocations", c_int64),
                ("frees", c_int64), ("copies", c_int64)]


class MlaCache(Structure):
    _fields_ = [("pages", c_void_p), ("latent_scale", c_void_p), ("num_pages", c_int32),
                ("page_size", c_int32), ("dtype", c_int32), ("scale_mode", c_int32)]


class MlaAppendArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("cache", MlaCache), ("table", POINTER(PageTableView)),
                ("statuses", c_void_p), ("latent_new", c_void_p), ("rope_new", c_void_p),
                ("latent_stride", c_int64), ("rope_stride", c_int64), ("input_dtype", c_int32),
                ("num_tokens", c_int32), ("token_request", c_void_p), ("token_position", c_void_p),
                ("append_indptr", c_void_p)]


class MlaProblem(Structure):
    _fields_ = [("batch_size", c_int32), ("num_heads", c_int32), ("query_tokens", c_int32),
                ("page_size", c_int32), ("kv_dtype", c_int32), ("scale_mode", c_int32),
                ("q_dtype", c_int32), ("ragged_queries", c_int32)]


class MlaPlanArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("problem", MlaProblem), ("kv_indptr_host", c_void_p),
                ("last_page_len_host", c_void_p), ("seq_lens_host", c_void_p),
                ("qo_indptr_host", c_void_p), ("num_sms", c_int32), ("ctas_per_sm", c_int32),
                ("min_chunk_tokens", c_int32), ("disable_split", c_int32), ("warpgroup_mma", c_int32)]


class MlaDecodeArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("cache", MlaCache), ("table", POINTER(PageTableView)),
                ("block_table", POINTER(BlockTableView)), ("statuses", c_void_p), ("q", c_void_p),
                ("o", c_void_p), ("lse", c_void_p), ("q_token_stride", c_int64),
                ("q_head_stride", c_int64), ("o_token_stride", c_int64), ("o_head_stride", c_int64),
                ("sm_scale", c_float)]


class MlaBound(Structure):
    _fields_ = [("struct_size", c_size_t), ("problem", MlaProblem), ("num_sms", c_int32),
                ("ctas_per_sm", c_int32), ("warpgroup_mma", c_int32)]


class MlaGatherArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("cache", MlaCache), ("table", POINTER(PageTableView)),
                ("statuses", c_void_p), ("token_indptr", c_void_p), ("out", c_void_p),
                ("out_stride", c_int64), ("num_rows", c_int32)]


class MergeArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("partial_o", c_void_p), ("partial_lse", c_void_p),
                ("split_indptr", c_void_p), ("batch_size", c_int32), ("rows_per_request", c_int32),
                ("head_dim", c_int32), ("out_dtype", c_int32), ("o", c_void_p), ("lse", c_void_p)]


class MoeRoutingArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("num_tokens", c_int64), ("top_k", c_int64),
                ("num_experts", c_int64), ("topk_ids", c_void_p), ("max_tokens", c_int64),
                ("align", c_int32)]


class MoeRoutingStatus(Structure):
    _fields_ = [("invalid_pairs", c_int32), ("first_invalid", c_int32), ("first_id", c_int32),
                ("reserved", c_int32)]


class MoeRouting(Structure):
    _fields_ = [("topk_ids", c_void_p), ("tile_expert", c_void_p), ("tile_rows", c_void_p),
                ("tiles_used", c_void_p), ("status", c_void_p), ("num_tokens", c_int64),
                ("top_k", c_int64), ("num_experts", c_int64), ("max_tiles", c_int64)]


class MoeGemmArgs(Structure):
    _fields_ = [("struct_size", c_size_t), ("activation", c_int32), ("epilogue", c_int32),
                ("num_tokens", c_int64), ("top_k", c_int64), ("num_experts", c_int64),
                ("k", c_int64), ("n", c_int64), ("group_size", c_int64), ("a", c_void_p),
                ("b", c_void_p), ("scales", c_void_p), ("zeros", c_void_p), ("topk_ids", c_void_p),
                ("topk_weights", c_void_p), ("c", c_void_p), ("max_tokens", c_int64)]


class MoeGemmPlanInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("max_tokens", c_int64), ("max_tiles", c_int64),
                ("workspace_bytes", c_size_t), ("scaling", c_int32)]


def versioned(struct_type):
    """A zeroed ABI-2 struct with struct_size set (0 is every field's default)."""
    value = struct_type()
    value.struct_size = ctypes.sizeof(struct_type)
    return value


H = c_void_p  # every opaque handle
S = c_int32   # slimserve_status

_SIGNATURES = {
    "slimserve_last_error": (c_char_p, []),
    "slimserve_status_name": (c_char_p, [c_int32]),
    "slimserve_c_abi_version": (c_int32, []),
    "slimserve_version": (c_int32, []),
    "slimserve_is_emulated": (c_int32, []),
    "slimserve_device_alloc": (S, [c_size_t, POINTER(c_void_p)]),
    "slimserve_device_free": (S, [c_void_p]),
    "slimserve_memcpy_async": (S, [c_void_p, c_void_p, c_size_t, c_int32, c_void_p]),
    "slimserve_memset_async": (S, [c_void_p, c_int32, c_size_t, c_void_p]),
    "slimserve_stream_synchronize": (S, [c_void_p]),
    "slimserve_page_pool_create": (S, [c_int32, POINTER(H)]),
    "slimserve_page_pool_destroy": (None, [H]),
    "slimserve_page_pool_allocate": (S, [H, POINTER(Page), c_size_t]),
    "slimserve_page_pool_release": (S, [H, POINTER(Page), c_size_t]),
    "slimserve_page_pool_share": (S, [H, Page]),
    "slimserve_page_pool_validate": (S, [H, Page]),
    "slimserve_page_pool_available": (c_int32, [H]),
    "slimserve_page_pool_prepare_append": (S, [H, Page, POINTER(AppendTarget)]),
    "slimserve_prefix_cache_create": (S, [H, c_int32, c_uint64, POINTER(H)]),
    "slimserve_prefix_cache_destroy": (None, [H]),
    "slimserve_prefix_cache_match": (S, [H, POINTER(c_int32), c_size_t, c_uint64, c_uint64,
                                          POINTER(Page), c_size_t, POINTER(c_int32)]),
    "slimserve_prefix_cache_insert": (S, [H, POINTER(c_int32), c_size_t, c_uint64, c_uint64,
                                           POINTER(Page), c_size_t, POINTER(c_int32)]),
    "slimserve_request_sets_create": (S, [H, H, c_int32, c_int32, POINTER(H)]),
    "slimserve_request_sets_destroy": (None, [H]),
    "slimserve_request_sets_admit": (S, [H, POINTER(c_int32), c_size_t, c_uint64, c_uint64,
                                          POINTER(RequestRef), POINTER(PagePlan)]),
    "slimserve_request_sets_append": (S, [H, RequestRef, c_int32, POINTER(PagePlan)]),
    "slimserve_request_sets_release_copy_sources": (None, [H]),
    "slimserve_request_sets_fork": (S, [H, RequestRef, POINTER(RequestRef)]),
    "slimserve_request_sets_preempt": (S, [H, RequestRef]),
    "slimserve_request_sets_resume": (S, [H, RequestRef, POINTER(c_int32), c_size_t, c_uint64,
                                           c_uint64, POINTER(RequestRef), POINTER(PagePlan)]),
    "slimserve_request_sets_finish": (S, [H, RequestRef, POINTER(c_int32), c_size_t, c_uint64,
                                           c_uint64]),
    "slimserve_request_sets_is_active": (c_int32, [H, RequestRef]),
    "slimserve_request_sets_pages": (S, [H, RequestRef, POINTER(Page), c_size_t, POINTER(c_size_t)]),
    "slimserve_request_sets_tokens": (c_int64, [H, RequestRef]),
    "slimserve_check_page_tags_owned": (S, [POINTER(PageTableView), H, c_void_p, c_void_p,
                                             c_void_p, c_void_p, c_void_p]),
    "slimserve_check_page_copies": (S, [POINTER(KvCache), POINTER(PageCopy), c_int32]),
    "slimserve_copy_pages": (S, [POINTER(KvCache), H, c_void_p, c_int32, c_void_p, c_void_p]),
    "slimserve_page_table_create": (S, [c_int32, c_int64, c_int32, c_int32, POINTER(H)]),
    "slimserve_page_table_destroy": (None, [H]),
    "slimserve_page_table_build": (S, [H, POINTER(RequestPages), c_int32, c_void_p,
                                        POINTER(PageTableView), POINTER(PageTableView)]),
    "slimserve_device_tags_create": (S, [c_int32, POINTER(H)]),
    "slimserve_device_tags_destroy": (None, [H]),
    "slimserve_device_tags_sync": (S, [H, H, c_void_p]),
    "slimserve_check_page_tags": (S, [POINTER(PageTableView), H, c_void_p, c_void_p, c_void_p]),
    "slimserve_append_kv": (S, [POINTER(KvCache), POINTER(PageTableView), c_void_p,
                                 POINTER(AppendArgs), c_void_p]),
    "slimserve_decode_workspace_size": (S, [POINTER(DecodeProblem), c_void_p, c_void_p,
                                             POINTER(c_size_t)]),
    "slimserve_decode_plan_create": (S, [POINTER(DecodeProblem), c_void_p, c_void_p, c_void_p,
                                          c_size_t, c_void_p, POINTER(H)]),
    "slimserve_decode_plan_destroy": (None, [H]),
    "slimserve_decode_run": (S, [H, POINTER(KvCache), POINTER(PageTableView), c_void_p,
                                  POINTER(DecodeArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_int4_quantize": (S, [c_void_p, c_int32, c_int32, c_int64, c_int64,
                                     POINTER(QuantizeOptions), POINTER(H)]),
    "slimserve_int4_weights_destroy": (None, [H]),
    "slimserve_int4_weights_get_info": (S, [H, POINTER(Int4WeightsInfo)]),
    "slimserve_int4_weights_dequantize": (S, [H, POINTER(c_float), c_size_t]),
    "slimserve_gemm_plan_create": (S, [POINTER(GemmArgs), POINTER(H)]),
    "slimserve_gemm_plan_destroy": (None, [H]),
    "slimserve_gemm_plan_workspace_bytes": (c_size_t, [H]),
    "slimserve_gemm_run": (S, [H, POINTER(GemmArgs), c_void_p, c_size_t, c_void_p]),
    # ABI 2
    "slimserve_validate_block_table": (S, [POINTER(BlockTableView), c_int32]),
    "slimserve_check_block_tags": (S, [POINTER(BlockTableView), H, c_void_p, c_void_p, c_void_p,
                                        c_void_p, c_void_p]),
    "slimserve_paged_attention_workspace_size": (S, [POINTER(PagedAttentionPlanArgs), POINTER(c_size_t)]),
    "slimserve_paged_attention_workspace_bound": (S, [POINTER(PagedAttentionBound), POINTER(c_size_t)]),
    "slimserve_paged_attention_plan_create": (S, [POINTER(PagedAttentionPlanArgs), c_void_p, c_size_t,
                                                   c_void_p, POINTER(H)]),
    "slimserve_paged_attention_plan_destroy": (None, [H]),
    "slimserve_paged_attention_plan_get_info": (S, [H, POINTER(PagedAttentionPlanInfo)]),
    "slimserve_paged_attention_run": (S, [H, POINTER(PagedAttentionArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_merge_attention_states": (S, [POINTER(MergeArgs), c_void_p]),
    "slimserve_dequantize_pages": (S, [POINTER(KvCache), c_void_p, c_int32, c_void_p, c_void_p, c_void_p]),
    "slimserve_mla_record_bytes": (c_int64, [c_int32, c_int32]),
    "slimserve_mla_append": (S, [POINTER(MlaAppendArgs), c_void_p]),
    "slimserve_mla_workspace_size": (S, [POINTER(MlaPlanArgs), POINTER(c_size_t)]),
    "slimserve_mla_workspace_bound": (S, [POINTER(MlaBound), POINTER(c_size_t)]),
    "slimserve_mla_plan_create": (S, [POINTER(MlaPlanArgs), c_void_p, c_size_t, c_void_p, POINTER(H)]),
    "slimserve_mla_plan_destroy": (None, [H]),
    "slimserve_mla_decode_run": (S, [H, POINTER(MlaDecodeArgs), c_void_p, c_size_t, c_void_p]),
    "slimserve_mla_gather": (S, [POINTER(MlaGatherArgs), c_void_p]),
    "slimserve_kv_append": (S, [POINTER(KvAppendArgs), c_void_p]),
    "slimserve_get_runtime_counters": (S, [POINTER(RuntimeCounters)]),
    "slimserve_moe_routing_workspace_size": (S, [POINTER(MoeRoutingArgs), POINTER(c_size_t)]),
    "slimserve_moe_routing_plan_create": (S, [POINTER(MoeRoutingArgs), POINTER(H)]),
    "slimserve_moe_routing_plan_destroy": (None, [H]),
    "slimserve_moe_routing_run": (S, [H, POINTER(MoeRoutingArgs), c_void_p, c_size_t, c_void_p,
                                       POINTER(MoeRouting)]),
    "slimserve_moe_routing_read_status": (S, [POINTER(MoeRouting), c_void_p]),
    "slimserve_moe_validate_routing": (S, [c_void_p, c_int64, c_int64, c_int64]),
    "slimserve_moe_gemm_workspace_size": (S, [POINTER(MoeGemmArgs), POINTER(c_size_t)]),
    "slimserve_moe_gemm_plan_create": (S, [POINTER(MoeGemmArgs), POINTER(H)]),
    "slimserve_moe_gemm_plan_destroy": (None, [H]),
    "slimserve_moe_gemm_plan_get_info": (S, [H, POINTER(MoeGemmPlanInfo)]),
    "slimserve_moe_gemm_run": (S, [H, POINTER(MoeGemmArgs), POINTER(MoeRouting), c_void_p, c_size_t,
                                    c_void_p]),
}


def _candidates():
    explicit = os.environ.get("SLIMSERVE_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.join(os.path.dirname(__file__), "_lib")
    wanted = os.environ.get("SLIMSERVE_BACKEND", "auto")  # auto | cuda | emulated
    cuda = sorted(glob.glob(os.path.join(here, "libslimserve_c.so*")))
    emulated = sorted(glob.glob(os.path.join(here, "libslimserve_c_emulated.so*")))
    if wanted == "cuda":
        return cuda
    if wanted == "emulated":
        return emulated
    return cuda + emulated


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:  # e.g. the CUDA build on a machine without the driver
            errors.append(f"{path}: {error}")
            continue
        version = lib.slimserve_c_abi_version
        version.restype, version.argtypes = c_int32, []
        if version() < ABI_VERSION:  # a library of a later ABI serves every earlier one
            errors.append(f"{path}: C ABI version {version()}, need {ABI_VERSION} or later")
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        return lib, path
    raise ImportError("slimserve: no usable C library (set SLIMSERVE_LIBRARY to libslimserve_c*.so); "
                      + "; ".join(errors or ["none found"]))
