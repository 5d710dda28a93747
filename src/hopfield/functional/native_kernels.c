/* CPU kernels of hopfield.functional.native: the row-wise selection and the gathered products
 * behind Top-K and random-mask attention. Compiled on first use by native.py (plain C, no
 * PyTorch headers, so it builds in a second), loaded with ctypes and called on the data of
 * contiguous tensors. Every function has a float and a double version (name_f32, name_f64) and
 * splits its rows over `threads` threads of PyTorch's OpenMP pool (POSIX threads without OpenMP).
 *
 * hop_topk:          the k largest entries of each row of x (R, W), unsorted, with their columns;
 * hop_topk_push/finish: the same for rows whose columns arrive in chunks.
 * hop_topk_keep:     rows of x with their k largest entries kept and the others -inf, the
 *                    additive mask of that selection (0 and -inf) or the Softmax_n weights
 *                    over the kept entries.
 * hop_sample_keep:   the same outputs for a uniform random subset of each row's columns;
 * hop_sample_indices: those subsets as column indices.
 * hop_topk_attend:   Top-K Softmax_n attention without gradients, product (the caller's BLAS
 *                    gemm), selection, weights and weighted sum in one parallel region;
 * hop_sample_attend: the same for random masks (the subsets of hop_sample_indices; the scores
 *                    from a gemm where many keys are kept, else gathered dot products);
 * hop_gather_dot:    out[r, j] = <a[r], table[idx[r, j]]>               (R, K)
 * hop_scatter_outer: dst[idx[r, j]] += w[r, j] * src[r]                 dst (M, E)
 * hop_rms_forward/backward: RMS normalisation over the rows of x (R, n) and its gradients.
 * hop_floyd:         uniform subsets without replacement per row (Floyd's algorithm).
 *
 * Every exported function returns 0, or HOP_NO_MEMORY when a scratch allocation failed (the
 * outputs are then incomplete; native.py raises MemoryError), or, for the attention kernels,
 * HOP_BAD_COUNTS or HOP_BAD_INDEX (a ValueError there); the threads' codes are or-ed. The
 * callers in native.py check shapes, dtypes, index ranges and uniforms before they get here: the
 * kernels trust them.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define MAX_THREADS 256
#define HOP_NO_MEMORY 1
#define HOP_BAD_COUNTS 2
#define HOP_BAD_INDEX 4

/* Work on the rows [lo, hi); returns 0 or HOP_NO_MEMORY. */
typedef int (*range_fn)(void *args, int64_t lo, int64_t hi);

/* A BLAS's setting of its own threads for the calling thread only (MKL's
 * MKL_Set_Num_Threads_Local: returns the previous setting, 0 restores the global one). The
 * kernels that call a BLAS product set it to 1 in each of their threads: called from a thread
 * outside a parallel region, the product would start threads of its own. */
typedef int (*local_threads_fn)(int);

/* fn over [0, n) with BLAS products kept on the calling threads (see local_threads_fn); NULL:
 * no setting to make. */
static int parallel_for_local(range_fn fn, void *args, int64_t n, int threads, int per_thread,
                              local_threads_fn local);

static int parallel_for(range_fn fn, void *args, int64_t n, int threads, int per_thread) {
    return parallel_for_local(fn, args, n, threads, per_thread, NULL);
}

/* Ranges of rows per thread that parallel_for hands out (SCAN_ALL: one, for kernels whose every
 * range scans all the input, as hop_scatter_outer's). */
#define PIECES 8
#define SCAN_ALL 1

#ifdef _OPENMP
#include <omp.h>

/* Run fn over [0, n) on up to `threads` threads of the OpenMP runtime PyTorch has loaded
 * (libgomp.so.1 is already in the process, so this library shares its thread pool: no second
 * set of threads competes with PyTorch's spinning workers). The rows are cut into `per_thread`
 * contiguous ranges per thread, which the threads claim in turn: on a busy CPU a thread that
 * gets its core late finds the work done by the others instead of holding the call up for a
 * fixed share of it. */
static int parallel_for_local(range_fn fn, void *args, int64_t n, int threads, int per_thread,
                              local_threads_fn local) {
    if (threads > n) threads = (int)n;
    if (threads <= 1) {
        int saved = local && n > 0 ? local(1) : 0;
        int status = n > 0 ? fn(args, 0, n) : 0;
        if (local && n > 0) local(saved);
        return status;
    }
    int64_t pieces = (int64_t)threads * per_thread, next = 0;
    if (pieces > n) pieces = n;
    int status = 0;
#pragma omp parallel num_threads(threads)
    {
        int failed = 0, saved = local ? local(1) : 0;
        for (;;) {
            int64_t piece;
#pragma omp atomic capture
            piece = next++;
            if (piece >= pieces) break;
            failed |= fn(args, n * piece / pieces, n * (piece + 1) / pieces);
        }
        if (local) local(saved);
#pragma omp atomic
        status |= failed;
    }
    return status;
}
#else
typedef struct {
    range_fn fn;
    void *args;
    int64_t lo, hi;
    int status;
    local_threads_fn local;
} job_t;

static void *run_job(void *p) {
    job_t *job = (job_t *)p;
    int saved = job->local ? job->local(1) : 0;
    job->status = job->fn(job->args, job->lo, job->hi);
    if (job->local) job->local(saved);
    return NULL;
}

/* Without OpenMP: one contiguous range per POSIX thread (the calling thread takes the first). */
static int parallel_for_local(range_fn fn, void *args, int64_t n, int threads, int per_thread,
                              local_threads_fn local) {
    (void)per_thread;
    if (n <= 0) return 0;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n) threads = (int)n;
    if (threads < 1) threads = 1;
    job_t jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        jobs[t].fn = fn;
        jobs[t].args = args;
        jobs[t].lo = n * t / threads;
        jobs[t].hi = n * (t + 1) / threads;
        jobs[t].status = 0;
        jobs[t].local = local;
        started[t] = 0;
    }
    for (int t = 1; t < threads; t++)
        started[t] = pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    int status = jobs[0].status;
    for (int t = 1; t < threads; t++) {
        if (started[t])
            pthread_join(ids[t], NULL);
        else
            run_job(&jobs[t]); /* no thread to be had: do its share here */
        status |= jobs[t].status;
    }
    return status;
}
#endif

/* Floyd's algorithm per row, as hopfield.functional.efficient.floyd_sample: row r draws count[r]
 * distinct integers of [0, n[r]) from the uniforms rand[r, :count[r]] (slot i picks
 * floor(u (top + 1)) of [0, top], top = n - count + i, or top itself when the pick is taken);
 * slots past count[r] hold 0. A byte per key marks the picks (cleared after each row). */
typedef struct {
    const double *rand;
    const int64_t *count, *n;
    int64_t slots, width;
    int64_t *out;
} floyd_args;

static int floyd_range(void *p, int64_t lo, int64_t hi) {
    floyd_args *a = (floyd_args *)p;
    unsigned char *taken = (unsigned char *)calloc(a->width > 0 ? a->width : 1, 1);
    if (!taken) return HOP_NO_MEMORY;
    for (int64_t r = lo; r < hi; r++) {
        const double *u = a->rand + r * a->slots;
        int64_t *out = a->out + r * a->slots, count = a->count[r], n = a->n[r];
        for (int64_t i = 0; i < a->slots; i++) out[i] = 0;
        for (int64_t i = 0; i < count; i++) {
            int64_t top = n - count + i;
            double slot = floor(u[i] * (double)(top + 1));
            /* u = 1 (or anything outside [0, 1), which native.py rejects) gives the top */
            int64_t pick = slot >= 0 && slot < (double)top ? (int64_t)slot : top;
            if (taken[pick]) pick = top;
            taken[pick] = 1;
            out[i] = pick;
        }
        for (int64_t i = 0; i < count; i++) taken[out[i]] = 0;
    }
    free(taken);
    return 0;
}

int hop_floyd(const double *rand, const int64_t *count, const int64_t *n, int64_t rows,
              int64_t slots, int64_t width, int64_t *out, int threads) {
    floyd_args a = {rand, count, n, slots, width, out};
    return parallel_for(floyd_range, &a, rows, threads, PIECES);
}

/* Capacity of a row's buffer and the modes of its running selection (see state_f32). */
#define CAP(k) (4 * (k))
#define FRESH 0
#define BOUND 1
#define STRICT 2

/* Order of the selection: larger first, NaN above everything (as torch.topk). */
/* What hop_topk_keep writes (see keep_row_f32). */
#define KEEP_VALUES 0
#define KEEP_BIAS 1
#define KEEP_SOFTMAX 2

/* The width of the vectors of weigh_row (GCC/Clang vector extensions: AVX-512 registers where
 * the machine has them, pairs or quads of narrower ones elsewhere). */
#define VECTOR_BYTES 64

/* Widest rows that hop_topk_attend selects in one radix select (wider ones: push and finish). */
#define SELECT_WIDTH 1024

#define ABOVE(a, b) ((a) > (b) || ((a) != (a) && (b) == (b)))

/* exp of x <= 0 (or NaN) for the softmax of hop_topk_keep. float: 2^i · p(f) with the reduced
 * argument |f| <= ln2 / 2 and p its degree-6 Taylor polynomial (relative error below 2e-7);
 * branch-free, so the loops vectorise; 0 below -87.3 (where exp is subnormal), NaN kept. */
static inline float exp_f32(float x) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f;
    float rounded = (t + magic) - magic;
    float f = x - rounded * 0.693145751953125f - rounded * 1.428606765330187e-06f;
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 +
              f * (1.0f / 720))))));
    int32_t i = (int32_t)(rounded > -126.0f ? rounded : -126.0f);
    uint32_t bits = (uint32_t)(i + 127) << 23;
    float power;
    memcpy(&power, &bits, sizeof(power));
    float y = p * power;
    y = x < -87.3f ? 0.0f : y;
    return x != x ? x : y;
}

static inline double exp_f64(double x) { return exp(x); }

/* Number i of the splitmix64 stream (Steele, Lea and Flood 2014) that starts at `start`, given
 * its state start + i * golden (computed by the caller): two multiply-xorshift rounds. */
static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A uniform integer of [0, bound) from a uniform 64-bit draw: the high word of draw * bound. */
static inline uint64_t below(uint64_t draw, uint64_t bound) {
#ifdef __SIZEOF_INT128__
    return (uint64_t)(((unsigned __int128)draw * bound) >> 64);
#else
    uint64_t pick = (uint64_t)((double)(draw >> 11) * 0x1.0p-53 * (double)bound);
    return pick < bound ? pick : bound - 1;
#endif
}

/* Rows of (B·H, queries) whose subsets are drawn: row r is query start + r % queries of a
 * sequence of `length` in batch-head r / queries, and its stream is keyed by that query's place
 * in the whole (B·H, length) call, so blocks of queries draw what one block would. */
typedef struct {
    int64_t queries, length, start;
} stream_rows;

static inline uint64_t stream_id(int64_t r, const stream_rows *rows) {
    return (uint64_t)((r / rows->queries) * rows->length + rows->start + r % rows->queries);
}

/* The first state of the splitmix64 stream of (seed, id), seed ^ id * STREAM_KEY, and the step
 * between its states. */
#define STREAM_KEY 0xd1342543de82ef95ull
#define STREAM_STEP 0x9e3779b97f4a7c15ull

/* Floyd's algorithm (as hop_floyd) for count distinct picks of [0, n), on the splitmix64 stream
 * of (seed, id): pick i takes a uniform draw of [0, top], top = n - count + i, or top itself
 * when that is taken. Marks the picks in taken (n bytes, zero on entry) and writes them to
 * picks[i * stride] (unless picks is NULL), in order. */
