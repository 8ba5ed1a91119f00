// The expansion path for large M: dequantize W once into the workspace, then a dense GEMM
// (cuBLASLt on the GPU; the tiled fallback kernel in the CPU emulator, which has no cuBLAS).
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "gemm_internal.hpp"
#include "slimserve/int4/gemm_expand.cuh"
#include "slimserve/runtime/launch.hpp"

#if defined(SLIMSERVE_PLATFORM_CUDA)
#include <cublasLt.h>
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

#if defined(SLIMSERVE_PLATFORM_CUDA)
constexpr unsigned dequant_max_blocks = 8192;
constexpr std::size_t cublaslt_workspace_bytes = std::size_t{32} << 20;

Status lt_status(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return {};
  return make_status(StatusCode::device_error, what, " failed with cuBLAS status ",
                     static_cast<int>(status));
}

/// One handle per process, created on first use (thread-safe static initialization).
cublasLtHandle_t lt_handle() {
  static const cublasLtHandle_t handle = [] {
    cublasLtHandle_t created = nullptr;
    if (cublasLtCreate(&created) != CUBLAS_STATUS_SUCCESS) created = nullptr;
    return created;
  }();
  return handle;
}

/// Owns the cuBLASLt descriptors of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr;
  cublasLtMatrixLayout_t a = nullptr;
  cublasLtMatrixLayout_t c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (w != nullptr) cublasLtMatrixLayoutDestroy(w);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// Row-major C[m, n] = A[m, k] . W[k, n] is, in cuBLAS's column-major terms,
// C^T[n, m] = W^T[n, k] . A^T[k, m] with every operand untransposed.
Status dense_gemm(const GemmArguments& args, const void* dense_w, unsigned char* scratch,
                  std::size_t scratch_bytes, cudaStream_t stream) {
  cublasLtHandle_t handle = lt_handle();
  if (handle == nullptr) return make_status(StatusCode::device_error, "cublasLtCreate failed");
  const cudaDataType_t type = args.activation == ActivationType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const auto m = static_cast<std::uint64_t>(args.m);
  const auto n = static_cast<std::uint64_t>(args.n);
  const auto k = static_cast<std::uint64_t>(args.k);
  LtDescriptors d;
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                      "cublasLtMatmulDescCreate"));
  if (args.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;  // bias per row of C^T = per n
    SLIMSERVE_RETURN_IF_ERROR(lt_status(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "set epilogue"));
    SLIMSERVE_RETURN_IF_ERROR(lt_status(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                                       sizeof(args.bias)),
        "set bias pointer"));
    SLIMSERVE_RETURN_IF_ERROR(lt_status(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)),
        "set bias type"));
  }
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&d.w, type, n, k, static_cast<std::int64_t>(n)),
                                      "layout W"));
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&d.a, type, k, m, static_cast<std::int64_t>(k)),
                                      "layout A"));
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&d.c, type, n, m, static_cast<std::int64_t>(n)),
                                      "layout C"));
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatmulPreferenceCreate(&d.preference), "preference"));
  SLIMSERVE_RETURN_IF_ERROR(lt_status(
      cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &scratch_bytes, sizeof(scratch_bytes)),
      "preference workspace"));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  SLIMSERVE_RETURN_IF_ERROR(lt_status(cublasLtMatmulAlgoGetHeuristic(handle, d.op, d.w, d.a, d.c, d.c,
                                                                     d.preference, 1, &heuristic, &found),
                                      "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return make_status(StatusCode::unsupported, "cuBLASLt has no algorithm for m = ", m,
                       ", n = ", n, ", k = ", k);
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return lt_status(cublasLtMatmul(handle, d.op, &alpha, dense_w, d.w, args.a, d.a, &beta, args.c,
                                  d.c, args.c, d.c, &heuristic.algo, scratch, scratch_bytes, stream),
                   "cublasLtMatmul");
}
#else
constexpr unsigned dequant_max_blocks = 16;  // emulated grids stay small; the loop strides

template <class T>
Status dense_gemm_typed(const GemmArguments& args, const std::uint16_t* dense_w,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((args.n + DenseGemmTile::block_n - 1) / DenseGemmTile::block_n),
                  static_cast<unsigned>((args.m + DenseGemmTile::block_m - 1) / DenseGemmTile::block_m));
  return rt::launch(dense_gemm_kernel<T>,
                    rt::LaunchConfig{grid, dim3(DenseGemmTile::threads),
                                     sizeof(DenseGemmSharedStorage), stream},
                    static_cast<const std::uint16_t*>(args.a), dense_w,
                    static_cast<const std::uint16_t*>(args.bias), static_cast<std::uint16_t*>(args.c),
                    args.m, args.n, args.k);
}

Status dense_gemm(const GemmArguments& args, const void* dense_w, unsigned char*, std::size_t,
                  cudaStream_t stream) {
  const auto* w = static_cast<const std::uint16_t*>(dense_w);
  return args.activation == ActivationType::bf16 ? dense_gemm_typed<bf16>(args, w, stream)
                                                 : dense_gemm_typed<fp16>(args, w, stream);
}
#endif

template <class T>
Status dequantize_to_dense(const GemmArguments& args, std::uint16_t* dense, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  const std::int64_t words = args.k / 8 * args.n;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>((words + threads - 1) / threads, 1, dequant_max_blocks));
  return rt::launch(dequantize_to_dense_kernel<T>,
                    rt::LaunchConfig{dim3(blocks), dim3(threads), 0, stream}, args.b,
                    static_cast<const std::uint16_t*>(args.scales),
                    static_cast<const std::uint16_t*>(args.zeros), dense, args.k, args.n,
                    args.group_size);
}

}  // namespace

namespace detail {

std::size_t dense_library_workspace_bytes() {
#if defined(SLIMSERVE_PLATFORM_CUDA)
  return cublaslt_workspace_bytes;
#else
  return 0;
#endif
}

Status run_expansion_path(const GemmArguments& args, const GemmWorkspaceLayout& layout,
                          unsigned char* workspace, cudaStream_t stream) {
  auto* dense = reinterpret_cast<std::uint16_t*>(workspace + layout.dense_offset);
  SLIMSERVE_RETURN_IF_ERROR(args.activation == ActivationType::bf16
                                ? dequantize_to_dense<bf16>(args, dense, stream)
                                : dequantize_to_dense<fp16>(args, dense, stream));
  return dense_gemm(args, dense, workspace + layout.library_offset, layout.library_bytes, stream);
}

}  // namespace detail
}  // namespace int4
SLIMSERVE_NAMESPACE_END
