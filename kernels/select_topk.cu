// Batched top-k kernels for ksae-cupy, and the gathers/scatters of the sparse backward pass.
//
// The contract (ksae_cupy/topk.py) these kernels match bit for bit:
//   * entries are ranked by order-preserving unsigned keys: a positive float gets its sign bit
//     set, a negative float has all bits flipped, and every NaN maps to key 0 (below -inf);
//   * exactly k entries are kept per row, 1 <= k <= H;
//   * among equal keys the lower column index wins.
//
// Compiled by cupy.RawModule (NVRTC, -std=c++17; the template instantiations are named through
// name_expressions, listed once in ksae_cupy/gpu/kernels.py) and, for the compile test, by nvcc.
// No headers are included, so NVRTC needs no include paths (none exist in a wheel install).
// tests/gpu/test_kernels_host.py also compiles this file unmodified for the CPU
// (tests/gpu/cuda_host/) and checks every instantiation against ksae_cupy.topk.
//
// Layout: every array is C-contiguous; Z is (N, H), idx/val are (N, k), dense is (N, H).
// One thread block handles one row at a time and strides over rows (row += gridDim.x), so any N
// works with any grid. The row's keys live in dynamic shared memory (the launcher sizes it and
// raises the per-block limit above 48 KB when the row needs it).

namespace ksae {

// ---------------------------------------------------------------------------------------------
// Order-preserving keys.
template <typename T>
struct KeyTraits;

template <>
struct KeyTraits<float> {
    typedef unsigned int Key;
    static constexpr int BITS = 32;
    static __device__ __forceinline__ Key to_key(float x) {
        const unsigned int u = __float_as_uint(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN (any sign, any payload)
        // Arithmetic shift: all ones for negatives, zero otherwise; then force the sign bit.
        const unsigned int flip = static_cast<unsigned int>(static_cast<int>(u) >> 31) | 0x80000000u;
        return u ^ flip;
    }
};

template <>
struct KeyTraits<double> {
    typedef unsigned long long Key;
    static constexpr int BITS = 64;
    static __device__ __forceinline__ Key to_key(double x) {
        const unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(x));
        if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) return 0ull;  // NaN
        const unsigned long long flip =
            static_cast<unsigned long long>(static_cast<long long>(u) >> 63) | 0x8000000000000000ull;
        return u ^ flip;
    }
};

// ---------------------------------------------------------------------------------------------
// Block-wide exclusive sum of one unsigned value per thread, in thread order.
// Every thread of the block must call it (it contains __syncthreads). BLOCK is a multiple of 32
// and at most 1024, so the per-warp totals fit in one warp. `warp_sums` holds BLOCK/32 entries.
// Returns the exclusive prefix of the calling thread and the block's sum.
struct ScanResult {
    unsigned int exclusive;
    unsigned int total;
};

template <int BLOCK>
__device__ __forceinline__ ScanResult block_exclusive_sum(unsigned int v, unsigned int* warp_sums) {
    static_assert(BLOCK % 32 == 0 && BLOCK >= 32 && BLOCK <= 1024, "BLOCK must be 32..1024, a multiple of 32");
    constexpr int WARPS = BLOCK / 32;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    unsigned int x = v;  // inclusive scan within the warp
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const unsigned int y = __shfl_up_sync(0xffffffffu, x, offset);
        if (lane >= offset) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {  // the whole first warp takes part, so the full mask is right
        unsigned int s = (lane < WARPS) ? warp_sums[lane] : 0u;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
            const unsigned int y = __shfl_up_sync(0xffffffffu, s, offset);
            if (lane >= offset) s += y;
        }
        if (lane < WARPS) warp_sums[lane] = s;  // inclusive per-warp prefix
    }
    __syncthreads();
    ScanResult r;
    r.exclusive = ((warp > 0) ? warp_sums[warp - 1] : 0u) + x - v;
    r.total = warp_sums[WARPS - 1];
    __syncthreads();  // warp_sums may be reused by the next call
    return r;
}