static void floyd_stream(uint64_t seed, uint64_t id, int64_t count, int64_t n,
                         unsigned char *taken, int64_t *picks, int64_t stride) {
    const uint64_t start = seed ^ (id * STREAM_KEY);
    for (int64_t i = 0; i < count; i++) {
        uint64_t top = (uint64_t)(n - count + i);
        uint64_t pick = below(splitmix64(start + (uint64_t)(i + 1) * STREAM_STEP), top + 1);
        pick += (top - pick) & ((uint64_t)0 - taken[pick]); /* taken: top (no branch) */
        taken[pick] = 1;
        if (picks) picks[i * stride] = (int64_t)pick;
    }
}

/* floyd_streams draws FLOYD_LANES streams at once; with AVX-512 (F and DQ), eight 64-bit lanes
 * a vector for every population of at most FLOYD_LANE_KEYS. */
#define FLOYD_LANES 16
#define FLOYD_LANE_KEYS 128

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* Eight streams of floyd_stream in the lanes of vectors: their states, their tops, their counts
 * of picks and the map of the taken keys (keys 0-63 in lower, 64-127 in upper). */
typedef struct {
    __m512i state, top, counts, lower, upper;
} floyd_group;

static void floyd_group_start(floyd_group *g, uint64_t seed, const uint64_t *ids, int lanes,
                              const int64_t *count, const int64_t *population) {
    int64_t counts[8] = {0}, populations[8] = {0};
    uint64_t streams[8] = {0};
    for (int l = 0; l < lanes; l++)
        counts[l] = count[l], populations[l] = population[l], streams[l] = ids[l];
    g->counts = _mm512_loadu_si512(counts);
    g->state = _mm512_xor_si512(
        _mm512_set1_epi64((long long)seed),
        _mm512_mullo_epi64(_mm512_loadu_si512(streams), _mm512_set1_epi64((long long)STREAM_KEY)));
    g->top = _mm512_sub_epi64(_mm512_loadu_si512(populations), g->counts);
    g->lower = g->upper = _mm512_setzero_si512();
}

/* Pick i of the eight streams (as floyd_stream: splitmix64, the high word of draw * bound from
 * two 32-bit products, exact as bound < 2^32, and top when the pick is taken); lanes whose
 * count is reached leave their map alone. */
static inline __m512i floyd_group_pick(floyd_group *g, int64_t i) {
    const __m512i one = _mm512_set1_epi64(1), low_bits = _mm512_set1_epi64(63);
    const __m512i half = _mm512_set1_epi64(64);
    const __mmask8 active = _mm512_cmpgt_epi64_mask(g->counts, _mm512_set1_epi64(i));
    g->state = _mm512_add_epi64(g->state, _mm512_set1_epi64((long long)STREAM_STEP));
    __m512i z = _mm512_xor_si512(g->state, _mm512_srli_epi64(g->state, 30));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ull));
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 27));
    z = _mm512_mullo_epi64(z, _mm512_set1_epi64((long long)0x94d049bb133111ebull));
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    const __m512i top = g->top, bound = _mm512_add_epi64(top, one);
    const __m512i low = _mm512_srli_epi64(_mm512_mul_epu32(z, bound), 32);
    const __m512i high = _mm512_mul_epu32(_mm512_srli_epi64(z, 32), bound);
    const __m512i pick = _mm512_srli_epi64(_mm512_add_epi64(high, low), 32);
    /* the bits of pick and top are made off the map's dependency chain */
    const __mmask8 pick_upper = _mm512_cmpge_epu64_mask(pick, half);
    const __mmask8 top_upper = _mm512_cmpge_epu64_mask(top, half);
    const __m512i pick_bit = _mm512_sllv_epi64(one, _mm512_and_si512(pick, low_bits));
    const __m512i top_bit = _mm512_sllv_epi64(one, _mm512_and_si512(top, low_bits));
    const __m512i word = _mm512_mask_blend_epi64(pick_upper, g->lower, g->upper);
    const __mmask8 taken = _mm512_test_epi64_mask(word, pick_bit);
    const __m512i bit = _mm512_mask_blend_epi64(taken, pick_bit, top_bit);
    const __mmask8 upper = (pick_upper & ~taken) | (top_upper & taken);
    g->lower = _mm512_mask_or_epi64(g->lower, active & ~upper, g->lower, bit);
    g->upper = _mm512_mask_or_epi64(g->upper, active & upper, g->upper, bit);
    g->top = _mm512_add_epi64(top, one);
    return _mm512_mask_blend_epi64(taken, pick, top);
}
#endif

/* floyd_stream for the streams of rows first + l, l < lanes <= FLOYD_LANES, of a stream_rows
 * layout: row l draws count[l] picks of [0, population[l]) into drawn (FLOYD_LANES * span
 * slots, span >= every count), the picks those of floyd_stream, bit for bit. With AVX-512 and
 * every population at most FLOYD_LANE_KEYS, two floyd_groups side by side (their chains
 * overlap), pick i of row l at drawn[FLOYD_LANES * i + l]: returns FLOYD_LANES. Else one row
 * after another, with taken (zero on entry and on return) as floyd_stream's map, row l's picks
 * in order at drawn + l * span: returns 1. */
static int64_t floyd_streams(uint64_t seed, const stream_rows *rows, int64_t first, int lanes,
                             const int64_t *count, const int64_t *population,
                             unsigned char *taken, int64_t *drawn, int64_t span) {
    uint64_t ids[FLOYD_LANES];
    for (int l = 0; l < lanes; l++) ids[l] = stream_id(first + l, rows);
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    int64_t most = 0, widest = 0;
    for (int l = 0; l < lanes; l++) {
        most = count[l] > most ? count[l] : most;
        widest = population[l] > widest ? population[l] : widest;
    }
    if (widest <= FLOYD_LANE_KEYS) {
        floyd_group first_eight, second_eight;
        floyd_group_start(&first_eight, seed, ids, lanes < 8 ? lanes : 8, count, population);
        floyd_group_start(&second_eight, seed, ids + 8, lanes > 8 ? lanes - 8 : 0, count + 8,
                          population + 8);
        for (int64_t i = 0; i < most; i++) {
            _mm512_storeu_si512(drawn + FLOYD_LANES * i, floyd_group_pick(&first_eight, i));
            _mm512_storeu_si512(drawn + FLOYD_LANES * i + 8, floyd_group_pick(&second_eight, i));
        }
        return FLOYD_LANES;
    }
#endif
    for (int l = 0; l < lanes; l++) {
        int64_t *picks = drawn + l * span;
        floyd_stream(seed, ids[l], count[l], population[l], taken, picks, 1);
        for (int64_t i = 0; i < count[l]; i++) taken[picks[i]] = 0;
    }
    return 1;
}

/* Where floyd_streams (which returned step, given span) put pick i of row l in drawn. */
static inline int64_t drawn_at(int64_t step, int64_t span, int l, int64_t i) {
    return step == 1 ? l * span + i : step * i + l;
}

/* Row l's count picks of floyd_streams in order, mapped through allowed (unless NULL): in place
 * in drawn when they lie in order there (step 1), else copied to picks. */
static inline int64_t *lane_picks(int64_t *drawn, int64_t step, int64_t span, int l,
                                  int64_t count, const int64_t *allowed, int64_t *picks) {
    if (step == 1) {
        int64_t *mine = drawn + drawn_at(step, span, l, 0);
        if (allowed)
            for (int64_t i = 0; i < count; i++) mine[i] = allowed[mine[i]];
        return mine;
    }
    for (int64_t i = 0; i < count; i++) {
        const int64_t pick = drawn[drawn_at(step, span, l, i)];
        picks[i] = allowed ? allowed[pick] : pick;
    }
    return picks;
}

/* The picks of hop_sample_keep as indices: row r of out (R, slots) holds the min(count[r],
 * population[r]) picks of its stream in order, then zeros; `width` bounds every population. */
typedef struct {
    const int64_t *count, *population;
    int64_t slots, width;
    uint64_t seed;
    stream_rows rows;
    int64_t *out;
} indices_args;

static int indices_range(void *p, int64_t lo, int64_t hi) {
    indices_args *a = (indices_args *)p;
    const int64_t slots = a->slots;
    unsigned char *taken = (unsigned char *)calloc(a->width > 0 ? a->width : 1, 1);
    int64_t *drawn = (int64_t *)malloc(sizeof(int64_t) * FLOYD_LANES * (slots > 0 ? slots : 1));
    const int status = !taken || !drawn ? HOP_NO_MEMORY : 0;
    if (status) lo = hi; /* nothing to do but free */
    for (int64_t g = lo; g < hi; g += FLOYD_LANES) {
        const int lanes = (int)(hi - g < FLOYD_LANES ? hi - g : FLOYD_LANES);
        int64_t counts[FLOYD_LANES], populations[FLOYD_LANES];
        for (int l = 0; l < lanes; l++) {
            const int64_t n = a->population[g + l], count = a->count[g + l];
            const int64_t most = n < slots ? n : slots;
            populations[l] = n;
            counts[l] = count < most ? count : most;
        }
        const int64_t step =
            floyd_streams(a->seed, &a->rows, g, lanes, counts, populations, taken, drawn, slots);
        for (int l = 0; l < lanes; l++) {
            int64_t *out = a->out + (g + l) * slots;
            for (int64_t i = 0; i < counts[l]; i++) out[i] = drawn[drawn_at(step, slots, l, i)];
            for (int64_t i = counts[l]; i < slots; i++) out[i] = 0;
        }
    }
    free(taken);
    free(drawn);
    return status;
}

int hop_sample_indices(const int64_t *count, const int64_t *population, int64_t rows,
                       int64_t slots, int64_t width, uint64_t seed, int64_t queries, int64_t length,
                       int64_t start, int64_t *out, int threads) {
    indices_args a = {count, population, slots, width, seed, {queries, length, start}, out};
    return parallel_for(indices_range, &a, rows, threads, PIECES);
}

/* The largest count, or -1 unless 0 <= count <= population <= size for every query of every
 * batch-head: query i of batch-head b reads count[b * count_stride + i] and
 * population[b * population_stride + i] (a stride 0: one array (L) for all batch-heads, L: one
 * row each). The fused attention kernels check their counts themselves: one pass over them. */
static int64_t largest_count(const int64_t *count, const int64_t *population, int64_t heads,
                             int64_t length, int64_t count_stride, int64_t population_stride,
                             int64_t size) {
    int64_t largest = 0;
    const int64_t rows = count_stride || population_stride ? heads : 1;
    for (int64_t b = 0; b < rows; b++)
        for (int64_t i = 0; i < length; i++) {
            const int64_t c = count[b * count_stride + i], n = population[b * population_stride + i];
            if (c < 0 || c > n || n > size) return -1;
            largest = c > largest ? c : largest;
        }
    return largest;
}

/* Query i of batch-head b's count and population in the attention kernels' arguments. */
#define COUNT_OF(a, b, i) ((a)->count[(b) * (a)->count_stride + (i)])
#define POPULATION_OF(a, b, i) ((a)->population[(b) * (a)->population_stride + (i)])

/* Whether a count of kept keys lies outside [0, slots]. */
static inline int count_outside(int64_t count, int64_t slots) { return count < 0 || count > slots; }

/* The vector part of compact_##SUFFIX (below): with AVX-512, one compress of values and one of
 * columns per whole vector of keys, stored as whole vectors at vals + *m and cols + *m (so vals
 * and cols need COMPACT_SLACK slots past the last kept entry); returns the columns done (0
 * without AVX-512). */
