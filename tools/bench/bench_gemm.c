/* The GEMM rate of the CUDA reference model's kernel (oi_rm_gemm) beside
 * cuBLAS (cublasGemmEx, loaded with dlopen), for `openinfer bench ttft`. Part
 * of the uninstalled benchmark target, not of libopeninfer.so. CUDA runtime
 * calls go through lib/refmodel/kernels/refmodel_runtime.h. */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "core/core.h"
#include "refmodel/kernels/refmodel_kernels.h"
#include "refmodel/kernels/refmodel_runtime.h"

static oi_status cu_fail(int err, const char *what) {
  oi_rmk_get_last_error();
  return oi__fail(OI_ERR_CUDA, "refmodel cuda: %s: %s", what, oi_rmk_error_string(err));
}

typedef void *cublas_handle;
typedef int (*pfn_cublas_create)(cublas_handle *);
typedef int (*pfn_cublas_destroy)(cublas_handle);
typedef int (*pfn_cublas_set_stream)(cublas_handle, oi_rmk_stream);
typedef int (*pfn_cublas_gemm_ex)(cublas_handle, int, int, int, int, int, const void *,
                                  const void *, int, int, const void *, int, int, const void *,
                                  void *, int, int, int, int);
/* cublas_api.h / library_types.h values */
#define CUBLAS_OP_N_ 0
#define CUBLAS_OP_T_ 1
#define CUDA_R_32F_ 0
#define CUDA_R_16BF_ 14
#define CUBLAS_COMPUTE_32F_ 68
#define CUBLAS_GEMM_DEFAULT_ (-1)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

oi_status bench_gemm(int device, uint32_t M, uint32_t N, uint32_t K, uint32_t iters,
                     bench_gemm_result *out) {
  memset(out, 0, sizeof *out);
  if (K % 64 || N % 2 || !iters || iters > 1000)
    return oi__fail(OI_ERR_INVALID_ARGUMENT, "gemm bench: K %% 64, N even, iters 1..1000");
  if (oi_rmk_set_device(device) != OI_RMK_SUCCESS)
    return cu_fail((int)oi_rmk_get_last_error(), "gemm bench");
  uint16_t *A = NULL, *W = NULL;
  float *C = NULL, *C2 = NULL;
  oi_rmk_stream s = NULL;
  oi_rmk_event e0 = NULL, e1 = NULL;
  double *ms = calloc(iters, sizeof *ms);
  oi_status st = OI_OK;
  int e = oi_rmk_malloc((void **)&A, (size_t)M * K * 2);
  if (!e) e = oi_rmk_malloc((void **)&W, (size_t)N * K * 2);
  if (!e) e = oi_rmk_malloc((void **)&C, (size_t)M * N * 4);
  if (!e) e = oi_rmk_malloc((void **)&C2, (size_t)M * N * 4);
  if (!e) e = oi_rmk_stream_create(&s, OI_RMK_STREAM_NON_BLOCKING);
  if (!e) e = oi_rmk_event_create(&e0);
  if (!e) e = oi_rmk_event_create(&e1);
  if (e || !ms) {
    st = cu_fail((int)e, "gemm bench: setup");
    goto done;
  }
  oi_rm_fill_random(A, (uint64_t)M * K, 11, s);
  oi_rm_fill_random(W, (uint64_t)N * K, 12, s);
  double flops = 2.0 * M * N * K;
  for (uint32_t i = 0; i < iters + 2; i++) {
    oi_rmk_event_record(e0, s);
    int err = oi_rm_gemm(OI_RM_EPI_F32, A, W, C, M, N, K, s);
    oi_rmk_event_record(e1, s);
    if (err || (err = (int)oi_rmk_event_synchronize(e1))) {
      st = cu_fail(err, "gemm bench: gemm");
      goto done;
    }
    float t = 0;
    oi_rmk_event_elapsed_time(&t, e0, e1);
    if (i >= 2) ms[i - 2] = t;
  }
  qsort(ms, iters, sizeof *ms, cmp_double);
  out->mine_tflops = flops / (ms[iters / 2] * 1e-3) / 1e12;

  const char *libs[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                        "/usr/local/cuda/lib64/libcublas.so.13",
                        "/usr/local/cuda/lib64/libcublas.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof libs / sizeof libs[0] && !lib; i++)
    lib = dlopen(libs[i], RTLD_NOW);
  if (!lib) goto done;
  pfn_cublas_create c_create = (pfn_cublas_create)dlsym(lib, "cublasCreate_v2");
  pfn_cublas_destroy c_destroy = (pfn_cublas_destroy)dlsym(lib, "cublasDestroy_v2");
  pfn_cublas_set_stream c_stream = (pfn_cublas_set_stream)dlsym(lib, "cublasSetStream_v2");
  pfn_cublas_gemm_ex c_gemm = (pfn_cublas_gemm_ex)dlsym(lib, "cublasGemmEx");
  cublas_handle hdl = NULL;
  if (!c_create || !c_destroy || !c_stream || !c_gemm || c_create(&hdl) != 0) goto done;
  c_stream(hdl, s);
  float alpha = 1.0f, beta = 0.0f;
  int ok = 1;
  for (uint32_t i = 0; i < iters + 2 && ok; i++) {
    oi_rmk_event_record(e0, s);
    /* column-major: C^T (N x M) = W (N x K, stored K x N) ^T . A^T (K x M) */
    ok = c_gemm(hdl, CUBLAS_OP_T_, CUBLAS_OP_N_, (int)N, (int)M, (int)K, &alpha, W, CUDA_R_16BF_,
                (int)K, A, CUDA_R_16BF_, (int)K, &beta, C2, CUDA_R_32F_, (int)N,
                CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_) == 0;
    oi_rmk_event_record(e1, s);
    oi_rmk_event_synchronize(e1);
    float t = 0;
    oi_rmk_event_elapsed_time(&t, e0, e1);
    if (i >= 2) ms[i - 2] = t;
  }
  if (ok) {
    qsort(ms, iters, sizeof *ms, cmp_double);
    out->cublas_tflops = flops / (ms[iters / 2] * 1e-3) / 1e12;
    out->cublas_found = 1;
    /* Compare a sample of rows. */
    size_t rows = OI_MIN(M, 64u);
    float *h1 = malloc(rows * N * 4), *h2 = malloc(rows * N * 4);
    if (h1 && h2 && oi_rmk_memcpy(h1, C, rows * N * 4, OI_RMK_DEVICE_TO_HOST) == OI_RMK_SUCCESS &&
        oi_rmk_memcpy(h2, C2, rows * N * 4, OI_RMK_DEVICE_TO_HOST) == OI_RMK_SUCCESS) {
      double mx = 0, md = 0;
      for (size_t i = 0; i < rows * N; i++) {
        mx = fmax(mx, fabs(h2[i]));
        md = fmax(md, fabs((double)h1[i] - h2[i]));
      }
      out->max_rel_diff = mx > 0 ? md / mx : md;
    } else {
      out->max_rel_diff = -1;
    }
    free(h1);
    free(h2);
  }
  c_destroy(hdl);
done:
  oi_rmk_get_last_error();
  if (e0) oi_rmk_event_destroy(e0);
  if (e1) oi_rmk_event_destroy(e1);
  if (s) oi_rmk_stream_destroy(s);
  oi_rmk_free(A);
  oi_rmk_free(W);
  oi_rmk_free(C);
  oi_rmk_free(C2);
  free(ms);
  return st;
}