// ---------------------------------------------------------------------------------------------
// Iterative threshold (radix select), one block per row.
//
// 1. Load the row once as keys into shared memory.
// 2. Find the k-th largest key 8 bits at a time, from the top digit down: histogram the digit of
//    the candidates that match the digits found so far (shared-memory atomics, 256 bins), take
//    suffix counts with one block scan, and pick the digit bin holding the k-th key from the
//    counts alone. Stop early when that bin's candidates are exactly the ones still needed.
//    Afterwards (prefix, mask) describes the threshold group: entries whose masked key exceeds
//    prefix are above it; entries equal to it are ties, of which the first `need` are kept
//    (with an early stop, need equals the group's size, so all of it is kept).
// 3. Emit in ascending column order with one ordered block scan per tile of BLOCK columns over
//    packed (above, tie) flags: the output slot of a kept column j is
//    above_before(j) + min(ties_before(j), need).
// Optionally also writes the dense masked row (kept values, zeros elsewhere).
template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1)
topk_threshold_kernel(const T* __restrict__ Z, int N, int H, int k, int* __restrict__ idx_out,
                      T* __restrict__ val_out, T* __restrict__ dense_out, int write_dense) {
    static_assert(BLOCK >= 256, "the digit histogram scan needs one thread per bin");
    typedef typename KeyTraits<T>::Key Key;
    constexpr int BITS = KeyTraits<T>::BITS;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Key* keys = reinterpret_cast<Key*>(smem_raw);
    __shared__ unsigned int hist[256];
    __shared__ unsigned int warp_sums[32];
    __shared__ unsigned int s_digit, s_need, s_bin;

    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        const T* z = Z + row * static_cast<long long>(H);
        for (int j = threadIdx.x; j < H; j += BLOCK) keys[j] = KeyTraits<T>::to_key(z[j]);

        Key prefix = 0, mask = 0;
        unsigned int need = static_cast<unsigned int>(k);  // rank of the k-th key among candidates
        for (int shift = BITS - 8; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += BLOCK) hist[b] = 0u;
            __syncthreads();  // keys loaded (first pass), histogram cleared
            for (int j = threadIdx.x; j < H; j += BLOCK) {
                const Key key = keys[j];
                if ((key & mask) == prefix) atomicAdd(&hist[static_cast<unsigned int>(key >> shift) & 0xffu], 1u);
            }
            __syncthreads();
            // Thread t looks at digit d = 255 - t; the exclusive scan of hist[255 - t] is the
            // number of candidates with a digit above d.
            const int t = threadIdx.x;
            const unsigned int count = (t < 256) ? hist[255 - t] : 0u;
            const unsigned int above = block_exclusive_sum<BLOCK>(count, warp_sums).exclusive;
            if (t < 256 && above < need && need <= above + count) {  // exactly one thread
                s_digit = 255u - static_cast<unsigned int>(t);
                s_need = need - above;
                s_bin = count;
            }
            __syncthreads();
            prefix |= static_cast<Key>(s_digit) << shift;
            mask |= static_cast<Key>(0xffu) << shift;
            need = s_need;
            const bool whole_bin = (s_bin == need);  // every candidate left is kept
            if (whole_bin) break;  // uniform across the block: all threads read the same values
        }

        // Emit the kept columns in ascending order.
        int* idx_row = idx_out + row * static_cast<long long>(k);
        T* val_row = val_out + row * static_cast<long long>(k);
        T* dense_row = dense_out + (write_dense ? row * static_cast<long long>(H) : 0ll);
        unsigned int run_above = 0, run_ties = 0;
        for (int base = 0; base < H; base += BLOCK) {
            const int j = base + threadIdx.x;
            unsigned int is_above = 0, is_tie = 0;
            if (j < H) {
                const Key m = keys[j] & mask;
                is_above = (m > prefix) ? 1u : 0u;
                is_tie = (m == prefix) ? 1u : 0u;
            }
            // Per-tile counts are at most BLOCK <= 1024, so the low 16 bits never carry.
            const ScanResult scan = block_exclusive_sum<BLOCK>(is_above | (is_tie << 16), warp_sums);
            const unsigned int excl = scan.exclusive, total = scan.total;
            const unsigned int ties_before = run_ties + (excl >> 16);
            const bool keep = is_above || (is_tie && ties_before < need);
            if (j < H) {
                const T v = z[j];
                if (keep) {
                    const unsigned int slot = run_above + (excl & 0xffffu) + (ties_before < need ? ties_before : need);
                    idx_row[slot] = j;
                    val_row[slot] = v;
                }
                if (write_dense) dense_row[j] = keep ? v : T(0);
            }
            run_above += total & 0xffffu;
            run_ties += total >> 16;
            const unsigned int kept = run_above + (run_ties < need ? run_ties : need);
            if (!write_dense && kept >= static_cast<unsigned int>(k)) break;  // uniform
        }
        // No barrier needed before the next row overwrites keys and the histogram: every read of
        // them in this row came before the last block scan, which ends with __syncthreads.
    }
}