#define COMPACT_SLACK 16
static int64_t compact_vectors_f32(const float *row, const uint32_t *keys, int64_t width,
                                   uint32_t split, float *vals, int64_t *cols, int64_t *m) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512i bound = _mm512_set1_epi32((int)split);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= width; i += 16) {
        const __mmask16 kept = _mm512_cmpge_epu32_mask(_mm512_loadu_si512(keys + i), bound);
        const __m512i at = _mm512_maskz_compress_epi32(
            kept, _mm512_add_epi32(lanes, _mm512_set1_epi32((int)i)));
        _mm512_storeu_ps(vals + *m, _mm512_maskz_compress_ps(kept, _mm512_loadu_ps(row + i)));
        _mm512_storeu_si512(cols + *m, _mm512_cvtepi32_epi64(_mm512_castsi512_si256(at)));
        _mm512_storeu_si512(cols + *m + 8, _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(at, 1)));
        *m += __builtin_popcount((unsigned)kept);
    }
#else
    (void)row, (void)keys, (void)width, (void)split, (void)vals, (void)cols, (void)m;
#endif
    return i;
}

static int64_t compact_vectors_f64(const double *row, const uint64_t *keys, int64_t width,
                                   uint64_t split, double *vals, int64_t *cols, int64_t *m) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512i bound = _mm512_set1_epi64((long long)split);
    const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    for (; i + 8 <= width; i += 8) {
        const __mmask8 kept = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(keys + i), bound);
        const __m512i at = _mm512_add_epi64(lanes, _mm512_set1_epi64(i));
        _mm512_storeu_pd(vals + *m, _mm512_maskz_compress_pd(kept, _mm512_loadu_pd(row + i)));
        _mm512_storeu_si512(cols + *m, _mm512_maskz_compress_epi64(kept, at));
        *m += __builtin_popcount((unsigned)kept);
    }
#else
    (void)row, (void)keys, (void)width, (void)split, (void)vals, (void)cols, (void)m;
#endif
    return i;
}

