/*
 * The INT4 mixture-of-experts entry points of the C ABI from a plain C99 program: one MoE
 * layer as an engine runs it (one routing shared by the gate+up and the down grouped GEMMs,
 * the down GEMM reading the gate+up output), every output element against an FP64 reference
 * built from the quantized weights (slimserve_int4_weights_dequantize, or (q - z) * s exactly
 * where the plan says it applies the group scales to the FP32 sums):
 *  - routings: random distinct experts per token with top-k 1, 2 and 8, only a few experts
 *    used (the rest empty), one expert taking every token, and out-of-range ids (skipped on
 *    the device, reported by slimserve_moe_routing_read_status with token, slot and id);
 *  - BF16 and FP16 activations, groups of 32 and 64 and per-channel, symmetric and
 *    asymmetric, a step shorter than the plan's max_tokens;
 *  - determinism (a second run gives the same bits over a poisoned workspace);
 *  - refusals with their messages: expert ids out of range (host check), top_k > E, short
 *    workspaces (outputs untouched), struct_size too small or from a newer header with
 *    fields set, T above the plan's max_tokens, a routing aligned from other ids.
 * Outputs are poisoned (NaN) before each run. The seed is fresh per run (SLIMSERVE_TEST_SEED
 * repeats one). Exit status 0 when all checks pass.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slimserve/c/slimserve.h>

#include "c_test_support.h"

static double from_fp16(uint16_t value) {
  const int sign = value >> 15, exponent = (value >> 10) & 31, mantissa = value & 1023;
  double magnitude;
  if (exponent == 31) return mantissa != 0 ? NAN : (sign ? -INFINITY : INFINITY);
  magnitude = exponent == 0 ? ldexp((double)mantissa, -24) : ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  return sign ? -magnitude : magnitude;
}
static double from_activation(int32_t type, uint16_t bits) {
  return type == SLIMSERVE_ACT_BF16 ? from_bf16(bits) : from_fp16(bits);
}
/* A random activation in about (-1, 1), 1/32 .. 1 in magnitude, as bits of `type`. */
static uint16_t random_activation(int32_t type) {
  const uint32_t sign = uniform() < 0.0 ? 1u : 0u;
  const uint32_t scale = (uint32_t)below(5); /* 2^-5 .. 2^-1 */
  if (type == SLIMSERVE_ACT_BF16) {
    return (uint16_t)((sign << 15) | ((122u + scale) << 7) | (uint32_t)below(128));
  }
  return (uint16_t)((sign << 15) | ((10u + scale) << 10) | (uint32_t)below(1024));
}
/* One unit in the last place of `value` in `type`. */
static double ulp_of(int32_t type, double value) {
  const int mantissa_bits = type == SLIMSERVE_ACT_BF16 ? 7 : 10;
  const double min_normal = type == SLIMSERVE_ACT_BF16 ? 1.1754943508222875e-38 : 6.103515625e-05;
  int exponent;
  (void)frexp(fmax(fabs(value), min_normal), &exponent);
  return ldexp(1.0, exponent - 1 - mantissa_bits);
}

/* ---- device memory --------------------------------------------------------------------- */

static void poison(void* device, size_t bytes) {
  CHECK_OK(slimserve_memset_async(device, 0xFF, bytes, NULL)); /* NaN in BF16 and FP16 */
  CHECK_OK(slimserve_stream_synchronize(NULL));
}

/* ---- experts: quantized here, stacked as the grouped GEMM reads them --------------------- */

typedef struct {
  int64_t experts, k, n, group_size;
  int32_t symmetric, activation;
  void *packed, *scales, *zeros; /* device, [E][...] end to end */
  double* rounded;               /* [E][k * n]: round_T((q - z) * s) */
  double* exact;                 /* [E][k * n]: (q - z) * s */
} Experts;