// ---------------------------------------------------------------------------------------------
// Selection by sorting, one block per row: bitonic sort of the whole row's (key, column) pairs in
// shared memory, padded to P = next power of two >= H with pairs (key 0, column INT_MAX) that rank
// below every real entry (NaN included, whose key is also 0 but whose column is smaller). The
// order is descending key, ascending column among equal keys. The first k pairs are written in
// that order. The dense masked row, when asked for, keeps j iff (key_j, j) ranks at or before the
// k-th pair.
template <typename T>
__device__ __forceinline__ bool ranks_before(typename KeyTraits<T>::Key ka, int ia, typename KeyTraits<T>::Key kb,
                                             int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

template <typename T, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1)
topk_sort_kernel(const T* __restrict__ Z, int N, int H, int P, int k, int* __restrict__ idx_out,
                 T* __restrict__ val_out, T* __restrict__ dense_out, int write_dense) {
    typedef typename KeyTraits<T>::Key Key;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Key* keys = reinterpret_cast<Key*>(smem_raw);      // P keys
    int* cols = reinterpret_cast<int*>(keys + P);       // P columns

    for (long long row = blockIdx.x; row < N; row += gridDim.x) {
        const T* z = Z + row * static_cast<long long>(H);
        for (int j = threadIdx.x; j < P; j += BLOCK) {
            if (j < H) {
                keys[j] = KeyTraits<T>::to_key(z[j]);
                cols[j] = j;
            } else {
                keys[j] = 0;
                cols[j] = 0x7fffffff;
            }
        }
        __syncthreads();
        for (int size = 2; size <= P; size <<= 1) {
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = threadIdx.x; i < (P >> 1); i += BLOCK) {
                    const int lo = 2 * i - (i & (stride - 1));  // partner lo + stride, bit `stride` clear
                    const int hi = lo + stride;
                    const bool forward = (lo & size) == 0;  // this run is sorted in our order, else reversed
                    const Key ka = keys[lo], kb = keys[hi];
                    const int ia = cols[lo], ib = cols[hi];
                    if (ranks_before<T>(kb, ib, ka, ia) == forward) {
                        keys[lo] = kb; keys[hi] = ka;
                        cols[lo] = ib; cols[hi] = ia;
                    }
                }
                __syncthreads();
            }
        }
        int* idx_row = idx_out + row * static_cast<long long>(k);
        T* val_row = val_out + row * static_cast<long long>(k);
        for (int j = threadIdx.x; j < k; j += BLOCK) {
            const int c = cols[j];
            idx_row[j] = c;
            val_row[j] = z[c];
        }
        if (write_dense) {
            const Key kth_key = keys[k - 1];
            const int kth_col = cols[k - 1];
            T* dense_row = dense_out + row * static_cast<long long>(H);
            for (int j = threadIdx.x; j < H; j += BLOCK) {
                const T v = z[j];
                const Key key = KeyTraits<T>::to_key(v);
                const bool keep = key > kth_key || (key == kth_key && j <= kth_col);
                dense_row[j] = keep ? v : T(0);
            }
        }
        __syncthreads();  // the next row overwrites keys and cols
    }
}