#define DEFINE_KERNELS(T, SUFFIX)                                                                 \
                                                                                                  \
    /* The value of a key (see keys_of_##SUFFIX). */                                              \
    static inline T value_##SUFFIX(KEY key) {                                                     \
        KEY bits = (key & SIGN_##SUFFIX) ? key ^ SIGN_##SUFFIX : ~key;                            \
        T value;                                                                                  \
        memcpy(&value, &bits, sizeof(value));                                                     \
        return value;                                                                             \
    }                                                                                             \
                                                                                                  \
    /* Radix select on the `bits` highest bits of the keys: the largest prefix p with at least k  \
     * keys >= p. With every bit it is the k-th largest key; with fewer, a lower bound of it.     \
     * Each step is one branch-free counting pass. */                                             \
    static KEY kth_key_##SUFFIX(const KEY *keys, int64_t n, int64_t k, int bits) {                \
        const int width = (int)(8 * sizeof(KEY));                                                 \
        KEY prefix = 0;                                                                           \
        for (int b = width - 1; b >= width - bits; b--) {                                         \
            KEY candidate = prefix | ((KEY)1 << b);                                               \
            KEY count = 0; /* as wide as the keys: the counting pass vectorizes */                \
            for (int64_t i = 0; i < n; i++) count += keys[i] >= candidate;                        \
            if (count >= (KEY)k) prefix = candidate;                                              \
        }                                                                                         \
        return prefix;                                                                            \
    }                                                                                             \
                                                                                                  \
    /* Unsigned keys of vals[0..n) that order as the values: the bits with the sign flipped       \
     * (non-negative values) or all bits flipped (negative ones), NaN above +inf; no branches,    \
     * so the loop vectorises. */                                                                 \
    static void keys_of_##SUFFIX(const T *vals, KEY *keys, int64_t n) {                           \
        memcpy(keys, vals, sizeof(KEY) * n);                                                      \
        for (int64_t i = 0; i < n; i++) {                                                         \
            KEY bits = keys[i];                                                                   \
            KEY negative = (KEY)0 - (bits >> (8 * sizeof(KEY) - 1));                              \
            KEY key = bits ^ (negative | SIGN_##SUFFIX);                                          \
            keys[i] = (bits & ~SIGN_##SUFFIX) > INF_##SUFFIX ? ~(KEY)0 : key;                     \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* Keep the k largest of the n buffered entries (first columns among ties), in place, in one  \
     * branch-free pass in column order: all entries above the k-th, then the first ties. */      \
    static KEY cut_##SUFFIX(T *vals, int64_t *cols, KEY *keys, int64_t n, int64_t k) {            \
        keys_of_##SUFFIX(vals, keys, n);                                                          \
        KEY kth = kth_key_##SUFFIX(keys, n, k, (int)(8 * sizeof(KEY)));                           \
        KEY above = 0;                                                                            \
        for (int64_t i = 0; i < n; i++) above += keys[i] > kth;                                   \
        int64_t m = 0, ties = k - (int64_t)above;                                                 \
        for (int64_t i = 0; i < n; i++) {                                                         \
            int tie = keys[i] == kth && ties > 0;                                                 \
            ties -= tie;                                                                          \
            vals[m] = vals[i]; cols[m] = cols[i];                                                 \
            m += (keys[i] > kth) | tie;                                                           \
        }                                                                                         \
        return kth;                                                                               \
    }                                                                                             \
                                                                                                  \
    /* A running selection per row: up to CAP(k) + 16 buffered entries (values, columns), their   \
     * number, a threshold and a mode: FRESH (nothing seen), BOUND (entries >= threshold enter; the\
     * threshold is a lower bound of the row's k-th largest) or STRICT (entries above threshold enter;\
     * the buffer holds k entries >= it). */                                                      \
    typedef struct {                                                                              \
        T *vals;                                                                                  \
        int64_t *cols, *count;                                                                    \
        T *threshold;                                                                             \
        int32_t *mode;                                                                            \
        int64_t k;                                                                                \
    } state_##SUFFIX;                                                                             \
                                                                                                  \
    /* Feed the columns [offset, offset + width) of each row, x (R, width) with row stride `stride`.\
     * A fresh row takes as its bound the k-th largest (radix select on the top bits) of the maxima\
     * of G = min(2k, W) strided groups of columns (j mod G): k distinct entries, k group maxima, are\
     * >= it, so it bounds the row's k-th largest from below (about 1.5k entries pass it for scores\
     * without structure). Every entry is then written at the buffer's end, which advances only past\
     * those that pass (branch-free); a full buffer is cut to its k largest (from then on STRICT). */\
    typedef struct {                                                                              \
        const T *x;                                                                               \
        int64_t width, stride, offset;                                                            \
        state_##SUFFIX st;                                                                        \
    } push_args_##SUFFIX;                                                                         \
                                                                                                  \
    /* One row of a running selection (see state_##SUFFIX): feed the columns [offset, offset + width)\
     * of `row`, updating its buffer (buf, col), count, threshold and mode. maxima (2k) and keys  \
     * (CAP(k) + 16, at least 2k) are scratch. */                                                 \
    static void push_row_##SUFFIX(const T *row, int64_t width, int64_t offset, int64_t k, T *buf, \
                                  int64_t *col, int64_t *count, T *bound, int32_t *state, T *maxima,\
                                  KEY *keys) {                                                    \
        const int64_t cap = CAP(k), groups = 2 * k < width ? 2 * k : width;                       \
        int64_t n = *count;                                                                       \
        T threshold = *bound;                                                                     \
        int32_t mode = *state;                                                                    \
        if (mode == FRESH) {                                                                      \
            threshold = -INFINITY; /* fewer than k columns: every entry enters */                 \
            if (width >= k) {                                                                     \
                memcpy(maxima, row, sizeof(T) * groups);                                          \
                int64_t c = groups;                                                               \
                for (; c + groups <= width; c += groups)                                          \
                    for (int64_t g = 0; g < groups; g++) {                                        \
                        T value = row[c + g];                                                     \
                        maxima[g] = value > maxima[g] ? value : maxima[g];                        \
                    }                                                                             \
                for (int64_t g = 0; c + g < width; g++) {                                         \
                    T value = row[c + g];                                                         \
                    maxima[g] = value > maxima[g] ? value : maxima[g];                            \
                }                                                                                 \
                keys_of_##SUFFIX(maxima, keys, groups);                                           \
                threshold = value_##SUFFIX(kth_key_##SUFFIX(keys, groups, k, BOUND_BITS));        \
            }                                                                                     \
            mode = BOUND;                                                                         \
        }                                                                                         \
        for (int64_t j = 0; j < width; j += 16) {                                                 \
            int64_t end = j + 16 < width ? j + 16 : width;                                        \
            if (mode == STRICT)                                                                   \
                for (int64_t i = j; i < end; i++) {                                               \
                    T value = row[i];                                                             \
                    buf[n] = value; col[n] = offset + i; n += ABOVE(value, threshold);            \
                }                                                                                 \
            else                                                                                  \
                for (int64_t i = j; i < end; i++) {                                               \
                    T value = row[i];                                                             \
                    buf[n] = value; col[n] = offset + i; n += !(value < threshold);               \
                }                                                                                 \
            if (n >= cap) {                                                                       \
                threshold = value_##SUFFIX(cut_##SUFFIX(buf, col, keys, n, k));                   \
                n = k;                                                                            \
                mode = STRICT;                                                                    \
            }                                                                                     \
        }                                                                                         \
        *count = n;                                                                               \
        *bound = threshold;                                                                       \
        *state = mode;                                                                            \
    }                                                                                             \
                                                                                                  \
    /* The k largest of a row's n buffered entries into out_vals/out_cols (k each); a row that saw\
     * fewer than k entries is padded with -inf at column 0. */                                   \
    static void finish_row_##SUFFIX(T *buf, int64_t *col, int64_t n, int64_t k, KEY *keys,        \
                                    T *out_vals, int64_t *out_cols) {                             \
        if (n > k) cut_##SUFFIX(buf, col, keys, n, k);                                            \
        for (int64_t i = n; i < k; i++) { buf[i] = -INFINITY; col[i] = 0; }                       \
        memcpy(out_vals, buf, sizeof(T) * k);                                                     \
        memcpy(out_cols, col, sizeof(int64_t) * k);                                               \
    }                                                                                             \
                                                                                                  \
    static int push_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                             \
        push_args_##SUFFIX *a = (push_args_##SUFFIX *)p;                                          \
        const int64_t k = a->st.k, span = CAP(k) + 16;                                            \
        T *maxima = (T *)malloc(sizeof(T) * 2 * k);                                               \
        KEY *keys = (KEY *)malloc(sizeof(KEY) * (span > 2 * k ? span : 2 * k));                   \
        if (!maxima || !keys) {                                                                   \
            free(maxima);                                                                         \
            free(keys);                                                                           \
            return HOP_NO_MEMORY;                                                                 \
        }                                                                                         \
        for (int64_t r = lo; r < hi; r++)                                                         \
            push_row_##SUFFIX(a->x + r * a->stride, a->width, a->offset, k, a->st.vals + r * span,\
                              a->st.cols + r * span, a->st.count + r, a->st.threshold + r,        \
                              a->st.mode + r, maxima, keys);                                      \
        free(maxima);                                                                             \
        free(keys);                                                                               \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_topk_push_##SUFFIX(const T *x, int64_t rows, int64_t width, int64_t stride,           \
                                int64_t offset, T *vals, int64_t *cols, int64_t *count, T *threshold,\
                                int32_t *mode, int64_t k, int threads) {                          \
        push_args_##SUFFIX a = {x, width, stride, offset, {vals, cols, count, threshold, mode, k}};\
        return parallel_for(push_range_##SUFFIX, &a, rows, threads, PIECES);                      \
    }                                                                                             \
                                                                                                  \
    typedef struct {                                                                              \
        state_##SUFFIX st;                                                                        \
        T *out_vals;                                                                              \
        int64_t *out_cols;                                                                        \
    } finish_args_##SUFFIX;                                                                       \
                                                                                                  \
    static int finish_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                           \
        finish_args_##SUFFIX *a = (finish_args_##SUFFIX *)p;                                      \
        const int64_t k = a->st.k, span = CAP(k) + 16;                                            \
        KEY *keys = (KEY *)malloc(sizeof(KEY) * span);                                            \
        if (!keys) return HOP_NO_MEMORY;                                                          \
        for (int64_t r = lo; r < hi; r++)                                                         \
            finish_row_##SUFFIX(a->st.vals + r * span, a->st.cols + r * span, a->st.count[r], k,  \
                                keys, a->out_vals + r * k, a->out_cols + r * k);                  \
        free(keys);                                                                               \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_topk_finish_##SUFFIX(int64_t rows, T *vals, int64_t *cols, int64_t *count, int64_t k, \
                                  T *out_vals, int64_t *out_cols, int threads) {                  \
        finish_args_##SUFFIX a = {{vals, cols, count, NULL, NULL, k}, out_vals, out_cols};        \
        return parallel_for(finish_range_##SUFFIX, &a, rows, threads, PIECES);                    \
    }                                                                                             \
                                                                                                  \
    /* One chunk holding the whole rows: a push and a finish per row, on one buffer per thread (no\
     * state arrays to allocate). */                                                              \
    typedef struct {                                                                              \
        const T *x;                                                                               \
        int64_t width, stride, k;                                                                 \
        T *out_vals;                                                                              \
        int64_t *out_cols;                                                                        \
    } topk_args_##SUFFIX;                                                                         \
                                                                                                  \
    static int topk_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                             \
        topk_args_##SUFFIX *a = (topk_args_##SUFFIX *)p;                                          \
        const int64_t k = a->k, span = CAP(k) + 16;                                               \
        T *buf = (T *)malloc(sizeof(T) * (span + 2 * k));                                         \
        int64_t *col = (int64_t *)malloc(sizeof(int64_t) * span);                                 \
        KEY *keys = (KEY *)malloc(sizeof(KEY) * (span > 2 * k ? span : 2 * k));                   \
        if (!buf || !col || !keys) {                                                              \
            free(buf);                                                                            \
            free(col);                                                                            \
            free(keys);                                                                           \
            return HOP_NO_MEMORY;                                                                 \
        }                                                                                         \
        for (int64_t r = lo; r < hi; r++) {                                                       \
            int64_t n = 0;                                                                        \
            T threshold = 0;                                                                      \
            int32_t mode = FRESH;                                                                 \
            push_row_##SUFFIX(a->x + r * a->stride, a->width, 0, k, buf, col, &n, &threshold, &mode,\
                              buf + span, keys);                                                  \
            finish_row_##SUFFIX(buf, col, n, k, keys, a->out_vals + r * k, a->out_cols + r * k);  \
        }                                                                                         \
        free(buf);                                                                                \
        free(col);                                                                                \
        free(keys);                                                                               \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_topk_##SUFFIX(const T *x, int64_t rows, int64_t width, int64_t stride, int64_t k,     \
                           T *out_vals, int64_t *out_cols, int threads) {                         \
        topk_args_##SUFFIX a = {x, width, stride, k, out_vals, out_cols};                         \
        return parallel_for(topk_range_##SUFFIX, &a, rows, threads, PIECES);                      \
    }                                                                                             \
                                                                                                  \
    /* A key t with exactly k of keys[0..n) >= t, found by the radix select of kth_key but      \
     * stopping at the first prefix that splits the keys so (for distinct scores after about    \
     * log2(n) + a few bits); *exact says whether one was found. Otherwise t is the k-th largest \
     * key, shared by the keys that tie with it. */                                              \
    static KEY split_key_##SUFFIX(const KEY *keys, int64_t n, int64_t k, int *exact) {            \
        const int width = (int)(8 * sizeof(KEY));                                                 \
        KEY prefix = 0;                                                                           \
        for (int b = width - 1; b >= 0; b--) {                                                    \
            KEY candidate = prefix | ((KEY)1 << b);                                               \
            KEY count = 0;                                                                        \
            for (int64_t i = 0; i < n; i++) count += keys[i] >= candidate;                        \
            if (count >= (KEY)k) prefix = candidate;                                              \
            if (count == (KEY)k) {                                                                \
                *exact = 1;                                                                       \
                return candidate;                                                                 \
            }                                                                                     \
        }                                                                                         \
        *exact = 0;                                                                               \
        return prefix;                                                                            \
    }                                                                                             \
                                                                                                  \
    /* Rows of x (R, W, contiguous) with their count[r] largest entries kept (first columns among \
     * ties, NaN largest, as hop_topk). out (R, W) gets, by                                       \
     * `mode`: KEEP_VALUES scale * x where kept and -inf elsewhere; KEEP_BIAS 0 where kept and  \
     * finite or +inf, -inf elsewhere (the additive mask of the selection); KEEP_SOFTMAX the      \
     * Softmax_n weights of scale * x over the kept entries, exp(z_i - m) / (n exp(-m) +          \
     * sum exp(z_j - m)) with m = max(0 if n > 0, max z) (0 for a row with nothing finite), and 0 \
     * elsewhere. out may be x (in place): each entry is read before it is written. */           \
    typedef struct {                                                                              \
        const T *x;                                                                               \
        const int64_t *count;                                                                     \
        int64_t width;                                                                            \
        T scale, n;                                                                               \
        int mode;                                                                                 \
        T *out;                                                                                   \
    } keep_args_##SUFFIX;                                                                         \
                                                                                                  \
    /* out[i] = scale * x[i] (or 0 with `bias`) where kept, else -inf (see keep_row_##SUFFIX). */\
    static void kept_values_##SUFFIX(const T *x, const KEY *keys, int64_t width, int64_t k,       \
                                     T scale, int bias, T *out) {                                 \
        int exact = 1;                                                                            \
        KEY split = k < width ? split_key_##SUFFIX(keys, width, k, &exact) : 0;                   \
        if (exact) { /* no ties to break: branch-free passes that vectorise */                    \
            if (bias)                                                                             \
                for (int64_t i = 0; i < width; i++)                                               \
                    out[i] = keys[i] >= split && x[i] != -INFINITY ? 0 : -INFINITY;               \
            else                                                                                  \
                for (int64_t i = 0; i < width; i++)                                               \
                    out[i] = keys[i] >= split ? scale * x[i] : -INFINITY;                         \
            return;                                                                               \
        }                                                                                         \
        int64_t above = 0;                                                                        \
        for (int64_t i = 0; i < width; i++) above += keys[i] > split;                             \
        int64_t ties = k - above;                                                                 \
        for (int64_t i = 0; i < width; i++) {                                                     \
            int tie = keys[i] == split && ties > 0;                                               \
            ties -= tie;                                                                          \
            T kept = bias ? (x[i] != -INFINITY ? 0 : -INFINITY) : scale * x[i];                   \
            out[i] = (keys[i] > split) | tie ? kept : -INFINITY;                                  \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* The Softmax_n weights of a row of logits z (-inf where dropped), in place (see           \
     * keep_args_##SUFFIX); eight running sums, so the passes vectorise. */                       \
    static void softmax_n_##SUFFIX(T *z, int64_t width, T n) {                                    \
        T peak[8], sums[8];                                                                       \
        for (int u = 0; u < 8; u++) {                                                             \
            peak[u] = n > 0 ? 0 : -INFINITY;                                                      \
            sums[u] = 0;                                                                          \
        }                                                                                         \
        int64_t i = 0;                                                                            \
        for (; i + 8 <= width; i += 8)                                                            \
            for (int u = 0; u < 8; u++) peak[u] = z[i + u] > peak[u] ? z[i + u] : peak[u];        \
        T shift = peak[0];                                                                        \
        for (; i < width; i++) shift = z[i] > shift ? z[i] : shift;                               \
        for (int u = 1; u < 8; u++) shift = peak[u] > shift ? peak[u] : shift;                    \
        if (shift == -INFINITY) shift = 0; /* nothing finite: every weight is 0 */                \
        for (i = 0; i + 8 <= width; i += 8)                                                       \
            for (int u = 0; u < 8; u++) {                                                         \
                z[i + u] = exp_##SUFFIX(z[i + u] - shift);                                        \
                sums[u] += z[i + u];                                                              \
            }                                                                                     \
        T total = n > 0 ? n * exp_##SUFFIX(-shift) : (T)0;                                        \
        for (; i < width; i++) {                                                                  \
            z[i] = exp_##SUFFIX(z[i] - shift);                                                    \
            total += z[i];                                                                        \
        }                                                                                         \
        for (int u = 0; u < 8; u++) total += sums[u];                                             \
        T inverse = total > 0 ? 1 / total : (T)1;                                                 \
        for (i = 0; i < width; i++) z[i] *= inverse;                                              \
    }                                                                                             \
                                                                                                  \
    static void keep_row_##SUFFIX(const keep_args_##SUFFIX *a, const T *x, int64_t k, T *out,     \
                                  KEY *keys) {                                                    \
        const int64_t width = a->width;                                                           \
        if (k <= 0) {                                                                             \
            T dropped = a->mode == KEEP_SOFTMAX ? (T)0 : (T)-INFINITY;                            \
            for (int64_t i = 0; i < width; i++) out[i] = dropped;                                 \
            return;                                                                               \
        }                                                                                         \
        keys_of_##SUFFIX(x, keys, width);                                                         \
        kept_values_##SUFFIX(x, keys, width, k, a->scale, a->mode == KEEP_BIAS, out);             \
        if (a->mode == KEEP_SOFTMAX) softmax_n_##SUFFIX(out, width, a->n);                        \
    }                                                                                             \
                                                                                                  \
    static int keep_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                             \
        keep_args_##SUFFIX *a = (keep_args_##SUFFIX *)p;                                          \
        KEY *keys = (KEY *)malloc(sizeof(KEY) * (a->width > 0 ? a->width : 1));                   \
        if (!keys) return HOP_NO_MEMORY;                                                          \
        for (int64_t r = lo; r < hi; r++)                                                         \
            keep_row_##SUFFIX(a, a->x + r * a->width, a->count[r],                                \
                              a->out + r * a->width, keys);                                       \
        free(keys);                                                                               \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    /* Rows of x (R, W, contiguous) with a uniform random subset of count[r] of their first      \
     * population[r] columns kept (floyd_stream on the stream of row r's query, see stream_rows: \
     * the subsets depend neither on the threads nor on the blocks of queries); out as           \
     * hop_topk_keep's `mode`. taken (W bytes) marks the picks. */                                \
    typedef struct {                                                                              \
        keep_args_##SUFFIX keep;                                                                  \
        const int64_t *population;                                                                \
        uint64_t seed;                                                                            \
        stream_rows rows;                                                                         \
    } sample_args_##SUFFIX;                                                                       \
                                                                                                  \
    /* Row r of the keep: its picks marked in taken (width bytes), which it leaves zero. */       \
    static void sample_row_##SUFFIX(const sample_args_##SUFFIX *a, int64_t r, unsigned char *taken) {\
        const keep_args_##SUFFIX *keep = &a->keep;                                                \
        const int64_t width = keep->width;                                                        \
        const T *x = keep->x + r * width;                                                         \
        T *out = keep->out + r * width;                                                           \
        /* kept or -inf by bit masks (no branch on the random picks); out may be x */             \
        const int bias = keep->mode == KEEP_BIAS;                                                 \
        const T scale = keep->scale, dropped = -INFINITY;                                         \
        KEY dropped_bits;                                                                         \
        memcpy(&dropped_bits, &dropped, sizeof(KEY));                                             \
        for (int64_t j = 0; j < width; j++) {                                                     \
            T value = bias ? (x[j] != -INFINITY ? 0 : -INFINITY) : scale * x[j];                  \
            KEY bits, keep_bits = (KEY)0 - (KEY)taken[j];                                         \
            memcpy(&bits, &value, sizeof(KEY));                                                   \
            bits = (bits & keep_bits) | (dropped_bits & ~keep_bits);                              \
            memcpy(out + j, &bits, sizeof(KEY));                                                  \
            taken[j] = 0;                                                                         \
        }                                                                                         \
        if (keep->mode == KEEP_SOFTMAX) softmax_n_##SUFFIX(out, width, keep->n);                  \
    }                                                                                             \
                                                                                                  \
    /* The rows [lo, hi), FLOYD_LANES rows' draws at once (floyd_streams). */                     \
    static int sample_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                           \
        sample_args_##SUFFIX *a = (sample_args_##SUFFIX *)p;                                      \
        const int64_t width = a->keep.width;                                                      \
        unsigned char *taken = (unsigned char *)calloc(width > 0 ? width : 1, 1);                 \
        const int64_t size = sizeof(int64_t) * FLOYD_LANES * (width > 0 ? width : 1);              \
        int64_t *drawn = (int64_t *)malloc(size);                                                 \
        const int status = !taken || !drawn ? HOP_NO_MEMORY : 0;                                  \
        if (status) lo = hi; /* nothing to do but free */                                         \
        for (int64_t g = lo; g < hi; g += FLOYD_LANES) {                                          \
            const int lanes = (int)(hi - g < FLOYD_LANES ? hi - g : FLOYD_LANES);                 \
            int64_t counts[FLOYD_LANES], populations[FLOYD_LANES];                                \
            for (int l = 0; l < lanes; l++) {                                                     \
                const int64_t n = a->population[g + l] < width ? a->population[g + l] : width;    \
                populations[l] = n;                                                               \
                counts[l] = a->keep.count[g + l] < n ? a->keep.count[g + l] : n;                  \
            }                                                                                     \
            const int64_t step = floyd_streams(a->seed, &a->rows, g, lanes, counts, populations,  \
                                               taken, drawn, width);                              \
            for (int l = 0; l < lanes; l++) {                                                     \
                for (int64_t i = 0; i < counts[l]; i++)                                           \
                    taken[drawn[drawn_at(step, width, l, i)]] = 1;                                \
                sample_row_##SUFFIX(a, g + l, taken);                                             \
            }                                                                                     \
        }                                                                                         \
        free(taken);                                                                              \
        free(drawn);                                                                              \
        return status;                                                                            \
    }                                                                                             \
    int hop_sample_keep_##SUFFIX(const T *x, int64_t rows, int64_t width, const int64_t *count,   \
                                  const int64_t *population, uint64_t seed, int64_t queries,      \
                                  int64_t length, int64_t start, T scale, int mode, T n, T *out,  \
                                  int threads) {                                                  \
        sample_args_##SUFFIX a = {{x, count, width, scale, n, mode, out}, population, seed,       \
                                  {queries, length, start}};                                      \
        return parallel_for(sample_range_##SUFFIX, &a, rows, threads, PIECES);                    \
    }                                                                                             \
                                                                                                  \
    int hop_topk_keep_##SUFFIX(const T *x, int64_t rows, int64_t width, const int64_t *count,     \
                                T scale, int mode, T n, T *out, int threads) {                    \
        keep_args_##SUFFIX a = {x, count, width, scale, n, mode, out};                            \
        return parallel_for(keep_range_##SUFFIX, &a, rows, threads, PIECES);                      \
    }                                                                                             \
                                                                                                  \
    static inline T dot_##SUFFIX(const T *a, const T *b, int64_t n) {                             \
        T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                      \
        int64_t i = 0;                                                                            \
        for (; i + 8 <= n; i += 8)                                                                \
            for (int u = 0; u < 8; u++) acc[u] += a[i + u] * b[i + u];                            \
        T total = 0;                                                                              \
        for (; i < n; i++) total += a[i] * b[i];                                                  \
        for (int u = 0; u < 8; u++) total += acc[u];                                              \
        return total;                                                                             \
    }                                                                                             \
                                                                                                  \
    /* out[j] = scale * <a, table[cols[j]]> for j < count (rows of n): four rows per pass over a,\
     * with sixteen running sums each, so the sums of one pass are independent. */               \
    static void dots_##SUFFIX(const T *a, const T *table, const int64_t *cols, int64_t count,     \
                              int64_t n, T scale, T *out) {                                       \
        int64_t j = 0;                                                                            \
        for (; j + 4 <= count; j += 4) {                                                          \
            const T *b0 = table + cols[j] * n, *b1 = table + cols[j + 1] * n;                     \
            const T *b2 = table + cols[j + 2] * n, *b3 = table + cols[j + 3] * n;                 \
            T s0[16] = {0}, s1[16] = {0}, s2[16] = {0}, s3[16] = {0};                             \
            int64_t i = 0;                                                                        \
            for (; i + 16 <= n; i += 16)                                                          \
                for (int u = 0; u < 16; u++) {                                                    \
                    const T x = a[i + u];                                                         \
                    s0[u] += x * b0[i + u];                                                       \
                    s1[u] += x * b1[i + u];                                                       \
                    s2[u] += x * b2[i + u];                                                       \
                    s3[u] += x * b3[i + u];                                                       \
                }                                                                                 \
            T t0 = 0, t1 = 0, t2 = 0, t3 = 0;                                                     \
            for (; i < n; i++) {                                                                  \
                t0 += a[i] * b0[i];                                                               \
                t1 += a[i] * b1[i];                                                               \
                t2 += a[i] * b2[i];                                                               \
                t3 += a[i] * b3[i];                                                               \
            }                                                                                     \
            for (int u = 0; u < 16; u++) {                                                        \
                t0 += s0[u];                                                                      \
                t1 += s1[u];                                                                      \
                t2 += s2[u];                                                                      \
                t3 += s3[u];                                                                      \
            }                                                                                     \
            out[j] = scale * t0;                                                                  \
            out[j + 1] = scale * t1;                                                              \
            out[j + 2] = scale * t2;                                                              \
            out[j + 3] = scale * t3;                                                              \
        }                                                                                         \
        for (; j < count; j++) out[j] = scale * dot_##SUFFIX(a, table + cols[j] * n, n);          \
    }                                                                                             \
                                                                                                  \
    typedef struct {                                                                              \
        const T *a, *table;                                                                       \
        const int64_t *idx;                                                                       \
        int64_t slots, dim;                                                                       \
        T *out;                                                                                   \
    } gather_dot_args_##SUFFIX;                                                                   \
                                                                                                  \
    static int gather_dot_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                       \
        gather_dot_args_##SUFFIX *g = (gather_dot_args_##SUFFIX *)p;                              \
        for (int64_t r = lo; r < hi; r++) {                                                       \
            const T *ar = g->a + r * g->dim;                                                      \
            const int64_t *ir = g->idx + r * g->slots;                                            \
            T *orow = g->out + r * g->slots;                                                      \
            for (int64_t j = 0; j < g->slots; j++)                                                \
                orow[j] = dot_##SUFFIX(ar, g->table + ir[j] * g->dim, g->dim);                    \
        }                                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_gather_dot_##SUFFIX(const T *a, const T *table, const int64_t *idx, int64_t rows,     \
                                 int64_t slots, int64_t dim, T *out, int threads) {               \
        gather_dot_args_##SUFFIX g = {a, table, idx, slots, dim, out};                            \
        return parallel_for(gather_dot_range_##SUFFIX, &g, rows, threads, PIECES);                \
    }                                                                                             \
                                                                                                  \
    typedef struct {                                                                              \
        const T *w, *src;                                                                         \
        const int64_t *idx;                                                                       \
        int64_t rows, slots, dim, targets;                                                        \
        T *dst;                                                                                   \
    } scatter_args_##SUFFIX;                                                                      \
                                                                                                  \
    /* Each thread owns the destination rows [lo, hi) and scans every (r, j): no races. */        \
    static int scatter_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                          \
        scatter_args_##SUFFIX *s = (scatter_args_##SUFFIX *)p;                                    \
        const int64_t dim = s->dim;                                                               \
        for (int64_t r = 0; r < s->rows; r++) {                                                   \
            const int64_t *ir = s->idx + r * s->slots;                                            \
            const T *wr = s->w + r * s->slots;                                                    \
            const T *sr = s->src + r * dim;                                                       \
            for (int64_t j = 0; j < s->slots; j++) {                                              \
                int64_t target = ir[j];                                                           \
                T weight = wr[j];                                                                 \
                if (target < lo || target >= hi || weight == 0) continue;                         \
                T *d = s->dst + target * dim;                                                     \
                for (int64_t e = 0; e < dim; e++) d[e] += weight * sr[e];                         \
            }                                                                                     \
        }                                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_scatter_outer_##SUFFIX(const T *w, const int64_t *idx, const T *src, int64_t rows,    \
                                    int64_t slots, int64_t dim, T *dst, int64_t targets,          \
                                    int threads) {                                                \
        scatter_args_##SUFFIX s = {w, src, idx, rows, slots, dim, targets, dst};                  \
        return parallel_for(scatter_range_##SUFFIX, &s, targets, threads, SCAN_ALL);              \
    }                                                                                             \
    /* Fused attention without gradients, one parallel region per call: for each query, the     \
     * Softmax_n weights over its kept keys and their weighted sum of values. q (BH, L, E),       \
     * k (BH, S, E), v (BH, S, Ev), out (BH, L, Ev), contiguous; query i of a sequence may see    \
     * its first population[i] keys and keeps count[i] of them (count <= population <= S; both   \
     * shared by the batch-heads or one row each, see COUNT_OF), those a `bias` allows.           \
     * Each thread claims work in turn (see parallel_for), so a busy CPU delays only the pieces   \
     * of the thread that waits for its core. */                                                 \
    typedef void (*gemm_##SUFFIX)(const char *, const char *, const int64_t *, const int64_t *,  \
                                  const int64_t *, const T *, const T *, const int64_t *,        \
                                  const T *, const int64_t *, const T *, T *, const int64_t *);  \
    typedef struct {                                                                              \
        gemm_##SUFFIX gemm;                                                                       \
        const T *q, *k, *v;                                                                       \
        const int64_t *count, *population;                                                        \
        int64_t count_stride, population_stride; /* 0: (L) for every batch-head; L: (BH, L) */   \
        const T *bias; /* an additive mask per key (BH, S), -inf where excluded; or NULL */      \
        const int64_t *keys; /* sample: each batch-head's allowed keys in order (BH, S); or NULL */\
        int64_t length, size, dim, vdim, upper, rows, chunk;                                      \
        T scale, n;                                                                               \
        uint64_t seed;                                                                            \
        T *out;                                                                                   \
        int64_t *idx_out; /* with w_out: each query's kept keys and weights (BH·L, upper), or NULL */\
        T *w_out;                                                                                 \
    } attend_args_##SUFFIX;                                                                       \
                                                                                                  \
    /* out[0..vdim) = sum_j w[j] v[cols[j]] over the count kept keys (out must not alias v):  \
     * per stripe of four vectors of out, four accumulators held in registers over all keys     \
     * (stores once; twice the speed of passes over out, at the FMA units' rate on AVX-512), then \
     * single vectors and the scalar rest. */                                                    \
    typedef T vec_##SUFFIX __attribute__((vector_size(VECTOR_BYTES)));                           \
    /* acc += weight * row[0..lanes) (an unaligned load; no vector passed by value, whose ABI \
     * depends on the flags). */                                                                  \
    static inline void add_scaled_##SUFFIX(vec_##SUFFIX *acc, T weight, const T *row) {          \
        vec_##SUFFIX x;                                                                           \
        memcpy(&x, row, sizeof x);                                                                \
        *acc += weight * x;                                                                       \
    }                                                                                             \
    static void weigh_row_##SUFFIX(const T *w, const int64_t *cols, int64_t count, const T *v,   \
                                   int64_t vdim, T *out) {                                        \
        const int64_t lanes = VECTOR_BYTES / sizeof(T);                                           \
        int64_t e0 = 0;                                                                           \
        for (; e0 + 4 * lanes <= vdim; e0 += 4 * lanes) {                                         \
            vec_##SUFFIX a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                  \
            for (int64_t j = 0; j < count; j++) {                                                 \
                const T *row = v + cols[j] * vdim + e0, weight = w[j];                            \
                add_scaled_##SUFFIX(&a0, weight, row);                                            \
                add_scaled_##SUFFIX(&a1, weight, row + lanes);                                    \
                add_scaled_##SUFFIX(&a2, weight, row + 2 * lanes);                                \
                add_scaled_##SUFFIX(&a3, weight, row + 3 * lanes);                                \
            }                                                                                     \
            memcpy(out + e0, &a0, sizeof a0);                                                     \
            memcpy(out + e0 + lanes, &a1, sizeof a1);                                             \
            memcpy(out + e0 + 2 * lanes, &a2, sizeof a2);                                         \
            memcpy(out + e0 + 3 * lanes, &a3, sizeof a3);                                         \
        }                                                                                         \
        for (; e0 + lanes <= vdim; e0 += lanes) {                                                 \
            vec_##SUFFIX a0 = {0};                                                                \
            for (int64_t j = 0; j < count; j++)                                                   \
                add_scaled_##SUFFIX(&a0, w[j], v + cols[j] * vdim + e0);                          \
            memcpy(out + e0, &a0, sizeof a0);                                                     \
        }                                                                                         \
        for (int64_t e = e0; e < vdim; e++) {                                                     \
            T total = 0;                                                                          \
            for (int64_t j = 0; j < count; j++) total += w[j] * v[cols[j] * vdim + e];            \
            out[e] = total;                                                                       \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* row[j] += bias[j] for j < width, -inf where the bias is (whatever the score). */         \
    static void add_bias_##SUFFIX(T *row, const T *bias, int64_t width) {                        \
        for (int64_t j = 0; j < width; j++)                                                       \
            row[j] = bias[j] == -INFINITY ? -INFINITY : row[j] + bias[j];                         \
    }                                                                                             \
                                                                                                  \
    /* The end of query r (of the BH·L): the Softmax_n weights of its kept scores vals[0..kept)\
     * (in place), their weighted sum of the values vb (its batch-head's) into out and, if asked,\
     * its kept keys and weights into idx_out and w_out (upper slots, the rest 0). */             \
    static void attend_query_##SUFFIX(const attend_args_##SUFFIX *a, int64_t r, T *vals,         \
                                      const int64_t *cols, int64_t kept, const T *vb) {           \
        softmax_n_##SUFFIX(vals, kept, a->n);                                                     \
        weigh_row_##SUFFIX(vals, cols, kept, vb, a->vdim, a->out + r * a->vdim);                  \
        if (!a->w_out) return;                                                                    \
        T *w = a->w_out + r * a->upper;                                                           \
        int64_t *keys = a->idx_out + r * a->upper;                                                \
        for (int64_t j = 0; j < a->upper; j++) {                                                  \
            w[j] = j < kept ? vals[j] : 0;                                                        \
            keys[j] = j < kept ? cols[j] : 0;                                                     \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* Compaction of a row by its keys: the entries of row[0..width) whose key is >= split, with  \
     * their columns, to vals and cols in column order; returns their number m. vals and cols     \
     * need m + COMPACT_SLACK slots. The compress instructions where there are (twice the speed   \
     * of the branch-free loop at 128 to 512 columns), that loop for the rest. */                 \
    static int64_t compact_##SUFFIX(const T *row, const KEY *keys, int64_t width, KEY split,      \
                                    T *vals, int64_t *cols) {                                     \
        int64_t m = 0;                                                                            \
        for (int64_t i = compact_vectors_##SUFFIX(row, keys, width, split, vals, cols, &m);       \
             i < width; i++) {                                                                    \
            vals[m] = row[i];                                                                     \
            cols[m] = i;                                                                          \
            m += keys[i] >= split;                                                                \
        }                                                                                         \
        return m;                                                                                 \
    }                                                                                             \
                                                                                                  \
    /* The count largest of row[0..width) (count <= width; first columns among ties, NaN          \
     * largest) and their columns, in column order: the radix select of hop_topk_keep, then one   \
     * compacting pass (compact_##SUFFIX where no ties are cut). keys: width scratch; vals and    \
     * cols: count + COMPACT_SLACK each. */                                                       \
    static void select_row_##SUFFIX(const T *row, int64_t width, int64_t count, KEY *keys,       \
                                    T *vals, int64_t *cols) {                                     \
        keys_of_##SUFFIX(row, keys, width);                                                       \
        int exact = 1;                                                                            \
        KEY split = count < width ? split_key_##SUFFIX(keys, width, count, &exact) : 0;           \
        if (exact) {                                                                              \
            compact_##SUFFIX(row, keys, width, split, vals, cols);                                \
            return;                                                                               \
        }                                                                                         \
        int64_t m = 0, above = 0;                                                                 \
        for (int64_t i = 0; i < width; i++) above += keys[i] > split;                             \
        int64_t ties = count - above;                                                             \
        for (int64_t i = 0; i < width; i++) {                                                     \
            int tie = keys[i] == split && ties > 0;                                               \
            ties -= tie;                                                                          \
            vals[m] = row[i];                                                                     \
            cols[m] = i;                                                                          \
            m += (keys[i] > split) | tie;                                                         \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* Top-K: work item = (batch-head, block of `rows` queries). Rows whose visible keys fit one \
     * chunk of at most SELECT_WIDTH: one product of the block's queries with those keys, scale *\
     * q k^T, by the BLAS `gemm` on this thread (column-major: the keys transposed times the     \
     * queries gives the scores row-major), then each row's count[i] largest by one radix select \
     * (select_row). Wider rows: per key chunk one such product, pushed into each query's running\
     * selection (push_row), then its `upper` (the largest count) largest (finish_row), cut to   \
     * count[i] where that is fewer. The kept scores get their Softmax_n weights and weigh the   \
     * values. */                                                                                 \
    static int topk_attend_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                      \
        const attend_args_##SUFFIX *a = (const attend_args_##SUFFIX *)p;                          \
        const int64_t k = a->upper, span = CAP(k) + 16, R = a->rows, C = a->chunk;                \
        const int64_t L = a->length, S = a->size, E = a->dim, Ev = a->vdim;                       \
        const int64_t blocks = (L + R - 1) / R;                                                   \
        T *scores = (T *)malloc(sizeof(T) * R * C);                                               \
        T *vals = (T *)malloc(sizeof(T) * (R * span + 3 * k + COMPACT_SLACK));                    \
        int64_t *cols = (int64_t *)malloc(sizeof(int64_t) * (R * span + k + COMPACT_SLACK));      \
        int64_t *counts = (int64_t *)malloc(sizeof(int64_t) * R);                                 \
        T *thresholds = (T *)malloc(sizeof(T) * R);                                               \
        int32_t *modes = (int32_t *)malloc(sizeof(int32_t) * R);                                  \
        const int64_t scratch = span > 2 * k ? span : 2 * k;                                      \
        KEY *keys = (KEY *)malloc(sizeof(KEY) * (scratch > C ? scratch : C));                     \
        const int missing = !scores || !vals || !cols || !counts || !thresholds || !modes || !keys;\
        const int status = missing ? HOP_NO_MEMORY : 0;                                           \
        if (status) lo = hi; /* nothing to do but free */                                        \
        T *maxima = vals + R * span, *best = maxima + 2 * k;                                      \
        int64_t *best_cols = cols + R * span;                                                     \
        const T zero = 0;                                                                         \
        for (int64_t item = lo; item < hi; item++) {                                              \
            const int64_t b = item / blocks, r0 = (item % blocks) * R;                            \
            const int64_t m = R < L - r0 ? R : L - r0;                                            \
            const T *qb = a->q + (b * L + r0) * E, *kb = a->k + b * S * E, *vb = a->v + b * S * Ev;\
            int64_t end = 0;                                                                      \
            const T *bias = a->bias ? a->bias + b * S : NULL;                                     \
            for (int64_t i = 0; i < m; i++) {                                                     \
                counts[i] = 0;                                                                    \
                modes[i] = FRESH;                                                                 \
                end = POPULATION_OF(a, b, r0 + i) > end ? POPULATION_OF(a, b, r0 + i) : end;      \
            }                                                                                     \
            if (end <= C && end <= SELECT_WIDTH) { /* narrow rows: selected straight */            \
                a->gemm("T", "N", &end, &m, &E, &a->scale, kb, &E, qb, &E, &zero, scores, &end);  \
                for (int64_t i = 0; i < m; i++) {                                                 \
                    const int64_t kept = COUNT_OF(a, b, r0 + i);                                  \
                    const int64_t width = POPULATION_OF(a, b, r0 + i);                            \
                    if (bias) add_bias_##SUFFIX(scores + i * end, bias, width);                   \
                    select_row_##SUFFIX(scores + i * end, width, kept, keys, best, best_cols);    \
                    attend_query_##SUFFIX(a, b * L + r0 + i, best, best_cols, kept, vb);          \
                }                                                                                 \
                continue;                                                                         \
            }                                                                                     \
            for (int64_t c0 = 0; c0 < end; c0 += C) {                                             \
                int64_t w = C < end - c0 ? C : end - c0;                                          \
                a->gemm("T", "N", &w, &m, &E, &a->scale, kb + c0 * E, &E, qb, &E, &zero, scores, \
                        &w);                                                                      \
                for (int64_t i = 0; i < m; i++) {                                                 \
                    int64_t width = POPULATION_OF(a, b, r0 + i) - c0;                             \
                    width = width < w ? width : w;                                                \
                    if (width > 0 && bias) add_bias_##SUFFIX(scores + i * w, bias + c0, width);   \
                    if (width > 0)                                                                \
                        push_row_##SUFFIX(scores + i * w, width, c0, k, vals + i * span,          \
                                          cols + i * span, counts + i, thresholds + i, modes + i, \
                                          maxima, keys);                                          \
                }                                                                                 \
            }                                                                                     \
            for (int64_t i = 0; i < m; i++) {                                                     \
                const int64_t kept = COUNT_OF(a, b, r0 + i);                                      \
                const int64_t found = counts[i] < k ? counts[i] : k;                              \
                finish_row_##SUFFIX(vals + i * span, cols + i * span, counts[i], k, keys, best,   \
                                    best_cols);                                                   \
                if (kept > 0 && kept < found) /* a row keeping fewer than the most: its largest */ \
                    cut_##SUFFIX(best, best_cols, keys, found, kept);                             \
                attend_query_##SUFFIX(a, b * L + r0 + i, best, best_cols, kept, vb);              \
            }                                                                                     \
        }                                                                                         \
        free(scores);                                                                             \
        free(vals);                                                                               \
        free(cols);                                                                               \
        free(counts);                                                                             \
        free(thresholds);                                                                         \
        free(modes);                                                                              \
        free(keys);                                                                               \
        return status;                                                                            \
    }                                                                                             \
                                                                                                  \
    int hop_topk_attend_##SUFFIX(gemm_##SUFFIX gemm, local_threads_fn local, const T *q,          \
                                  const T *k, const T *v,                                         \
                                  int64_t heads, int64_t length, int64_t size, int64_t dim,       \
                                  int64_t vdim, const int64_t *count, const int64_t *population,  \
                                  int64_t count_stride, int64_t population_stride, const T *bias, \
                                  T scale, T n, int64_t rows, int64_t chunk, T *out,              \
                                  int64_t *idx_out, T *w_out, int threads) {                      \
        int64_t upper = largest_count(count, population, heads, length, count_stride,             \
                                      population_stride, size);                                   \
        if (upper < 0) return HOP_BAD_COUNTS;                                                     \
        if (upper == 0) { /* no query keeps a key (and no slots to save) */                      \
            memset(out, 0, sizeof(T) * heads * length * vdim);                                    \
            return 0;                                                                             \
        }                                                                                         \
        attend_args_##SUFFIX a = {.gemm = gemm, .q = q, .k = k, .v = v, .count = count,           \
                                  .population = population, .count_stride = count_stride,         \
                                  .population_stride = population_stride, .bias = bias,           \
                                  .length = length, .size = size, .dim = dim, .vdim = vdim,       \
                                  .upper = upper, .rows = rows, .chunk = chunk, .scale = scale,   \
                                  .n = n, .out = out, .idx_out = idx_out, .w_out = w_out};        \
        return parallel_for_local(topk_attend_range_##SUFFIX, &a,                                 \
                                  heads * ((length + rows - 1) / rows), threads, PIECES, local);  \
    }                                                                                             \
                                                                                                  \
    /* Random masks: work item = (batch-head, block of `rows` queries). Each query draws its     \
     * count[i] picks of its first population[i] keys on its stream (floyd_stream keyed by seed  \
     * and its place r in the (BH·L) queries: the subsets of hop_sample_indices) or, with `keys`,\
     * of the first population[i] of its batch-head's allowed keys, and takes their              \
     * scores scale * <q, k_j> from the block's product with the keys by the BLAS `gemm` (for a  \
     * large share of kept keys), else one dot product each; then the Softmax_n weights and the  \
     * weighted sum. */                                                                           \
    static int sample_attend_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                    \
        const attend_args_##SUFFIX *a = (const attend_args_##SUFFIX *)p;                          \
        const int64_t L = a->length, S = a->size, E = a->dim, Ev = a->vdim, k = a->upper;         \
        const int64_t R = a->rows, blocks = (L + R - 1) / R;                                      \
        unsigned char *taken = (unsigned char *)calloc(S > 0 ? S : 1, 1);                         \
        int64_t *drawn = (int64_t *)malloc(sizeof(int64_t) * FLOYD_LANES * (k > 0 ? k : 1));      \
        int64_t *copied = (int64_t *)malloc(sizeof(int64_t) * (k > 0 ? k : 1));                   \
        T *w = (T *)malloc(sizeof(T) * (k > 0 ? k : 1));                                          \
        T *scores = a->gemm ? (T *)malloc(sizeof(T) * (R * S > 0 ? R * S : 1)) : NULL;            \
        const int status =                                                                        \
            !taken || !drawn || !copied || !w || (a->gemm && !scores) ? HOP_NO_MEMORY : 0;        \
        if (status) lo = hi; /* nothing to do but free */                                         \
        const stream_rows whole = {L, L, 0};                                                      \
        const T zero = 0;                                                                         \
        for (int64_t item = lo; item < hi; item++) {                                              \
            const int64_t b = item / blocks, r0 = (item % blocks) * R;                            \
            const int64_t m = R < L - r0 ? R : L - r0;                                            \
            const T *kb = a->k + b * S * E, *bias = a->bias ? a->bias + b * S : NULL;             \
            const int64_t *allowed = a->keys ? a->keys + b * S : NULL;                            \
            int64_t end = 0; /* the keys the block's scores reach */                              \
            for (int64_t i = 0; i < m; i++) {                                                     \
                const int64_t n = POPULATION_OF(a, b, r0 + i);                                    \
                const int64_t reach = allowed ? (n ? allowed[n - 1] + 1 : 0) : n;                 \
                end = reach > end ? reach : end;                                                  \
            }                                                                                     \
            if (a->gemm && end > 0)                                                               \
                a->gemm("T", "N", &end, &m, &E, &a->scale, kb, &E, a->q + (b * L + r0) * E, &E,   \
                        &zero, scores, &end);                                                     \
            /* the draws of FLOYD_LANES queries at once, then each query's weighted sum */        \
            for (int64_t g = 0; g < m; g += FLOYD_LANES) {                                        \
                const int lanes = (int)(m - g < FLOYD_LANES ? m - g : FLOYD_LANES);               \
                int64_t counts[FLOYD_LANES], populations[FLOYD_LANES];                            \
                for (int l = 0; l < lanes; l++) {                                                 \
                    counts[l] = COUNT_OF(a, b, r0 + g + l);                                       \
                    populations[l] = POPULATION_OF(a, b, r0 + g + l);                             \
                }                                                                                 \
                const int64_t step = floyd_streams(a->seed, &whole, b * L + r0 + g, lanes,        \
                                                   counts, populations, taken, drawn, k);         \
                for (int l = 0; l < lanes; l++) {                                                 \
                    const int64_t i = g + l, r = b * L + r0 + i, count = counts[l];               \
                    const T *qr = a->q + r * E;                                                   \
                    const int64_t *picks = lane_picks(drawn, step, k, l, count, allowed, copied); \
                    if (a->gemm)                                                                  \
                        for (int64_t j = 0; j < count; j++) w[j] = scores[i * end + picks[j]];    \
                    else                                                                          \
                        dots_##SUFFIX(qr, kb, picks, count, E, a->scale, w);                      \
                    if (bias)                                                                     \
                        for (int64_t j = 0; j < count; j++) w[j] += bias[picks[j]];               \
                    attend_query_##SUFFIX(a, r, w, picks, count, a->v + b * S * Ev);              \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        free(taken);                                                                              \
        free(drawn);                                                                              \
        free(copied);                                                                             \
        free(w);                                                                                  \
        free(scores);                                                                             \
        return status;                                                                            \
    }                                                                                             \
                                                                                                  \
    int hop_sample_attend_##SUFFIX(gemm_##SUFFIX gemm, local_threads_fn local, const T *q,        \
                                    const T *k, const T *v,                                       \
                                    int64_t heads, int64_t length, int64_t size, int64_t dim,     \
                                    int64_t vdim, const int64_t *count, const int64_t *population,\
                                    int64_t count_stride, int64_t population_stride,              \
                                    const T *bias, const int64_t *keys,                           \
                                    uint64_t seed, T scale, T n, int64_t rows, T *out,            \
                                    int64_t *idx_out, T *w_out, int threads) {                    \
        int64_t upper = largest_count(count, population, heads, length, count_stride,             \
                                      population_stride, size);                                   \
        if (upper < 0) return HOP_BAD_COUNTS;                                                     \
        attend_args_##SUFFIX a = {.gemm = gemm, .q = q, .k = k, .v = v, .count = count,           \
                                  .population = population, .count_stride = count_stride,         \
                                  .population_stride = population_stride, .bias = bias,           \
                                  .keys = keys, .length = length, .size = size, .dim = dim,       \
                                  .vdim = vdim, .upper = upper, .rows = rows, .scale = scale,     \
                                  .n = n, .seed = seed, .out = out, .idx_out = idx_out,           \
                                  .w_out = w_out};                                                \
        return parallel_for_local(sample_attend_range_##SUFFIX, &a,                               \
                                  heads * ((length + rows - 1) / rows), threads, PIECES,          \
                                  gemm ? local : NULL);                                           \
    }                                                                                             \
    /* dst[0..n) += alpha * src[0..n). */                                                       \
    static inline void axpy_##SUFFIX(T *dst, T alpha, const T *src, int64_t n) {                  \
        for (int64_t e = 0; e < n; e++) dst[e] += alpha * src[e];                                 \
    }                                                                                             \
                                                                                                  \
    /* The gradients of the fused attention kernels' outputs, given each query's kept keys idx    \
     * and Softmax_n weights w (BH·L, slots; the first count[i] of query i hold its keys) and the\
     * output gradient g (BH·L, Ev): per kept key dw_j = <g, v_j>, ds_j = scale w_j (dw_j -      \
     * sum_l w_l dw_l); dq = sum_j ds_j k_j, dk_j += ds_j q and dv_j += w_j g. Work item = one     \
     * batch-head (its key rows gather from all its queries: no two threads write one row). With \
     * a `gemm` (a large share of kept keys) blocks of `rows` queries run as dense products:     \
     * dW = G V^T, dq = dS K, dk += dS^T Q, dv += W^T G with W and dS zero off the support;       \
     * without, per kept key dot products and row updates. */                                    \
    typedef struct {                                                                              \
        gemm_##SUFFIX gemm;                                                                       \
        const T *q, *k, *v, *w, *g;                                                               \
        const int64_t *idx, *count;                                                               \
        int64_t count_stride; /* as in attend_args */                                             \
        int64_t length, size, dim, vdim, slots, rows;                                             \
        T scale;                                                                                  \
        T *dq, *dk, *dv;                                                                          \
    } backward_args_##SUFFIX;                                                                     \
                                                                                                  \
    /* One query r's ds (in place of its dw: ds_j = scale w_j (dw_j - sum_l w_l dw_l)). */       \
    static void score_gradients_##SUFFIX(const T *w, T *ds, int64_t kept, T scale) {             \
        T inner = 0;                                                                              \
        for (int64_t j = 0; j < kept; j++) inner += w[j] * ds[j];                                 \
        for (int64_t j = 0; j < kept; j++) ds[j] = scale * w[j] * (ds[j] - inner);                \
    }                                                                                             \
                                                                                                  \
    /* Per kept key: dots with the values, ds, then the key rows' updates and dq. ds: slots. */ \
    static void sparse_backward_##SUFFIX(const backward_args_##SUFFIX *a, int64_t b, T *ds) {     \
        const int64_t L = a->length, S = a->size, E = a->dim, Ev = a->vdim, K = a->slots;         \
        const T *kb = a->k + b * S * E, *vb = a->v + b * S * Ev;                                  \
        T *dk = a->dk + b * S * E, *dv = a->dv + b * S * Ev;                                      \
        for (int64_t i = 0; i < L; i++) {                                                         \
            const int64_t r = b * L + i, kept = COUNT_OF(a, b, i), *cols = a->idx + r * K;        \
            const T *w = a->w + r * K, *g = a->g + r * Ev, *qr = a->q + r * E;                    \
            dots_##SUFFIX(g, vb, cols, kept, Ev, 1, ds);                                          \
            score_gradients_##SUFFIX(w, ds, kept, a->scale);                                      \
            for (int64_t j = 0; j < kept; j++) {                                                  \
                axpy_##SUFFIX(dk + cols[j] * E, ds[j], qr, E);                                    \
                axpy_##SUFFIX(dv + cols[j] * Ev, w[j], g, Ev);                                    \
            }                                                                                     \
            weigh_row_##SUFFIX(ds, cols, kept, kb, E, a->dq + r * E);                             \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    /* The dense blocks (see backward_args); dw, dense_w and dense_ds: rows * S scratch, the last \
     * two zero on entry and on return. */                                                       \
    static void dense_backward_##SUFFIX(const backward_args_##SUFFIX *a, int64_t b, T *ds, T *dw, \
                                        T *dense_w, T *dense_ds) {                                \
        const int64_t L = a->length, S = a->size, E = a->dim, Ev = a->vdim, K = a->slots;         \
        const T *kb = a->k + b * S * E, *vb = a->v + b * S * Ev, one = 1, zero = 0;               \
        T *dk = a->dk + b * S * E, *dv = a->dv + b * S * Ev;                                      \
        for (int64_t r0 = 0; r0 < L; r0 += a->rows) {                                             \
            const int64_t m = a->rows < L - r0 ? a->rows : L - r0, first = b * L + r0;            \
            const T *g = a->g + first * Ev, *qb = a->q + first * E;                               \
            a->gemm("T", "N", &S, &m, &Ev, &one, vb, &Ev, g, &Ev, &zero, dw, &S); /* G V^T */     \
            for (int64_t i = 0; i < m; i++) {                                                     \
                const int64_t kept = COUNT_OF(a, b, r0 + i), *cols = a->idx + (first + i) * K;    \
                const T *w = a->w + (first + i) * K;                                              \
                for (int64_t j = 0; j < kept; j++) ds[j] = dw[i * S + cols[j]];                   \
                score_gradients_##SUFFIX(w, ds, kept, a->scale);                                  \
                for (int64_t j = 0; j < kept; j++) {                                              \
                    dense_ds[i * S + cols[j]] = ds[j];                                            \
                    dense_w[i * S + cols[j]] = w[j];                                              \
                }                                                                                 \
            }                                                                                     \
            a->gemm("N", "N", &E, &m, &S, &one, kb, &E, dense_ds, &S, &zero, a->dq + first * E,  \
                    &E); /* dq = dS K */                                                          \
            a->gemm("N", "T", &E, &S, &m, &one, qb, &E, dense_ds, &S, &one, dk, &E);            \
            a->gemm("N", "T", &Ev, &S, &m, &one, g, &Ev, dense_w, &S, &one, dv, &Ev);           \
            for (int64_t i = 0; i < m; i++) { /* back to zeros */                                 \
                const int64_t kept = COUNT_OF(a, b, r0 + i), *cols = a->idx + (first + i) * K;    \
                for (int64_t j = 0; j < kept; j++) dense_ds[i * S + cols[j]] = 0;                 \
                for (int64_t j = 0; j < kept; j++) dense_w[i * S + cols[j]] = 0;                  \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
                                                                                                  \
    static int attend_backward_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                  \
        const backward_args_##SUFFIX *a = (const backward_args_##SUFFIX *)p;                      \
        const int64_t S = a->size, K = a->slots, block = a->gemm ? a->rows * S : 0;               \
        T *values = (T *)malloc(sizeof(T) * (K + block + 1)); /* ds, then dw */                   \
        T *dense = block ? (T *)calloc(2 * block, sizeof(T)) : NULL;                              \
        int status = !values || (block && !dense) ? HOP_NO_MEMORY : 0;                            \
        for (int64_t b = status ? hi : lo; b < hi; b++) {                                         \
            const int64_t *idx = a->idx + b * a->length * K;                                      \
            int64_t outside = 0; /* the saved keys are checked here: one pass, no branch */      \
            for (int64_t e = 0; e < a->length * K; e++) outside |= (idx[e] < 0) | (idx[e] >= S);  \
            if (outside) {                                                                        \
                status = HOP_BAD_INDEX;                                                           \
                break;                                                                            \
            }                                                                                     \
            memset(a->dk + b * S * a->dim, 0, sizeof(T) * S * a->dim);                            \
            memset(a->dv + b * S * a->vdim, 0, sizeof(T) * S * a->vdim);                          \
            if (block)                                                                            \
                dense_backward_##SUFFIX(a, b, values, values + K, dense, dense + block);          \
            else                                                                                  \
                sparse_backward_##SUFFIX(a, b, values);                                           \
        }                                                                                         \
        free(values);                                                                             \
        free(dense);                                                                              \
        return status;                                                                            \
    }                                                                                             \
                                                                                                  \
    int hop_attend_backward_##SUFFIX(gemm_##SUFFIX gemm, local_threads_fn local, const T *q,      \
                                      const T *k, const T *v,                                     \
                                      const int64_t *idx, const T *w, const int64_t *count,       \
                                      int64_t count_stride, const T *g, int64_t heads,            \
                                      int64_t length, int64_t size, int64_t dim, int64_t vdim,    \
                                      int64_t slots, int64_t rows, T scale, T *dq, T *dk, T *dv,  \
                                      int threads) {                                              \
        for (int64_t i = 0; i < (count_stride ? heads : 1) * length; i++)                         \
            if (count_outside(count[i], slots)) return HOP_BAD_COUNTS;                            \
        backward_args_##SUFFIX a = {gemm, q, k, v, w, g, idx, count, count_stride, length, size,  \
                                    dim, vdim, slots, rows, scale, dq, dk, dv};                   \
        return parallel_for_local(attend_backward_range_##SUFFIX, &a, heads, threads, PIECES,     \
                                  gemm ? local : NULL);                                           \
    }                                                                                             \
                                                                                                  \
    /* RMS normalisation over the last dimension, y = x / sqrt(mean(x^2) + eps) * w, for rows of n. */\
    typedef struct {                                                                              \
        const T *x, *w, *dy;                                                                      \
        T *y, *inv, *dx, *dw, *partial;                                                           \
        int64_t rows, n, block;                                                                   \
        T eps;                                                                                    \
    } rms_args_##SUFFIX;                                                                          \
                                                                                                  \
    static int rms_forward_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                      \
        rms_args_##SUFFIX *a = (rms_args_##SUFFIX *)p;                                            \
        const int64_t n = a->n;                                                                   \
        for (int64_t r = lo; r < hi; r++) {                                                       \
            const T *x = a->x + r * n;                                                            \
            T *y = a->y + r * n;                                                                  \
            T scale = 1 / sqrt(dot_##SUFFIX(x, x, n) / n + a->eps);                               \
            a->inv[r] = scale;                                                                    \
            if (a->w)                                                                             \
                for (int64_t j = 0; j < n; j++) y[j] = x[j] * scale * a->w[j];                    \
            else                                                                                  \
                for (int64_t j = 0; j < n; j++) y[j] = x[j] * scale;                              \
        }                                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    /* dx = r (g - x r^2 <g, x> / n) with g = dy * w, for the rows of blocks [lo, hi) of `block`  \
     * rows; with a weight gradient, block b also sums dy x r over its rows into partial[b]       \
     * (n values), in the same pass over dy and x. */                                             \
    static int rms_backward_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                     \
        rms_args_##SUFFIX *a = (rms_args_##SUFFIX *)p;                                            \
        const int64_t n = a->n;                                                                   \
        const int64_t end = hi * a->block < a->rows ? hi * a->block : a->rows;                    \
        T *partial = NULL;                                                                        \
        for (int64_t r = lo * a->block; r < end; r++) {                                           \
            const T *x = a->x + r * n, *dy = a->dy + r * n;                                       \
            T *dx = a->dx + r * n;                                                                \
            const T scale = a->inv[r];                                                            \
            if (a->partial && r % a->block == 0) {                                                \
                partial = a->partial + (r / a->block) * n;                                        \
                for (int64_t j = 0; j < n; j++) partial[j] = 0;                                   \
            }                                                                                     \
            T gx = 0;                                                                             \
            if (a->w) {                                                                           \
                T acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                              \
                int64_t j = 0;                                                                    \
                for (; j + 8 <= n; j += 8)                                                        \
                    for (int u = 0; u < 8; u++) acc[u] += dy[j + u] * a->w[j + u] * x[j + u];     \
                for (; j < n; j++) gx += dy[j] * a->w[j] * x[j];                                  \
                for (int u = 0; u < 8; u++) gx += acc[u];                                         \
            } else {                                                                              \
                gx = dot_##SUFFIX(dy, x, n);                                                      \
            }                                                                                     \
            const T c = scale * scale * scale * gx / n;                                           \
            if (a->w)                                                                             \
                for (int64_t j = 0; j < n; j++) dx[j] = scale * dy[j] * a->w[j] - c * x[j];       \
            else                                                                                  \
                for (int64_t j = 0; j < n; j++) dx[j] = scale * dy[j] - c * x[j];                 \
            if (partial)                                                                          \
                for (int64_t j = 0; j < n; j++) partial[j] += dy[j] * x[j] * scale;               \
        }                                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    /* dw[j] = the sum of partial[b, j] over the blocks b, in order, for the columns [lo, hi). */ \
    static int rms_weight_range_##SUFFIX(void *p, int64_t lo, int64_t hi) {                       \
        rms_args_##SUFFIX *a = (rms_args_##SUFFIX *)p;                                            \
        const int64_t blocks = (a->rows + a->block - 1) / a->block;                               \
        for (int64_t j = lo; j < hi; j++) a->dw[j] = 0;                                           \
        for (int64_t b = 0; b < blocks; b++) {                                                    \
            const T *partial = a->partial + b * a->n;                                             \
            for (int64_t j = lo; j < hi; j++) a->dw[j] += partial[j];                             \
        }                                                                                         \
        return 0;                                                                                 \
    }                                                                                             \
                                                                                                  \
    int hop_rms_forward_##SUFFIX(const T *x, const T *w, int64_t rows, int64_t n, T eps, T *y,    \
                                  T *inv, int threads) {                                          \
        rms_args_##SUFFIX a = {x, w, NULL, y, inv, NULL, NULL, NULL, rows, n, 1, eps};            \
        return parallel_for(rms_forward_range_##SUFFIX, &a, rows, threads, PIECES);               \
    }                                                                                             \
                                                                                                  \
    /* dx, and dw when given, with partial the scratch of ceil(rows / block) x n values it is     \
     * summed in (dy and x are read once; the order of the sum depends on no thread count). */    \
    int hop_rms_backward_##SUFFIX(const T *dy, const T *x, const T *w, const T *inv, int64_t rows,\
                                   int64_t n, int64_t block, T *dx, T *dw, T *partial,            \
                                   int threads) {                                                 \
        T *sums = dw ? partial : NULL;                                                            \
        rms_args_##SUFFIX a = {x, w, dy, NULL, (T *)inv, dx, dw, sums, rows, n, block, 0};        \
        const int64_t blocks = (rows + block - 1) / block;                                        \
        return parallel_for(rms_backward_range_##SUFFIX, &a, blocks, threads, PIECES) |           \
               (dw ? parallel_for(rms_weight_range_##SUFFIX, &a, n, threads, SCAN_ALL) : 0);      \
    }                                                                                             \



#define KEY uint32_t
#define SIGN_f32 ((uint32_t)1 << 31)
#define INF_f32 ((uint32_t)0x7f800000)
#define BOUND_BITS 16
DEFINE_KERNELS(float, f32)
#undef KEY
#undef BOUND_BITS
#define KEY uint64_t
#define SIGN_f64 ((uint64_t)1 << 63)
#define INF_f64 ((uint64_t)0x7ff0000000000000)
#define BOUND_BITS 19
DEFINE_KERNELS(double, f64)