static Experts make_experts(int64_t experts, int64_t k, int64_t n, int64_t group_size, int32_t symmetric,
                            int32_t activation) {
  Experts x;
  slimserve_quantize_options options;
  size_t packed_bytes = 0, scales_bytes = 0, zeros_bytes = 0;
  unsigned char *packed = NULL, *scales = NULL, *zeros = NULL;
  float* weight = malloc((size_t)(k * n) * sizeof *weight);
  float* dequantized = malloc((size_t)(k * n) * sizeof *dequantized);
  int64_t e, i;
  memset(&x, 0, sizeof x);
  x.experts = experts;
  x.k = k;
  x.n = n;
  x.group_size = group_size;
  x.symmetric = symmetric;
  x.activation = activation;
  x.rounded = malloc((size_t)(experts * k * n) * sizeof *x.rounded);
  x.exact = malloc((size_t)(experts * k * n) * sizeof *x.exact);
  options.group_size = group_size;
  options.symmetric = symmetric;
  options.activation = activation;
  for (e = 0; e < experts; ++e) {
    slimserve_int4_weights* weights = NULL;
    slimserve_int4_weights_info info;
    for (i = 0; i < k * n; ++i) weight[i] = (float)uniform() * (float)(1 + e % 3); /* experts differ in scale */
    CHECK_OK(slimserve_int4_quantize(weight, SLIMSERVE_WEIGHT_F32, SLIMSERVE_WEIGHT_K_BY_N, k, n, &options, &weights));
    CHECK_OK(slimserve_int4_weights_get_info(weights, &info));
    EXPECT((info.zeros == NULL) == (symmetric != 0));
    CHECK_OK(slimserve_int4_weights_dequantize(weights, dequantized, (size_t)(k * n)));
    if (e == 0) {
      packed_bytes = info.packed_bytes;
      scales_bytes = info.scales_bytes;
      zeros_bytes = info.zeros_bytes;
      packed = malloc((size_t)experts * packed_bytes);
      scales = malloc((size_t)experts * scales_bytes);
      zeros = malloc((size_t)experts * (zeros_bytes > 0 ? zeros_bytes : 1));
    }
    memcpy(packed + (size_t)e * packed_bytes, info.packed, packed_bytes);
    memcpy(scales + (size_t)e * scales_bytes, info.scales, scales_bytes);
    if (zeros_bytes > 0) memcpy(zeros + (size_t)e * zeros_bytes, info.zeros, zeros_bytes);
    for (i = 0; i < k * n; ++i) {
      const int64_t row = i / n, col = i % n;
      const double s = from_activation(activation, info.scales[(row / group_size) * n + col]);
      const double w = (double)dequantized[i];
      /* w = round_T(d * s) with an integer d = q - z in -15 .. 15: rounding moves it by less
         than s / 2, so d is the nearest integer to w / s. */
      const double d = nearbyint(w / s);
      EXPECT(fabs(d) <= 15.0 && fabs(d * s - w) <= ulp_of(activation, d * s));
      x.rounded[e * k * n + i] = w;
      x.exact[e * k * n + i] = d * s;
    }
    slimserve_int4_weights_destroy(weights);
  }
  x.packed = upload(packed, (size_t)experts * packed_bytes);
  x.scales = upload(scales, (size_t)experts * scales_bytes);
  x.zeros = symmetric ? NULL : upload(zeros, (size_t)experts * zeros_bytes);
  free(packed);
  free(scales);
  free(zeros);
  free(weight);
  free(dequantized);
  return x;
}

static void free_experts(Experts* x) {
  release(x->packed);
  release(x->scales);
  release(x->zeros);
  free(x->rounded);
  free(x->exact);
}

/* ---- routings ---------------------------------------------------------------------------- */

enum { ROUTE_RANDOM, ROUTE_FEW_EXPERTS, ROUTE_ONE_EXPERT_ALL_TOKENS, ROUTE_WITH_INVALID };

/* top_k distinct experts per token, as a router picks them, and weights in (0.05, 1). */
static void make_routing(int kind, int64_t tokens, int64_t top_k, int64_t experts, int32_t* ids, float* weights) {
  int32_t pool[64];
  int64_t t, s;
  for (t = 0; t < tokens; ++t) {
    int32_t count = (int32_t)experts;
    int32_t i;
    if (kind == ROUTE_FEW_EXPERTS) count = (int32_t)(top_k + 1 < experts ? top_k + 1 : experts);
    for (i = 0; i < count; ++i) pool[i] = i;
    for (i = count - 1; i > 0; --i) { /* shuffle */
      const int32_t j = below(i + 1), keep = pool[i];
      pool[i] = pool[j];
      pool[j] = keep;
    }
    if (kind == ROUTE_ONE_EXPERT_ALL_TOKENS) { /* expert 1 in slot t % top_k of every token */
      const int32_t slot = (int32_t)(t % top_k);
      for (i = 0; i < count; ++i) {
        if (pool[i] == 1) {
          pool[i] = pool[slot];
          pool[slot] = 1;
          break;
        }
      }
    }
    for (s = 0; s < top_k; ++s) {
      ids[t * top_k + s] = pool[s];
      weights[t * top_k + s] = (float)(0.525 + 0.475 * uniform());
    }
  }
  if (kind == ROUTE_WITH_INVALID) {
    ids[0] = (int32_t)experts; /* skipped on the device */
    if (tokens * top_k > 3) ids[3] = -1;
  }
}

