// An epoch's order drawn on the device: NumPy's Generator(PCG64).permutation(N), bit for bit, and the
// generator's state after it, so that a run whose epochs are CUDA graphs (ksae_cupy/gpu/graph_epoch.py)
// sees the batches a CPU run of the same seed sees, and its checkpoints hold the same state.
// Launched by ksae_cupy/gpu/shuffle.py; run on the CPU against NumPy by tests/gpu/test_shuffle_host.py.
//
// NumPy's algorithm (numpy/random: Generator.shuffle -> _shuffle_raw, random_interval, pcg64):
//   for i = N-1 down to 1: j = random_interval(i); swap(a[i], a[j])
//   random_interval(i): mask = the smallest 2^b - 1 >= i; draw next_uint32() & mask until <= i
//   next_uint32: the low half of a fresh 64-bit output, its high half kept for the next call
//   next_uint64 (PCG64, XSL-RR 128/64): state = state * MULT + inc (mod 2^128);
//                output = rotr64(hi ^ lo, hi >> 58) of the new state
// Fisher-Yates is sequential: thread 0 runs it, on the order in shared memory when it fits as
// 16-bit values (N <= 65,536), else in global memory; the other threads fill and copy out.
//
// state[6] (in and out, the bit patterns of uint64 values): state hi, state lo, inc hi, inc lo,
// has_uint32, uinteger (as NumPy's bit_generator.state holds them).

namespace ksae {

constexpr int SHUFFLE_THREADS = 256;

// The high 64 bits of a * b, from 32-bit limbs (the same code on the GPU and in the emulator).
__device__ __forceinline__ unsigned long long mul_hi64(unsigned long long a, unsigned long long b) {
    const unsigned long long a_lo = a & 0xffffffffull, a_hi = a >> 32, b_lo = b & 0xffffffffull, b_hi = b >> 32;
    const unsigned long long lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
    const unsigned long long cross = (lo_lo >> 32) + (hi_lo & 0xffffffffull) + lo_hi;
    return hi_hi + (hi_lo >> 32) + (cross >> 32);
}

struct Pcg64 {
    unsigned long long hi, lo, inc_hi, inc_lo;
    bool has_uint32;
    unsigned int uinteger;

    __device__ unsigned long long next64() {
        const unsigned long long mult_hi = 0x2360ED051FC65DA4ull, mult_lo = 0x4385DF649FCCF645ull;
        const unsigned long long prod_lo = lo * mult_lo;
        const unsigned long long prod_hi = mul_hi64(lo, mult_lo) + lo * mult_hi + hi * mult_lo;
        lo = prod_lo + inc_lo;
        hi = prod_hi + inc_hi + (lo < prod_lo ? 1ull : 0ull);  // the carry of the low half
        const unsigned long long x = hi ^ lo;
        const unsigned int rot = static_cast<unsigned int>(hi >> 58);
        return (x >> rot) | (x << ((64u - rot) & 63u));
    }

    __device__ unsigned int next32() {
        if (has_uint32) {
            has_uint32 = false;
            return uinteger;
        }
        const unsigned long long next = next64();
        has_uint32 = true;
        uinteger = static_cast<unsigned int>(next >> 32);
        return static_cast<unsigned int>(next & 0xffffffffull);
    }

    // A uniform value in [0, max] (max < 2^32: N is an int), by NumPy's masked rejection.
    __device__ unsigned int interval(unsigned int max) {
        if (max == 0) return 0;
        unsigned int mask = max;
        mask |= mask >> 1;
        mask |= mask >> 2;
        mask |= mask >> 4;
        mask |= mask >> 8;
        mask |= mask >> 16;
        unsigned int value;
        while ((value = next32() & mask) > max) {
        }
        return value;
    }
};

template <typename E>
__device__ void fisher_yates(E* a, int N, Pcg64& rng) {
    for (int i = N - 1; i >= 1; --i) {
        const unsigned int j = rng.interval(static_cast<unsigned int>(i));
        const E t = a[j];
        a[j] = a[i];
        a[i] = t;
    }
}

// One block of SHUFFLE_THREADS threads. in_shared: 1 to run in 2 * N bytes of dynamic shared memory
// (N <= 65,536), 0 to run in order_n itself.
__global__ void __launch_bounds__(SHUFFLE_THREADS)
permutation_kernel(long long* __restrict__ order_n, int N, long long* __restrict__ state, int in_shared) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned short* s = reinterpret_cast<unsigned short*>(smem_raw);
    const int tid = static_cast<int>(threadIdx.x);
    for (int i = tid; i < N; i += SHUFFLE_THREADS) {
        if (in_shared)
            s[i] = static_cast<unsigned short>(i);
        else
            order_n[i] = i;
    }
    __syncthreads();  // the identity is in place
    if (tid == 0) {
        Pcg64 rng{static_cast<unsigned long long>(state[0]), static_cast<unsigned long long>(state[1]),
                  static_cast<unsigned long long>(state[2]), static_cast<unsigned long long>(state[3]), state[4] != 0,
                  static_cast<unsigned int>(state[5])};
        if (in_shared)
            fisher_yates(s, N, rng);
        else
            fisher_yates(order_n, N, rng);
        state[0] = static_cast<long long>(rng.hi);
        state[1] = static_cast<long long>(rng.lo);
        state[4] = rng.has_uint32 ? 1 : 0;
        state[5] = static_cast<long long>(rng.uinteger);
    }
    __syncthreads();  // the shuffle is done
    if (in_shared)
        for (int i = tid; i < N; i += SHUFFLE_THREADS) order_n[i] = s[i];
}

}  // namespace ksae