// ---------------------------------------------------------------------------------------------
// Radix select, one warp per row (the "radix" kernels; the block kernels above stay selectable).
//
// A block holds blockDim.x / 32 warps (at most RADIX_MAX_WARPS), each working on its own rows
// (row = blockIdx.x * warps + warp, striding by gridDim.x * warps), so short rows pack several to a
// block and no step needs a block-wide barrier: only __syncwarp and warp votes.
//   1. One read of the row (16-byte vector loads when the row is aligned and a whole number of
//      vectors) turns it into keys, histograms their top digit (per-warp histogram in shared
//      memory), and, when `cache_keys` is set, keeps the keys in the warp's shared-memory region.
//   2. Later digits (8 bits at a time) histogram only the candidates matching the digits found so
//      far, from the cache or, for rows too long to cache, from global memory again. Each lane
//      owns 8 bins; a warp scan of the lanes' sums finds the bin holding the k-th key. Stop early
//      when that bin's candidates are exactly the ones still needed (as the block kernel does).
//   3. Emit in ascending column order, 32 columns at a time: two ballots (above the threshold
//      group, in it) and popc of the lanes below give each kept column its slot.
//   4. SORTED: the warp reloads its k kept (key, column) pairs into its region, pads them to P (a
//      power of two) with pairs ranking below everything, bitonic-sorts them (descending key,
//      ascending column) and rewrites idx/val in that order: the sort variant's output, sorting k
//      entries rather than H.
// `region_bytes`: each warp's share of the dynamic shared memory (a multiple of 16), enough for
// H keys when cache_keys is set and for P (key, column) pairs when SORTED.
constexpr int RADIX_MAX_WARPS = 8;

template <typename T>
struct __align__(16) Vec16 {
    T v[16 / sizeof(T)];
};

template <typename T>
__device__ __forceinline__ typename KeyTraits<T>::Key radix_key_at(const T* z, const typename KeyTraits<T>::Key* keys,
                                                                   bool cached, int j) {
    return cached ? keys[j] : KeyTraits<T>::to_key(z[j]);
}