static int valid_id(int32_t id, int64_t experts) { return id >= 0 && id < experts; }

/* ---- one layer ----------------------------------------------------------------------------- */

typedef struct {
  int32_t activation;
  int64_t tokens, max_tokens, top_k, experts;
  int64_t hidden, inter;     /* gate+up: k = hidden, n = 2 * inter; down: k = inter, n = hidden */
  int64_t group_up, group_down;
  int32_t symmetric;
  int kind;
} LayerCase;

static const double eps24 = 5.9604644775390625e-08; /* 2^-24 */

/* Checks the gate+up output mid [T * top_k, inter] against silu(x Wg) * (x Wu) in FP64. */
static int check_gate_up(const LayerCase* c, const Experts* up, int32_t scaling, const int32_t* ids,
                         const uint16_t* x, const uint16_t* mid) {
  const double* w_all = scaling == SLIMSERVE_SCALING_PER_GROUP_SUM ? up->exact : up->rounded;
  const double sum_tolerance = 2.0 * (double)(up->k + 2) * eps24;
  int64_t pair, col, i;
  int bad = 0;
  for (pair = 0; pair < c->tokens * c->top_k; ++pair) {
    const int32_t e = ids[pair];
    const int64_t token = pair / c->top_k;
    for (col = 0; col < c->inter; ++col) {
      const double got = from_activation(c->activation, mid[pair * c->inter + col]);
      double g = 0, u = 0, mg = 0, mu = 0, silu, want, tol_g, tol_u, tol;
      if (!valid_id(e, c->experts)) { /* a skipped pair's row is not written */
        if (!isnan(got)) ++bad;
        continue;
      }
      for (i = 0; i < up->k; ++i) {
        const double a = from_activation(c->activation, x[token * up->k + i]);
        const double wg = w_all[(int64_t)e * up->k * up->n + i * up->n + col];
        const double wu = w_all[(int64_t)e * up->k * up->n + i * up->n + c->inter + col];
        g += a * wg;
        u += a * wu;
        mg += fabs(a * wg);
        mu += fabs(a * wu);
      }
      silu = g / (1.0 + exp(-g));
      want = silu * u;
      tol_g = sum_tolerance * mg;
      tol_u = sum_tolerance * mu;
      tol = 1.1 * tol_g * (fabs(u) + tol_u) + (fabs(silu) + 1.1 * tol_g) * tol_u + 16.0 * eps24 * fabs(want) +
            ulp_of(c->activation, want);
      if (!(fabs(got - want) <= tol)) {
        if (++bad <= 5) {
          fprintf(stderr, "gate+up: mid[%lld, %lld] = %.9g, reference %.9g (tolerance %.3g)\n", (long long)pair,
                  (long long)col, got, want, tol);
        }
      }
    }
  }
  return bad;
}

