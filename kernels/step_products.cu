// The training step's matrix products and its losses' sums as kernels of ours, so that a whole
// epoch of steps can be captured as one CUDA graph: CuPy refuses any cuBLAS call while a stream
// captures, and its full reductions may allocate. Launched by ksae_cupy/gpu/products.py (which
// says why these and not cuBLAS); run on the CPU by tests/gpu/test_products_host.py.
//
// No headers, as kernels/topk.cu: NVRTC compiles this file as it is.

namespace ksae {

// ---------------------------------------------------------------------------------------------
// C = op(A) op(B), row-major, C of M x N (leading dimension ldc), op(A) of M x K, op(B) of K x N.
// A is stored row-major as M x K (lda), or with TRANS_A as K x M (its transpose, a C-contiguous
// array read column-wise); B as K x N (ldb), or with TRANS_B as N x K.
//
// One block of GEMM_THREADS threads computes one GEMM_TILE x GEMM_TILE tile of C (the tiles are
// numbered along N first over a 1-D grid) over one split of K: with S splits (k_split values of K
// each), block b works on split b / tiles and writes its partial tile into the S-th slab of C
// (C holding S slabs of M x ldc; sum_splits_kernel adds them up in a fixed order), so that a product
// with few tiles (a batch of 128 rows: 2 x 16 tiles) still fills the GPU. Each thread holds a GEMM_MICRO x GEMM_MICRO block of
// outputs in registers, rows tm + 16 i and columns tn + 16 j (strided, so neighbouring threads read
// neighbouring shared words). K advances GEMM_STEP at a time through two shared tiles, loaded so
// that neighbouring threads read neighbouring global words in either storage order. Every load and
// store is bounds-checked: any M, N, K >= 0 works (K = 0 gives zeros).
constexpr int GEMM_TILE = 64;
constexpr int GEMM_STEP = 16;
constexpr int GEMM_MICRO = 4;
constexpr int GEMM_SIDE = GEMM_TILE / GEMM_MICRO;  // 16 threads along each side of the tile
constexpr int GEMM_THREADS = GEMM_SIDE * GEMM_SIDE;
constexpr int GEMM_TILE_ELEMS = GEMM_STEP * GEMM_TILE;

template <typename T, bool TRANS_A, bool TRANS_B>
__global__ void __launch_bounds__(GEMM_THREADS)
gemm_kernel(const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C, int M, int N, int K, int lda,
            int ldb, int ldc, int k_split) {
    // Dynamic shared memory: As[GEMM_STEP][GEMM_TILE] (k, m) then Bs[GEMM_STEP][GEMM_TILE] (k, n).
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* As = reinterpret_cast<T*>(smem_raw);
    T* Bs = As + GEMM_TILE_ELEMS;
    const int tiles_n = (N + GEMM_TILE - 1) / GEMM_TILE;
    const int tiles = (M + GEMM_TILE - 1) / GEMM_TILE * tiles_n;
    const int tile = static_cast<int>(blockIdx.x) % tiles, split = static_cast<int>(blockIdx.x) / tiles;
    const int m0 = tile / tiles_n * GEMM_TILE;
    const int n0 = tile % tiles_n * GEMM_TILE;
    const int k_begin = split * k_split;
    const int k_end = k_begin + k_split < K ? k_begin + k_split : K;
    C += static_cast<long long>(split) * M * ldc;
    const int tid = static_cast<int>(threadIdx.x);
    const int tm = tid / GEMM_SIDE, tn = tid % GEMM_SIDE;
    T acc[GEMM_MICRO][GEMM_MICRO];  // in registers: every loop over it is unrolled
#pragma unroll
    for (int i = 0; i < GEMM_MICRO; ++i)
#pragma unroll
        for (int j = 0; j < GEMM_MICRO; ++j) acc[i][j] = T(0);

    for (int k0 = k_begin; k0 < k_end; k0 += GEMM_STEP) {
        for (int e = tid; e < GEMM_TILE_ELEMS; e += GEMM_THREADS) {
            // Consecutive e walk the stored array's contiguous dimension.
            const int m = TRANS_A ? e % GEMM_TILE : e / GEMM_STEP;
            const int kk = TRANS_A ? e / GEMM_TILE : e % GEMM_STEP;
            const int gm = m0 + m, gk = k0 + kk;
            T v = T(0);
            if (gm < M && gk < k_end)
                v = TRANS_A ? A[static_cast<long long>(gk) * lda + gm] : A[static_cast<long long>(gm) * lda + gk];
            As[kk * GEMM_TILE + m] = v;
        }
        for (int e = tid; e < GEMM_TILE_ELEMS; e += GEMM_THREADS) {
            const int n = TRANS_B ? e / GEMM_STEP : e % GEMM_TILE;
            const int kk = TRANS_B ? e % GEMM_STEP : e / GEMM_TILE;
            const int gn = n0 + n, gk = k0 + kk;
            T v = T(0);
            if (gn < N && gk < k_end)
                v = TRANS_B ? B[static_cast<long long>(gn) * ldb + gk] : B[static_cast<long long>(gk) * ldb + gn];
            Bs[kk * GEMM_TILE + n] = v;
        }
        __syncthreads();  // the tiles are loaded
#pragma unroll
        for (int kk = 0; kk < GEMM_STEP; ++kk) {
            T a[GEMM_MICRO], b[GEMM_MICRO];
#pragma unroll
            for (int i = 0; i < GEMM_MICRO; ++i) a[i] = As[kk * GEMM_TILE + tm + GEMM_SIDE * i];
#pragma unroll
            for (int j = 0; j < GEMM_MICRO; ++j) b[j] = Bs[kk * GEMM_TILE + tn + GEMM_SIDE * j];
#pragma unroll
            for (int i = 0; i < GEMM_MICRO; ++i)
#pragma unroll
                for (int j = 0; j < GEMM_MICRO; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();  // every thread is done with the tiles before the next load
    }
#pragma unroll
    for (int i = 0; i < GEMM_MICRO; ++i) {
        const int gm = m0 + tm + GEMM_SIDE * i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < GEMM_MICRO; ++j) {
            const int gn = n0 + tn + GEMM_SIDE * j;
            if (gn < N) C[static_cast<long long>(gm) * ldc + gn] = acc[i][j];
        }
    }
}

// out[i] = sum_s parts[s * count + i], s = 0 .. S-1 in order: the K splits of a GEMM added up.
template <typename T>
__global__ void sum_splits_kernel(const T* __restrict__ parts, int S, long long count, T* __restrict__ out) {
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += step) {
        T acc = parts[i];
        for (int s = 1; s < S; ++s) acc += parts[s * count + i];
        out[i] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// The two products with the sparse code, from its k kept units per row only (a dense product would
// multiply H - k zeros per row: at MNIST's k = 25 of H = 1000, 40 times the work). Both read W
// transposed, WT_hd (H x D, C-contiguous), so that a unit's weights are one contiguous row. A column
// of idx_nk outside [0, H) is skipped. The sums run over j (the kept units) or d in a fixed order.

// R_nd[n, d] = sum_j Zs_nh[n, c_j] * WT_hd[c_j, d], c_j = idx_nk[n, j]: the decoder Zs W^T.
// Rows over a grid-stride loop of blocks, d over the block's threads.
template <typename T>
__global__ void __launch_bounds__(256)
sparse_decode_kernel(const T* __restrict__ Zs_nh, const int* __restrict__ idx_nk, const T* __restrict__ WT_hd,
                     int N, int H, int D, int k, T* __restrict__ R_nd) {
    for (int n = static_cast<int>(blockIdx.x); n < N; n += static_cast<int>(gridDim.x)) {
        const long long row = static_cast<long long>(n) * k;
        for (int d = static_cast<int>(threadIdx.x); d < D; d += static_cast<int>(blockDim.x)) {
            T acc = T(0);
            for (int j = 0; j < k; ++j) {
                const int c = idx_nk[row + j];
                if (c >= 0 && c < H) acc += Zs_nh[static_cast<long long>(n) * H + c] * WT_hd[static_cast<long long>(c) * D + d];
            }
            R_nd[static_cast<long long>(n) * D + d] = acc;
        }
    }
}

// out_nh[n, c_j] = sum_d R_nd[n, d] * WT_hd[c_j, d] at the kept units c_j = idx_nk[n, j]: (R W) masked
// to them, the gradient through the kept units. out_nh is zeroed by the launcher. One warp per kept
// entry (a grid-stride loop over them): its lanes stride d, then a shuffle tree sums the lanes.
template <typename T>
__global__ void __launch_bounds__(256)
kept_dot_kernel(const T* __restrict__ R_nd, const int* __restrict__ idx_nk, const T* __restrict__ WT_hd, int N,
                int H, int D, int k, T* __restrict__ out_nh) {
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    const long long total = static_cast<long long>(N) * k;
    for (long long t = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < total; t += warps) {
        const int c = idx_nk[t];  // the same t, so the same c, in every lane of the warp
        if (c < 0 || c >= H) continue;
        const long long n = t / k;
        T s = T(0);
        for (int d = lane; d < D; d += 32) s += R_nd[n * D + d] * WT_hd[static_cast<long long>(c) * D + d];
        for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
        if (lane == 0) out_nh[n * H + c] = s;
    }
}

// ---------------------------------------------------------------------------------------------
// acc[0] += scale * sum_i x[i]^2: each square in T (as x * x in the step's float type), the sum in
// double. One block, so the order of the sum is fixed (the same bits at every launch). With a gate
// (n_gate > 0), nothing is added unless some gate[j] != 0: AuxK's loss counts only while a unit is
// dead. SUM_THREADS threads; a tree in shared memory.
constexpr int SUM_THREADS = 256;

template <typename T>
__global__ void __launch_bounds__(SUM_THREADS)
add_sum_squares_kernel(const T* __restrict__ x, long long n, double scale, const T* __restrict__ gate, int n_gate,
                       double* __restrict__ acc) {
    static_assert(SUM_THREADS == 256, "partial[] is sized for 256 threads");
    __shared__ double partial[256];
    __shared__ int open;
    const int tid = static_cast<int>(threadIdx.x);
    if (tid == 0) open = n_gate > 0 ? 0 : 1;
    double s = 0.0;
    for (long long i = tid; i < n; i += SUM_THREADS) {
        const T v = x[i];
        const T square = v * v;
        s += static_cast<double>(square);
    }
    partial[tid] = s;
    __syncthreads();  // open is set, the partial sums written
    for (int j = tid; j < n_gate; j += SUM_THREADS)
        if (gate[j] != T(0)) open = 1;  // every writer writes the same value
    for (int half = SUM_THREADS / 2; half > 0; half /= 2) {
        if (tid < half) partial[tid] += partial[tid + half];
        __syncthreads();  // this level's sums are written (and, the first time, every gate read)
    }
    if (tid == 0 && open) acc[0] += scale * partial[0];
}

}  // namespace ksae