template <typename T, bool SORTED>
__global__ void __launch_bounds__(256, 2)
topk_radix_kernel(const T* __restrict__ Z, int N, int H, int k, int cache_keys, int region_bytes, int P,
                  int* __restrict__ idx_out, T* __restrict__ val_out, T* __restrict__ dense_out, int write_dense) {
    typedef typename KeyTraits<T>::Key Key;
    constexpr int BITS = KeyTraits<T>::BITS;
    constexpr int VEC = 16 / static_cast<int>(sizeof(T));
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned int hist_all[RADIX_MAX_WARPS][256];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const unsigned int lanes_below = (1u << lane) - 1u;
    unsigned int* hist = hist_all[warp];
    unsigned char* region = smem_raw + static_cast<long long>(warp) * region_bytes;
    Key* keys = reinterpret_cast<Key*>(region);
    const bool cached = cache_keys != 0;

    for (long long row = static_cast<long long>(blockIdx.x) * warps + warp; row < N;
         row += static_cast<long long>(gridDim.x) * warps) {
        const T* z = Z + row * static_cast<long long>(H);
        // The previous row's last reads of keys/hist (emit, sort) come before this barrier.
        __syncwarp(0xffffffffu);
        for (int b = lane * 8; b < lane * 8 + 8; ++b) hist[b] = 0u;
        __syncwarp(0xffffffffu);
        // 1. One read of the row: keys (cached if asked) and the histogram of the top digit.
        const bool vector_ok = (H % VEC == 0) && ((reinterpret_cast<unsigned long long>(z) & 15ull) == 0ull);
        if (vector_ok) {
            const Vec16<T>* zv = reinterpret_cast<const Vec16<T>*>(z);
            for (int q = lane; q < H / VEC; q += 32) {
                const Vec16<T> x = zv[q];
                Vec16<Key> kv;  // the keys of one vector, stored as one 16-byte word (no bank conflicts)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    kv.v[e] = KeyTraits<T>::to_key(x.v[e]);
                    atomicAdd(&hist[static_cast<unsigned int>(kv.v[e] >> (BITS - 8)) & 0xffu], 1u);
                }
                if (cached) reinterpret_cast<Vec16<Key>*>(keys)[q] = kv;
            }
        } else {
            for (int j = lane; j < H; j += 32) {
                const Key key = KeyTraits<T>::to_key(z[j]);
                if (cached) keys[j] = key;
                atomicAdd(&hist[static_cast<unsigned int>(key >> (BITS - 8)) & 0xffu], 1u);
            }
        }
        __syncwarp(0xffffffffu);

        // 2. The k-th key's digits, top down.
        Key prefix = 0, mask = 0;
        unsigned int need = static_cast<unsigned int>(k);
        for (int shift = BITS - 8;; shift -= 8) {
            if (shift != BITS - 8) {  // the top digit's histogram came with the load
                for (int b = lane * 8; b < lane * 8 + 8; ++b) hist[b] = 0u;
                __syncwarp(0xffffffffu);
                for (int j = lane; j < H; j += 32) {
                    const Key key = radix_key_at<T>(z, keys, cached, j);
                    if ((key & mask) == prefix) atomicAdd(&hist[static_cast<unsigned int>(key >> shift) & 0xffu], 1u);
                }
                __syncwarp(0xffffffffu);
            }
            // Lane l owns digits 255 - 8l down to 248 - 8l; `above` counts candidates with a higher digit.
            const int top = 255 - 8 * lane;
            unsigned int sum = 0;
#pragma unroll
            for (int d = top; d > top - 8; --d) sum += hist[d];
            unsigned int incl = sum;
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const unsigned int y = __shfl_up_sync(0xffffffffu, incl, offset);
                if (lane >= offset) incl += y;
            }
            unsigned int above = incl - sum;
            unsigned int my_digit = 0, my_need = 0, my_bin = 0;
            bool found = false;
#pragma unroll
            for (int d = top; d > top - 8; --d) {
                const unsigned int count = hist[d];
                if (!found && need > above && need - above <= count) {
                    found = true;
                    my_digit = static_cast<unsigned int>(d);
                    my_need = need - above;
                    my_bin = count;
                }
                above += count;
            }
            const int src = __ffs(static_cast<int>(__ballot_sync(0xffffffffu, found))) - 1;  // exactly one lane
            const unsigned int digit = __shfl_sync(0xffffffffu, my_digit, src);
            need = __shfl_sync(0xffffffffu, my_need, src);
            const unsigned int bin = __shfl_sync(0xffffffffu, my_bin, src);
            prefix |= static_cast<Key>(digit) << shift;
            mask |= static_cast<Key>(0xffu) << shift;
            // The lanes' reads of hist came before the votes above; the next pass clears only the
            // bins its lane read, and the histogram after it follows a __syncwarp.
            if (bin == need || shift == 0) break;  // uniform: every lane holds the same values
        }

        // 3. Emit the kept columns in ascending order.
        int* idx_row = idx_out + row * static_cast<long long>(k);
        T* val_row = val_out + row * static_cast<long long>(k);
        T* dense_row = dense_out + (write_dense ? row * static_cast<long long>(H) : 0ll);
        unsigned int run_above = 0, run_ties = 0;
        for (int base = 0; base < H; base += 32) {
            const int j = base + lane;
            bool is_above = false, is_tie = false;
            if (j < H) {
                const Key m = radix_key_at<T>(z, keys, cached, j) & mask;
                is_above = m > prefix;
                is_tie = m == prefix;
            }
            const unsigned int above_votes = __ballot_sync(0xffffffffu, is_above);
            const unsigned int tie_votes = __ballot_sync(0xffffffffu, is_tie);
            const unsigned int ties_before = run_ties + static_cast<unsigned int>(__popc(tie_votes & lanes_below));
            const bool keep = (is_tie && ties_before < need) || is_above;
            if (j < H) {
                if (keep) {
                    const unsigned int slot = run_above + static_cast<unsigned int>(__popc(above_votes & lanes_below)) +
                                              (ties_before < need ? ties_before : need);
                    idx_row[slot] = j;
                    val_row[slot] = z[j];
                }
                if (write_dense) dense_row[j] = keep ? z[j] : T(0);
            }
            run_above += static_cast<unsigned int>(__popc(above_votes));
            run_ties += static_cast<unsigned int>(__popc(tie_votes));
            const unsigned int kept = run_above + (run_ties < need ? run_ties : need);
            if (kept >= static_cast<unsigned int>(k) && !write_dense) break;  // uniform across the warp
        }

        // 4. Sort the k kept entries: descending key, ascending column.
        if (SORTED) {
            Key* pkeys = reinterpret_cast<Key*>(region);  // reuses the key cache: emit has read it
            int* pcols = reinterpret_cast<int*>(pkeys + P);
            __syncwarp(0xffffffffu);  // the emit's reads of keys and writes of idx_row/val_row are done
            for (int i = lane; i < P; i += 32) {
                if (i < k) {
                    const int c = idx_row[i];
                    pkeys[i] = KeyTraits<T>::to_key(val_row[i]);
                    pcols[i] = c;
                } else {
                    pkeys[i] = 0;
                    pcols[i] = 0x7fffffff;
                }
            }
            __syncwarp(0xffffffffu);
            for (int size = 2; size <= P; size <<= 1) {
                for (int stride = size >> 1; stride > 0; stride >>= 1) {
                    for (int i = lane; i < (P >> 1); i += 32) {
                        const int lo = 2 * i - (i & (stride - 1));
                        const int hi = lo + stride;
                        const bool forward = (lo & size) == 0;
                        const Key ka = pkeys[lo], kb = pkeys[hi];
                        const int ia = pcols[lo], ib = pcols[hi];
                        if (ranks_before<T>(kb, ib, ka, ia) == forward) {
                            pkeys[lo] = kb; pkeys[hi] = ka;
                            pcols[lo] = ib; pcols[hi] = ia;
                        }
                    }
                    __syncwarp(0xffffffffu);
                }
            }
            for (int i = lane; i < k; i += 32) {
                const int c = pcols[i];
                idx_row[i] = c;
                val_row[i] = z[c];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sparse backward helpers: one grid-stride loop over the N*k kept entries, shared by the three
// kernels, which differ only in what they do with entry t = (n, j) and its column c. A column
// outside [0, H) is skipped (never read or written out of bounds).
template <typename Op>
__device__ __forceinline__ void for_each_kept(const int* __restrict__ idx_nk, int N, int H, int k, Op op) {
    const long long total = static_cast<long long>(N) * k;
    const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
    for (long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
        const int c = idx_nk[t];
        op(t, t / k * H, c, c >= 0 && c < H);  // (entry, offset of its row in an (N, H) array, column, valid)
    }
}

// out_nk[n, j] = src_nh[n, idx_nk[n, j]] (0 for an invalid column)
template <typename T>
__global__ void gather_rows_kernel(const T* __restrict__ src_nh, const int* __restrict__ idx_nk, int N, int H,
                                   int k, T* __restrict__ out_nk) {
    for_each_kept(idx_nk, N, H, k, [&](long long t, long long row, int c, bool valid) {
        out_nk[t] = valid ? src_nh[row + c] : T(0);
    });
}

// out_nh[n, idx_nk[n, j]] = val_nk[n, j]; out_nh is zeroed by the caller. A column repeated within
// a row gets one of its values, which one is unspecified (top-k indices never repeat).
template <typename T>
__global__ void scatter_rows_kernel(const T* __restrict__ val_nk, const int* __restrict__ idx_nk, int N, int H,
                                    int k, T* __restrict__ out_nh) {
    for_each_kept(idx_nk, N, H, k, [&](long long t, long long row, int c, bool valid) {
        if (valid) out_nh[row + c] = val_nk[t];
    });
}

// out_nh[n, c] = src_nh[n, c] for the kept columns c of row n; out_nh is zeroed by the caller.
// The fused gather + scatter of dZ_nh = (R W) masked to the kept units.
template <typename T>
__global__ void mask_rows_kernel(const T* __restrict__ src_nh, const int* __restrict__ idx_nk, int N, int H, int k,
                                 T* __restrict__ out_nh) {
    for_each_kept(idx_nk, N, H, k, [&](long long, long long row, int c, bool valid) {
        if (valid) out_nh[row + c] = src_nh[row + c];
    });
}

}  // namespace ksae