/* Checks out [T, hidden] against sum over valid slots of weight * (mid[pair] Wd) in FP64. */
static int check_down(const LayerCase* c, const Experts* down, int32_t scaling, const int32_t* ids,
                      const float* weights, const uint16_t* mid, const uint16_t* out) {
  const double* w_all = scaling == SLIMSERVE_SCALING_PER_GROUP_SUM ? down->exact : down->rounded;
  const double sum_tolerance = 2.0 * (double)(down->k + 2) * eps24;
  int64_t token, col, slot, i;
  int bad = 0;
  for (token = 0; token < c->tokens; ++token) {
    for (col = 0; col < c->hidden; ++col) {
      const double got = from_activation(c->activation, out[token * c->hidden + col]);
      double want = 0, tol = 0;
      for (slot = 0; slot < c->top_k; ++slot) {
        const int64_t pair = token * c->top_k + slot;
        const int32_t e = ids[pair];
        double sum = 0, magnitude = 0;
        if (!valid_id(e, c->experts)) continue; /* skipped: adds nothing */
        for (i = 0; i < down->k; ++i) {
          const double product = from_activation(c->activation, mid[pair * down->k + i]) *
                                 w_all[(int64_t)e * down->k * down->n + i * down->n + col];
          sum += product;
          magnitude += fabs(product);
        }
        want += (double)weights[pair] * sum;
        tol += (double)weights[pair] * (sum_tolerance * magnitude + (double)(c->top_k + 2) * eps24 * fabs(sum));
      }
      tol += ulp_of(c->activation, want);
      if (!(fabs(got - want) <= tol)) {
        if (++bad <= 5) {
          fprintf(stderr, "down: out[%lld, %lld] = %.9g, reference %.9g (tolerance %.3g)\n", (long long)token,
                  (long long)col, got, want, tol);
        }
      }
    }
  }
  return bad;
}

static slimserve_moe_gemm_args gemm_args(const LayerCase* c, const Experts* w, int32_t epilogue, const void* a,
                                         const int32_t* ids, const float* weights, void* out) {
  slimserve_moe_gemm_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.activation = c->activation;
  args.epilogue = epilogue;
  args.num_tokens = c->tokens;
  args.top_k = c->top_k;
  args.num_experts = c->experts;
  args.k = w->k;
  args.n = w->n;
  args.group_size = w->group_size;
  args.a = a;
  args.b = w->packed;
  args.scales = w->scales;
  args.zeros = w->zeros;
  args.topk_ids = ids;
  args.topk_weights = epilogue == SLIMSERVE_MOE_DOWN_WEIGHTED_SUM ? weights : NULL;
  args.c = out;
  args.max_tokens = c->max_tokens;
  return args;
}

static void run_layer(const LayerCase* c) {
  const int64_t pairs = c->tokens * c->top_k;
  const size_t x_bytes = (size_t)(c->tokens * c->hidden) * sizeof(uint16_t);
  const size_t mid_bytes = (size_t)(pairs * c->inter) * sizeof(uint16_t);
  const size_t out_bytes = (size_t)(c->tokens * c->hidden) * sizeof(uint16_t);
  Experts up = make_experts(c->experts, c->hidden, 2 * c->inter, c->group_up, c->symmetric, c->activation);
  Experts down = make_experts(c->experts, c->inter, c->hidden, c->group_down, c->symmetric, c->activation);
  int32_t* ids = malloc((size_t)pairs * sizeof *ids);
  float* weights = malloc((size_t)pairs * sizeof *weights);
  uint16_t* x = malloc(x_bytes);
  uint16_t* mid = malloc(mid_bytes);
  uint16_t* out = malloc(out_bytes);
  uint16_t* again = malloc(mid_bytes > out_bytes ? mid_bytes : out_bytes);
  void *d_ids, *d_weights, *d_x, *d_mid, *d_out, *d_routing_ws = NULL, *d_down_ws = NULL;
  slimserve_moe_routing_args route;
  slimserve_moe_routing_plan* routing_plan = NULL;
  slimserve_moe_gemm_plan *up_plan = NULL, *down_plan = NULL;
  slimserve_moe_gemm_plan_info up_info, down_info;
  slimserve_moe_gemm_args up_args, down_args;
  slimserve_moe_routing routing;
  size_t routing_bytes = 0, up_bytes = 1, down_bytes = 0;
  int64_t i;
  int run;
  const int all_valid = c->kind != ROUTE_WITH_INVALID;

  make_routing(c->kind, c->tokens, c->top_k, c->experts, ids, weights);
  for (i = 0; i < c->tokens * c->hidden; ++i) x[i] = random_activation(c->activation);
  d_ids = upload(ids, (size_t)pairs * sizeof *ids);
  d_weights = upload(weights, (size_t)pairs * sizeof *weights);
  d_x = upload(x, x_bytes);
  CHECK_OK(slimserve_device_alloc(mid_bytes, &d_mid));
  CHECK_OK(slimserve_device_alloc(out_bytes, &d_out));

  /* Plans (host, once) and the workspaces they bound. */
  memset(&route, 0, sizeof route);
  route.struct_size = sizeof route;
  route.num_tokens = c->tokens;
  route.top_k = c->top_k;
  route.num_experts = c->experts;
  route.topk_ids = d_ids;
  route.max_tokens = c->max_tokens;
  CHECK_OK(slimserve_moe_routing_workspace_size(&route, &routing_bytes));
  CHECK_OK(slimserve_moe_routing_plan_create(&route, &routing_plan));
  up_args = gemm_args(c, &up, SLIMSERVE_MOE_GATE_UP_SILU, d_x, d_ids, d_weights, d_mid);
  down_args = gemm_args(c, &down, SLIMSERVE_MOE_DOWN_WEIGHTED_SUM, d_mid, d_ids, d_weights, d_out);
  CHECK_OK(slimserve_moe_gemm_workspace_size(&up_args, &up_bytes));
  CHECK_OK(slimserve_moe_gemm_workspace_size(&down_args, &down_bytes));
  EXPECT(up_bytes == 0); /* gate+up keeps nothing between its tiles */
  EXPECT(down_bytes >= (size_t)(c->max_tokens * c->top_k * c->hidden) * sizeof(float));
  CHECK_OK(slimserve_moe_gemm_plan_create(&up_args, &up_plan));
  CHECK_OK(slimserve_moe_gemm_plan_create(&down_args, &down_plan));
  memset(&up_info, 0, sizeof up_info);
  up_info.struct_size = sizeof up_info;
  down_info = up_info;
  CHECK_OK(slimserve_moe_gemm_plan_get_info(up_plan, &up_info));
  CHECK_OK(slimserve_moe_gemm_plan_get_info(down_plan, &down_info));
  EXPECT(up_info.max_tokens == c->max_tokens && up_info.workspace_bytes == 0);
  EXPECT(down_info.workspace_bytes == down_bytes && down_info.max_tiles >= 1);
  CHECK_OK(slimserve_device_alloc(routing_bytes, &d_routing_ws));
  CHECK_OK(slimserve_device_alloc(down_bytes, &d_down_ws));

  for (run = 0; run < 2; ++run) { /* the second run over stale workspaces: the same bits */
    poison(d_mid, mid_bytes);
    poison(d_out, out_bytes);
    CHECK_OK(slimserve_memset_async(d_routing_ws, run == 0 ? 0xFF : 0x7F, routing_bytes, NULL));
    CHECK_OK(slimserve_memset_async(d_down_ws, run == 0 ? 0xFF : 0x7F, down_bytes, NULL));
    memset(&routing, 0, sizeof routing);
    CHECK_OK(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes, NULL, &routing));
    EXPECT(routing.num_tokens == c->tokens && routing.top_k == c->top_k && routing.topk_ids == d_ids);
    CHECK_OK(slimserve_moe_gemm_run(up_plan, &up_args, &routing, NULL, 0, NULL));
    CHECK_OK(slimserve_moe_gemm_run(down_plan, &down_args, &routing, d_down_ws, down_bytes, NULL));
    if (all_valid) {
      CHECK_OK(slimserve_moe_routing_read_status(&routing, NULL));
    } else {
      char expected[64];
      slimserve_moe_routing_status word;
      sprintf(expected, "topk_ids[0, 0] = %d", (int)c->experts);
      EXPECT_REFUSED(slimserve_moe_routing_read_status(&routing, NULL), SLIMSERVE_OUT_OF_RANGE, expected);
      EXPECT_REFUSED(slimserve_moe_routing_read_status(&routing, NULL), SLIMSERVE_OUT_OF_RANGE, "skipped");
      download(&word, routing.status, sizeof word); /* what an engine copies with its outputs */
      EXPECT(word.invalid_pairs == (pairs > 3 ? 2 : 1) && word.first_invalid == 0 && word.first_id == c->experts);
    }
    if (run == 0) {
      download(mid, d_mid, mid_bytes);
      download(out, d_out, out_bytes);
    } else {
      download(again, d_out, out_bytes);
      EXPECT(memcmp(again, out, out_bytes) == 0);
      download(again, d_mid, mid_bytes);
      EXPECT(memcmp(again, mid, mid_bytes) == 0);
    }
  }
  {
    const int bad_up = check_gate_up(c, &up, up_info.scaling, ids, x, mid);
    const int bad_down = check_down(c, &down, down_info.scaling, ids, weights, mid, out);
    if (bad_up != 0 || bad_down != 0) {
      fprintf(stderr, "layer (%s, T %lld of %lld, top-%lld of %lld, groups %lld/%lld, %s, routing %d): %d gate+up "
              "and %d down elements off\n", c->activation == SLIMSERVE_ACT_BF16 ? "bf16" : "fp16",
              (long long)c->tokens, (long long)c->max_tokens, (long long)c->top_k, (long long)c->experts,
              (long long)c->group_up, (long long)c->group_down, c->symmetric ? "symmetric" : "asymmetric", c->kind,
              bad_up, bad_down);
      ++failures;
    }
  }

  slimserve_moe_gemm_plan_destroy(up_plan);
  slimserve_moe_gemm_plan_destroy(down_plan);
  slimserve_moe_routing_plan_destroy(routing_plan);
  release(d_ids);
  release(d_weights);
  release(d_x);
  release(d_mid);
  release(d_out);
  release(d_routing_ws);
  release(d_down_ws);
  free_experts(&up);
  free_experts(&down);
  free(ids);
  free(weights);
  free(x);
  free(mid);
  free(out);
  free(again);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void test_refusals(void) {
  enum { T = 4, TOP_K = 2, E = 6, HIDDEN = 64, INTER = 32 };
  LayerCase c;
  Experts down;
  int32_t ids[T * TOP_K];
  float weights[T * TOP_K];
  uint16_t x[T * TOP_K * INTER]; /* the down GEMM's a: one row per pair */
  uint16_t out[T * HIDDEN], after[T * HIDDEN];
  void *d_ids, *d_other_ids, *d_weights, *d_x, *d_out, *d_routing_ws, *d_down_ws;
  slimserve_moe_routing_args route, bigger_route[2];
  slimserve_moe_routing_plan* routing_plan = NULL;
  slimserve_moe_gemm_plan* plan = NULL;
  slimserve_moe_gemm_args args;
  slimserve_moe_routing routing, other_routing;
  slimserve_moe_gemm_plan_info info;
  size_t routing_bytes = 0, down_bytes = 0, bytes = 0;
  int i;

  memset(&c, 0, sizeof c);
  c.activation = SLIMSERVE_ACT_BF16;
  c.tokens = T;
  c.max_tokens = T;
  c.top_k = TOP_K;
  c.experts = E;
  c.hidden = HIDDEN;
  c.inter = INTER;
  down = make_experts(E, INTER, HIDDEN, 32, 1, SLIMSERVE_ACT_BF16);
  make_routing(ROUTE_RANDOM, T, TOP_K, E, ids, weights);
  for (i = 0; i < T * TOP_K * INTER; ++i) x[i] = random_activation(SLIMSERVE_ACT_BF16);
  d_ids = upload(ids, sizeof ids);
  d_other_ids = upload(ids, sizeof ids);
  d_weights = upload(weights, sizeof weights);
  d_x = upload(x, sizeof x);
  CHECK_OK(slimserve_device_alloc(sizeof out, &d_out));

  /* Expert ids out of range: the host check names token, slot and id. */
  CHECK_OK(slimserve_moe_validate_routing(ids, T, TOP_K, E));
  ids[2 * TOP_K + 1] = E;
  EXPECT_REFUSED(slimserve_moe_validate_routing(ids, T, TOP_K, E), SLIMSERVE_OUT_OF_RANGE, "topk_ids[2, 1] = 6");
  ids[2 * TOP_K + 1] = -1;
  EXPECT_REFUSED(slimserve_moe_validate_routing(ids, T, TOP_K, E), SLIMSERVE_OUT_OF_RANGE, "is outside 0..5");
  EXPECT_REFUSED(slimserve_moe_validate_routing(NULL, T, TOP_K, E), SLIMSERVE_INVALID_ARGUMENT, "host_topk_ids");

  /* The routing plan: top_k > E, T < 1, struct sizes. */
  memset(&route, 0, sizeof route);
  route.struct_size = sizeof route;
  route.num_tokens = T;
  route.top_k = E + 1;
  route.num_experts = E;
  route.topk_ids = d_ids;
  EXPECT_REFUSED(slimserve_moe_routing_plan_create(&route, &routing_plan), SLIMSERVE_INVALID_ARGUMENT,
                 "top_k = 7 must be in 1..6");
  EXPECT(routing_plan == NULL);
  EXPECT_REFUSED(slimserve_moe_routing_workspace_size(&route, &routing_bytes), SLIMSERVE_INVALID_ARGUMENT, "top_k");
  route.top_k = TOP_K;
  route.num_tokens = 0;
  EXPECT_REFUSED(slimserve_moe_routing_plan_create(&route, &routing_plan), SLIMSERVE_INVALID_ARGUMENT, "num_tokens");
  route.num_tokens = T;
  route.struct_size = sizeof route - sizeof(int64_t) - sizeof(int32_t);
  EXPECT_REFUSED(slimserve_moe_routing_plan_create(&route, &routing_plan), SLIMSERVE_INVALID_ARGUMENT,
                 "routing args->struct_size");
  route.struct_size = sizeof route;
  route.align = 3;
  EXPECT_REFUSED(slimserve_moe_routing_plan_create(&route, &routing_plan), SLIMSERVE_INVALID_ARGUMENT,
                 "unknown MoE align method 3");
  route.align = SLIMSERVE_MOE_ALIGN_AUTOMATIC;
  /* A newer header's struct with a field this library does not know set: refused. */
  memset(bigger_route, 0, sizeof bigger_route);
  memcpy(&bigger_route[0], &route, sizeof route);
  bigger_route[0].struct_size = 2 * sizeof route;
  EXPECT(slimserve_moe_routing_workspace_size(&bigger_route[0], &routing_bytes) == SLIMSERVE_OK);
  bigger_route[1].num_tokens = 1;
  EXPECT_REFUSED(slimserve_moe_routing_workspace_size(&bigger_route[0], &routing_bytes), SLIMSERVE_UNSUPPORTED,
                 "newer header");
  CHECK_OK(slimserve_moe_routing_workspace_size(&route, &routing_bytes));
  CHECK_OK(slimserve_moe_routing_plan_create(&route, &routing_plan));
  CHECK_OK(slimserve_device_alloc(routing_bytes, &d_routing_ws));

  /* A short routing workspace: refused before any launch. */
  memset(&routing, 0x5A, sizeof routing);
  EXPECT_REFUSED(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes - 1, NULL, &routing),
                 SLIMSERVE_RESOURCE_EXHAUSTED, "routing workspace of");
  EXPECT(routing.num_tokens == 0x5A5A5A5A5A5A5A5All); /* *out not written on an error */
  EXPECT_REFUSED(slimserve_moe_routing_run(routing_plan, &route, NULL, 0, NULL, &routing),
                 SLIMSERVE_RESOURCE_EXHAUSTED, "the plan needs");
  /* More tokens than the plan serves. */
  route.num_tokens = T + 1;
  EXPECT_REFUSED(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes, NULL, &routing),
                 SLIMSERVE_INVALID_ARGUMENT, "plan again");
  route.num_tokens = T;
  CHECK_OK(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes, NULL, &routing));

  /* The down GEMM: struct size, top_k > E, shapes, short workspace, foreign routing. */
  args = gemm_args(&c, &down, SLIMSERVE_MOE_DOWN_WEIGHTED_SUM, d_x, d_ids, d_weights, d_out);
  args.struct_size = 8;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_create(&args, &plan), SLIMSERVE_INVALID_ARGUMENT, "MoE GEMM args->struct_size");
  args.struct_size = sizeof args;
  args.top_k = E + 1;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_create(&args, &plan), SLIMSERVE_INVALID_ARGUMENT, "top_k = 7 must be in 1..6");
  args.top_k = TOP_K;
  args.n = 40;
  EXPECT_REFUSED(slimserve_moe_gemm_workspace_size(&args, &bytes), SLIMSERVE_UNSUPPORTED, "n = 40");
  args.n = HIDDEN;
  args.topk_weights = NULL;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_create(&args, &plan), SLIMSERVE_INVALID_ARGUMENT, "topk_weights is null");
  args.topk_weights = d_weights;
  args.epilogue = 2;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_create(&args, &plan), SLIMSERVE_INVALID_ARGUMENT, "unknown MoE epilogue 2");
  args.epilogue = SLIMSERVE_MOE_DOWN_WEIGHTED_SUM;
  args.activation = 7;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_create(&args, &plan), SLIMSERVE_INVALID_ARGUMENT, "activation dtype 7");
  args.activation = SLIMSERVE_ACT_BF16;
  EXPECT(plan == NULL);
  CHECK_OK(slimserve_moe_gemm_workspace_size(&args, &down_bytes));
  CHECK_OK(slimserve_moe_gemm_plan_create(&args, &plan));
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info - 4;
  EXPECT_REFUSED(slimserve_moe_gemm_plan_get_info(plan, &info), SLIMSERVE_INVALID_ARGUMENT, "info->struct_size");
  CHECK_OK(slimserve_device_alloc(down_bytes, &d_down_ws));

  poison(d_out, sizeof out);
  download(out, d_out, sizeof out);
  EXPECT_REFUSED(slimserve_moe_gemm_run(plan, &args, &routing, d_down_ws, down_bytes - 4, NULL),
                 SLIMSERVE_RESOURCE_EXHAUSTED, "GEMM workspace of");
  EXPECT_REFUSED(slimserve_moe_gemm_run(plan, &args, &routing, NULL, 0, NULL), SLIMSERVE_RESOURCE_EXHAUSTED,
                 "the plan needs");
  EXPECT_REFUSED(slimserve_moe_gemm_run(plan, &args, NULL, d_down_ws, down_bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "routing is null");
  /* A routing aligned from other ids (same values, another buffer): refused. */
  route.topk_ids = d_other_ids;
  CHECK_OK(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes, NULL, &other_routing));
  EXPECT_REFUSED(slimserve_moe_gemm_run(plan, &args, &other_routing, d_down_ws, down_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "the routing was aligned for");
  args.num_tokens = T + 1;
  EXPECT_REFUSED(slimserve_moe_gemm_run(plan, &args, &routing, d_down_ws, down_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "plan again");
  args.num_tokens = T;
  download(after, d_out, sizeof after);
  EXPECT(memcmp(out, after, sizeof out) == 0); /* nothing was written */

  /* After the refusals, the same arguments run (the refusals changed nothing). */
  route.topk_ids = d_ids;
  CHECK_OK(slimserve_moe_routing_run(routing_plan, &route, d_routing_ws, routing_bytes, NULL, &routing));
  CHECK_OK(slimserve_moe_gemm_run(plan, &args, &routing, d_down_ws, down_bytes, NULL));
  CHECK_OK(slimserve_moe_routing_read_status(&routing, NULL));
  download(after, d_out, sizeof after);
  for (i = 0; i < T * HIDDEN; ++i) EXPECT(!isnan(from_bf16(after[i])));

  slimserve_moe_gemm_plan_destroy(plan);
  slimserve_moe_routing_plan_destroy(routing_plan);
  release(d_ids);
  release(d_other_ids);
  release(d_weights);
  release(d_x);
  release(d_out);
  release(d_routing_ws);
  release(d_down_ws);
  free_experts(&down);
}

int main(void) {
  /* activation, T, max_tokens, top_k, E, hidden, inter, group up / down, symmetric, routing */
  static const LayerCase cases[] = {
      {SLIMSERVE_ACT_BF16, 5, 5, 1, 4, 64, 32, 32, 32, 1, ROUTE_RANDOM},
      {SLIMSERVE_ACT_BF16, 7, 16, 2, 6, 128, 64, 64, 64, 0, ROUTE_RANDOM},
      {SLIMSERVE_ACT_FP16, 9, 9, 8, 10, 64, 48, 32, 48, 1, ROUTE_RANDOM},
      {SLIMSERVE_ACT_BF16, 12, 12, 2, 10, 64, 32, 64, 32, 0, ROUTE_FEW_EXPERTS},
      {SLIMSERVE_ACT_FP16, 17, 20, 8, 12, 64, 32, 32, 32, 0, ROUTE_ONE_EXPERT_ALL_TOKENS},
      {SLIMSERVE_ACT_BF16, 3, 3, 1, 3, 64, 32, 64, 32, 1, ROUTE_ONE_EXPERT_ALL_TOKENS},
      {SLIMSERVE_ACT_BF16, 6, 8, 2, 5, 64, 32, 32, 32, 1, ROUTE_WITH_INVALID},
  };
  size_t i;
  start_test("c_moe_test");
  EXPECT(slimserve_c_abi_version() >= 2);
  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_layer(&cases[i]);
  test_refusals();
  return finish_test("c_moe_test");
}
