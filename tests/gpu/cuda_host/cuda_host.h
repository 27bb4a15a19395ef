// cuda_host.h: lets CUDA kernel sources compile unmodified for the host and run on a CPU.
//
//   g++ -std=c++20 -fno-extern-tls-init -include cuda_host.h driver.cpp   (driver.cpp includes the .cu)
//
// Model. Every CUDA thread is a fiber (fiber.h); a block's fibers run one at a time on one host
// thread, each until it blocks: at __syncthreads (until every live thread of the block arrives, at
// the same call) or at a warp intrinsic (until every lane of its mask arrives). Blocks run one
// after another, in forward, reverse or shuffled order. Within a block, two kinds of thread order:
//   * thread by thread (forward, reverse, shuffled): every runnable thread runs one stretch per
//     sweep, so all warps advance together between barriers;
//   * warp by warp (warps-forward, warps-reverse, warps-shuffle): after every barrier the first
//     warp of the order runs alone until each of its threads waits at the next barrier or has
//     exited, then the next warp, and so on. A warp thus runs ahead of the others between two
//     barriers, as it may on a GPU, so a barrier missing between one phase's reads and the next
//     phase's writes (e.g. of shared memory a later call reuses) gives wrong answers.
// Orders are reshuffled after every barrier, so a kernel that depends on block order, or races
// between two barriers, gives different answers under different orders.
//
// Checked, with a report naming the kernel, the case, the block and the thread (guard.h):
//   * a _sync warp intrinsic called by a lane outside its mask, a mask naming lanes that do not
//     exist, lanes of one mask meeting at different intrinsics, a shuffle reading a lane outside
//     the mask;
//   * threads of a block waiting at different __syncthreads calls, and deadlocks (a lane of a
//     mask that never arrives, a barrier some live thread never reaches);
//   * dynamic shared memory: sized per launch; writes just outside it (canary bytes on both
//     sides, checked after every stretch a thread runs) and anywhere in the rest of the arena
//     (checked after every block); static + dynamic above 48 KiB only with the opt-in, as on a GPU;
//   * static shared arrays: indexing out of bounds (-fsanitize=bounds);
//   * kernel arguments in GuardedBuffers: any access outside them (guard pages), writes next to them.
// Not modelled: timing, memory ordering between threads of different blocks (blocks never run
// concurrently here), the contents of uninitialised static shared memory (it keeps the previous
// block's values; dynamic shared memory is refilled with garbage for every block).
#pragma once

#include <bit>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fiber.h"
#include "guard.h"

// ---------------------------------------------------------------------------------------------
// Qualifiers. __shared__ must also work after `extern` (dynamic shared memory), which rules out
// `static`; thread_local works in both places and, with every fiber on one host thread, means
// exactly one instance per running block.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace cuda_host {

enum class Order { Forward, Reverse, Shuffle, WarpsForward, WarpsReverse, WarpsShuffle };

inline bool by_warps(Order o) { return o == Order::WarpsForward || o == Order::WarpsReverse || o == Order::WarpsShuffle; }

enum class State { Runnable, AtBarrier, AtWarpOp, Done };

enum class WarpOp { None, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, SyncWarp };

inline const char* op_name(WarpOp op) {
    switch (op) {
        case WarpOp::ShflIdx: return "__shfl_sync";
        case WarpOp::ShflUp: return "__shfl_up_sync";
        case WarpOp::ShflDown: return "__shfl_down_sync";
        case WarpOp::ShflXor: return "__shfl_xor_sync";
        case WarpOp::Ballot: return "__ballot_sync";
        case WarpOp::Any: return "__any_sync";
        case WarpOp::All: return "__all_sync";
        case WarpOp::SyncWarp: return "__syncwarp";
        default: return "(none)";
    }
}

struct Thread {
    uint3 idx{};
    unsigned linear = 0, lane = 0, warp = 0;
    State state = State::Done;
    int line = 0;  // source line of the barrier or warp intrinsic it waits at
    fiber::Context ctx;
    fiber::Stack stack;
};

// One warp's meeting point for a _sync intrinsic: lanes deposit a value and block; the last lane
// of the mask to arrive computes every lane's result.
struct Warp {
    unsigned exists = 0;   // lanes that are threads of the block
    unsigned arrived = 0;  // lanes waiting at the current intrinsic
    unsigned mask = 0;
    WarpOp op = WarpOp::None;
    int width = 32;
    int line = 0;
    std::uint64_t in[32] = {};
    int arg[32] = {};
    std::uint64_t out[32] = {};
};

struct Block {
    uint3 idx{};
    dim3 dim, grid;
    std::vector<Thread> threads;  // grows only: the first `count` are this launch's, stacks are reused
    unsigned count = 0;
    std::vector<Warp> warps;
    unsigned live = 0, at_barrier = 0;
    int barrier_line = 0;
    bool released = false;  // a barrier opened during the last stretch: restart the thread order
};

inline Block g_block;
inline Thread* g_thread = nullptr;
inline fiber::Context g_scheduler;
inline std::function<void()> g_body;

}  // namespace cuda_host

// Built-in variables: per fiber (threadIdx) or per block.
#define threadIdx (static_cast<const uint3&>(::cuda_host::g_thread->idx))
#define blockIdx (static_cast<const uint3&>(::cuda_host::g_block.idx))
#define blockDim (static_cast<const dim3&>(::cuda_host::g_block.dim))
#define gridDim (static_cast<const dim3&>(::cuda_host::g_block.grid))

namespace cuda_host {

// ---------------------------------------------------------------------------------------------
// Dynamic shared memory: one arena of the largest size any current GPU allows a block (227 KiB
// with the opt-in), between canary bytes. The kernel's `extern __shared__ T name[]` is bound to it
// by CUDA_HOST_DYNAMIC_SHARED (the name is the kernel's, so the driver states it once).
inline constexpr std::size_t kMaxDynamicShared = 227 * 1024;
inline constexpr std::size_t kDefaultSharedLimit = 48 * 1024;  // without the opt-in attribute

alignas(64) inline thread_local unsigned char g_arena[kCanaryBytes + kMaxDynamicShared + kCanaryBytes] __asm__(
    "cuda_host_shared_arena");
inline std::size_t g_dynamic_shared = 0;  // bytes the current launch asked for
inline std::uint64_t g_garbage_seed = 0;

inline unsigned char* dynamic_shared() { return g_arena + kCanaryBytes; }
static_assert(kCanaryBytes == 64, "CUDA_HOST_DYNAMIC_SHARED places the kernel's array 64 bytes into the arena");

// Writes just outside either end: checked after every stretch a thread runs.
inline void check_shared_canaries() {
    const unsigned char* lo = dynamic_shared();
    std::size_t i = first_non_canary(lo - kQuickCanaryBytes, kQuickCanaryBytes);
    if (i < kQuickCanaryBytes)
        fail("out-of-bounds write to dynamic shared memory: %zu bytes before its start (%zu bytes this launch)",
             kQuickCanaryBytes - i, g_dynamic_shared);
    i = first_non_canary(lo + g_dynamic_shared, kQuickCanaryBytes);
    if (i < kQuickCanaryBytes)
        fail("out-of-bounds write to dynamic shared memory: byte %zu past its end (%zu bytes this launch)", i,
             g_dynamic_shared);
}

// Writes anywhere outside: checked after every block.
inline void check_shared_tail() {
    const std::size_t b = first_non_canary(g_arena, kCanaryBytes);
    if (b < kCanaryBytes)
        fail("out-of-bounds write to dynamic shared memory: %zu bytes before its start (%zu bytes this launch), by "
             "some thread of this block",
             kCanaryBytes - b, g_dynamic_shared);
    const std::size_t n = kMaxDynamicShared + kCanaryBytes - g_dynamic_shared;
    const std::size_t i = first_non_canary(dynamic_shared() + g_dynamic_shared, n);
    if (i < n)
        fail("out-of-bounds write to dynamic shared memory: byte %zu past its end (%zu bytes this launch), by "
             "some thread of this block",
             i, g_dynamic_shared);
}

// Shared memory starts undefined on a GPU: every block gets fresh garbage, so a kernel that reads
// before it writes gives wrong answers here too.
inline void fill_shared_garbage() {
    std::mt19937_64 rng(g_garbage_seed++);
    unsigned char* p = dynamic_shared();
    for (std::size_t i = 0; i < g_dynamic_shared; i += 8) {
        const std::uint64_t v = rng();
        std::memcpy(p + i, &v, std::min<std::size_t>(8, g_dynamic_shared - i));
    }
}

// ---------------------------------------------------------------------------------------------
// Scheduling.

inline void yield() { fiber::switch_to(g_thread->ctx, g_scheduler); }

inline void release_barrier() {
    for (unsigned i = 0; i < g_block.count; ++i)
        if (g_block.threads[i].state == State::AtBarrier) g_block.threads[i].state = State::Runnable;
    g_block.at_barrier = 0;
    g_block.released = true;
}

inline void syncthreads(int line) {
    Thread& t = *g_thread;
    if (g_block.at_barrier == 0)
        g_block.barrier_line = line;
    else if (line != g_block.barrier_line)
        fail("threads of one block wait at different __syncthreads calls (lines %d and %d)", g_block.barrier_line,
             line);
    t.state = State::AtBarrier;
    t.line = line;
    if (++g_block.at_barrier == g_block.live) release_barrier();
    yield();
}

[[noreturn]] inline void report_deadlock() {
    std::string waits;
    for (unsigned i = 0; i < g_block.count; ++i) {
        const Thread& t = g_block.threads[i];
        if (t.state == State::AtWarpOp) {
            const Warp& w = g_block.warps[t.warp];
            waits += "\n    thread " + std::to_string(t.linear) + " waits in " + op_name(w.op) + " (line " +
                     std::to_string(t.line) + ") for lanes " + std::to_string(std::popcount(w.mask & ~w.arrived)) +
                     " more of its mask";
        }
    }
    g_where.in_thread = false;
    fail("deadlock: %u of %u live threads wait at __syncthreads (line %d), the rest can never arrive%s",
         g_block.at_barrier, g_block.live, g_block.barrier_line, waits.c_str());
}

inline void thread_entry() {
    g_body();
    Thread& t = *g_thread;
    t.state = State::Done;
    --g_block.live;
    // A GPU stops counting exited threads at later barriers: so does this.
    if (g_block.live > 0 && g_block.at_barrier == g_block.live) release_barrier();
    yield();
    __builtin_unreachable();
}

inline bool shuffled(Order o) { return o == Order::Shuffle || o == Order::WarpsShuffle; }

inline std::vector<unsigned> make_order(unsigned n, Order order, std::mt19937_64& rng) {
    std::vector<unsigned> v(n);
    std::iota(v.begin(), v.end(), 0u);
    if (order == Order::Reverse || order == Order::WarpsReverse) std::reverse(v.begin(), v.end());
    if (shuffled(order)) std::shuffle(v.begin(), v.end(), rng);
    return v;
}

inline void set_thread_where(const Thread& t) {
    g_where.in_thread = true;
    g_where.thread[0] = t.idx.x;
    g_where.thread[1] = t.idx.y;
    g_where.thread[2] = t.idx.z;
}

// Runs thread t until it blocks or exits, then checks the canaries.
inline void run_stretch(Thread& t) {
    g_thread = &t;
    set_thread_where(t);
    fiber::switch_to(g_scheduler, t.ctx);
    check_shared_canaries();
    check_all_canaries(true);
    g_where.in_thread = false;
}

// Thread by thread: every runnable thread runs one stretch per sweep.
inline void sweep_threads(Order thread_order, std::mt19937_64& rng) {
    Block& b = g_block;
    const unsigned n = b.count;
    std::vector<unsigned> order = make_order(n, thread_order, rng);
    while (b.live > 0) {
        bool ran = false;
        for (std::size_t i = 0; i < n; ++i) {
            Thread& t = b.threads[order[i]];
            if (t.state != State::Runnable) continue;
            run_stretch(t);
            ran = true;
            if (b.released) {  // a new phase: run it in the chosen order from its first thread
                b.released = false;
                if (shuffled(thread_order)) std::shuffle(order.begin(), order.end(), rng);
                i = static_cast<std::size_t>(-1);
            }
        }
        if (!ran && b.live > 0) report_deadlock();
    }
}

// Warp by warp: after every barrier, each warp in turn runs until none of its threads can go on
// (all wait at the next barrier, or have exited); its lanes take turns, so its warp intrinsics
// complete. The warp that releases a barrier ends the phase: the next starts from the first warp.
inline void run_warps_ahead(Order thread_order, std::mt19937_64& rng) {
    Block& b = g_block;
    const unsigned n = b.count;
    const unsigned warps = static_cast<unsigned>(b.warps.size());
    std::vector<unsigned> warp_order = make_order(warps, thread_order, rng);
    std::vector<unsigned> lanes = make_order(32, thread_order, rng);
    while (b.live > 0) {
        bool ran = false, new_phase = false;
        for (std::size_t w = 0; w < warps && !new_phase; ++w) {
            const unsigned first = warp_order[w] * 32;
            for (bool progress = true; progress && !new_phase;) {
                progress = false;
                for (unsigned lane : lanes) {
                    if (first + lane >= n) continue;
                    Thread& t = b.threads[first + lane];
                    if (t.state != State::Runnable) continue;
                    run_stretch(t);
                    ran = progress = true;
                    if (b.released) {
                        b.released = false;
                        new_phase = true;
                        break;
                    }
                }
            }
        }
        if (new_phase) {
            if (shuffled(thread_order)) {
                std::shuffle(warp_order.begin(), warp_order.end(), rng);
                std::shuffle(lanes.begin(), lanes.end(), rng);
            }
            continue;
        }
        if (!ran && b.live > 0) report_deadlock();
    }
}

// Runs one block to completion.
inline void run_block(Order thread_order, std::mt19937_64& rng) {
    Block& b = g_block;
    const unsigned n = b.count;
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = b.threads[i];
        t.state = State::Runnable;
        fiber::make(t.ctx, t.stack, thread_entry);
    }
    for (Warp& w : b.warps) {
        w.arrived = 0;
        w.op = WarpOp::None;
    }
    b.live = n;
    b.at_barrier = 0;
    b.released = false;
    fill_shared_garbage();
    if (by_warps(thread_order))
        run_warps_ahead(thread_order, rng);
    else
        sweep_threads(thread_order, rng);
    g_thread = nullptr;
    check_shared_tail();
    check_all_canaries(false);
}

// ---------------------------------------------------------------------------------------------
// Launch.

struct LaunchConfig {
    std::string kernel;
    std::string label;
    dim3 grid, block;
    std::size_t dynamic_shared = 0;
    std::size_t shared_optin = 0;   // the kernel's max_dynamic_shared_size_bytes; 0: not raised
    std::size_t static_shared = 0;  // the kernel's static shared memory, as the launcher counted it
    Order block_order = Order::Forward;
    Order thread_order = Order::Forward;
    std::uint64_t seed = 0;
};

inline void launch(const LaunchConfig& cfg, std::function<void()> body) {
    g_where = Where{};
    g_where.kernel = cfg.kernel;
    g_where.label = cfg.label;
    const std::uint64_t threads = std::uint64_t(cfg.block.x) * cfg.block.y * cfg.block.z;
    if (threads == 0 || threads > 1024) fail("invalid block (%u,%u,%u): 1 to 1024 threads", cfg.block.x, cfg.block.y, cfg.block.z);
    if (cfg.block.z > 64) fail("invalid block: blockDim.z %u > 64", cfg.block.z);
    if (cfg.grid.x == 0 || cfg.grid.y == 0 || cfg.grid.z == 0 || cfg.grid.x > 0x7fffffffu || cfg.grid.y > 65535 ||
        cfg.grid.z > 65535)
        fail("invalid grid (%u,%u,%u): x up to 2^31-1, y and z up to 65535", cfg.grid.x, cfg.grid.y, cfg.grid.z);
    // As on a GPU: static + dynamic shared memory up to 48 KiB by default; above, the dynamic part
    // must be allowed with the opt-in attribute, which the device caps (227 KiB here, the largest).
    const std::size_t total = cfg.dynamic_shared + cfg.static_shared;
    if (cfg.shared_optin == 0 && total > kDefaultSharedLimit)
        fail("launch needs %zu bytes of shared memory (%zu dynamic + %zu static) without the opt-in "
             "max_dynamic_shared_size_bytes; the default limit is %zu",
             total, cfg.dynamic_shared, cfg.static_shared, kDefaultSharedLimit);
    if (cfg.shared_optin != 0 && cfg.dynamic_shared > cfg.shared_optin)
        fail("launch asks for %zu bytes of dynamic shared memory; the kernel was allowed %zu", cfg.dynamic_shared,
             cfg.shared_optin);
    if (cfg.shared_optin + cfg.static_shared > kMaxDynamicShared || total > kMaxDynamicShared)
        fail("%zu bytes of dynamic (allowed %zu) + %zu static shared memory: no GPU allows more than %zu per block",
             cfg.dynamic_shared, cfg.shared_optin, cfg.static_shared, kMaxDynamicShared);
    g_dynamic_shared = cfg.dynamic_shared;
    std::memset(g_arena, kCanary, sizeof g_arena);
    g_garbage_seed = cfg.seed * 0x9E3779B97F4A7C15ull;
    g_body = std::move(body);

    Block& b = g_block;
    b.dim = cfg.block;
    b.grid = cfg.grid;
    const unsigned n = static_cast<unsigned>(threads);
    if (b.threads.size() < n) {  // stacks are kept for later launches
        const std::size_t old = b.threads.size();
        b.threads.resize(n);
        for (std::size_t i = old; i < n; ++i) {
            b.threads[i].stack.allocate(256 * 1024);
            named_ranges().push_back({b.threads[i].stack.guard, page_size(), "stack overflow of a CUDA thread"});
        }
    }
    b.count = n;
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = b.threads[i];
        t.linear = i;
        t.idx = uint3{i % cfg.block.x, (i / cfg.block.x) % cfg.block.y, i / (cfg.block.x * cfg.block.y)};
        t.lane = i % 32;
        t.warp = i / 32;
    }
    b.warps.assign((n + 31) / 32, Warp{});
    for (unsigned i = 0; i < n; ++i) b.warps[i / 32].exists |= 1u << (i % 32);

    std::mt19937_64 rng(cfg.seed);
    const std::uint64_t blocks = std::uint64_t(cfg.grid.x) * cfg.grid.y * cfg.grid.z;
    if (blocks > (1ull << 32)) fail("grid of %llu blocks is too large to emulate", (unsigned long long)blocks);
    std::vector<unsigned> order = make_order(static_cast<unsigned>(blocks), cfg.block_order, rng);
    for (unsigned linear : order) {
        b.idx = uint3{linear % cfg.grid.x, (linear / cfg.grid.x) % cfg.grid.y, linear / (cfg.grid.x * cfg.grid.y)};
        g_where.in_block = true;
        g_where.block[0] = b.idx.x;
        g_where.block[1] = b.idx.y;
        g_where.block[2] = b.idx.z;
        run_block(cfg.thread_order, rng);
    }
    g_where.in_block = false;
}

// ---------------------------------------------------------------------------------------------
// Warp intrinsics.

template <class T>
std::uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
    std::uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}

template <class T>
T from_bits(std::uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

// The last lane of the mask to arrive computes every lane's result.
inline void warp_compute(Warp& w) {
    const int width = w.width;
    for (unsigned lane = 0; lane < 32; ++lane) {
        if (!(w.mask >> lane & 1u)) continue;
        const int seg = static_cast<int>(lane) & ~(width - 1);  // first lane of this lane's segment
        const int pos = static_cast<int>(lane) & (width - 1);
        int src = static_cast<int>(lane);
        switch (w.op) {
            case WarpOp::ShflIdx: src = seg + (w.arg[lane] & (width - 1)); break;
            case WarpOp::ShflUp: src = pos >= w.arg[lane] ? static_cast<int>(lane) - w.arg[lane] : static_cast<int>(lane); break;
            case WarpOp::ShflDown: src = pos + w.arg[lane] < width ? static_cast<int>(lane) + w.arg[lane] : static_cast<int>(lane); break;
            case WarpOp::ShflXor: {
                const int x = static_cast<int>(lane) ^ w.arg[lane];
                src = (x >= seg && x < seg + width) ? x : static_cast<int>(lane);
                break;
            }
            default: break;
        }
        switch (w.op) {
            case WarpOp::ShflIdx: case WarpOp::ShflUp: case WarpOp::ShflDown: case WarpOp::ShflXor:
                if (!(w.mask >> src & 1u))
                    fail("%s (line %d): lane %u reads lane %d, which is outside the mask 0x%08x", op_name(w.op), w.line,
                         lane, src, w.mask);
                w.out[lane] = w.in[src];
                break;
            case WarpOp::Ballot: case WarpOp::Any: case WarpOp::All: {
                unsigned votes = 0;
                for (unsigned l = 0; l < 32; ++l)
                    if ((w.mask >> l & 1u) && w.in[l]) votes |= 1u << l;
                w.out[lane] = w.op == WarpOp::Ballot ? votes : w.op == WarpOp::Any ? votes != 0 : votes == w.mask;
                break;
            }
            default: w.out[lane] = 0; break;
        }
    }
}

inline std::uint64_t warp_collective(WarpOp op, int line, unsigned mask, std::uint64_t value, int arg, int width) {
    Thread& t = *g_thread;
    Warp& w = g_block.warps[t.warp];
    if (!(mask >> t.lane & 1u))
        fail("%s (line %d) called by lane %u, which is not in its mask 0x%08x", op_name(op), line, t.lane, mask);
    if (mask & ~w.exists)
        fail("%s (line %d): mask 0x%08x names lanes that are not threads of this block (warp %u has 0x%08x)",
             op_name(op), line, mask, t.warp, w.exists);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s (line %d): width %d is not a power of two up to 32", op_name(op), line, width);
    if (w.arrived == 0) {
        w.op = op;
        w.mask = mask;
        w.width = width;
        w.line = line;
    } else if (w.op != op || w.mask != mask || w.width != width) {
        fail("lanes of warp %u meet at different warp intrinsics: %s (line %d, mask 0x%08x) and %s (line %d, mask "
             "0x%08x)",
             t.warp, op_name(w.op), w.line, w.mask, op_name(op), line, mask);
    }
    w.in[t.lane] = value;
    w.arg[t.lane] = arg;
    w.arrived |= 1u << t.lane;
    t.state = State::AtWarpOp;
    t.line = line;
    if (w.arrived == w.mask) {
        warp_compute(w);
        w.arrived = 0;
        for (unsigned lane = 0; lane < 32; ++lane)
            if (w.mask >> lane & 1u) g_block.threads[t.warp * 32 + lane].state = State::Runnable;
    }
    yield();
    return w.out[t.lane];
}

template <class T>
T shfl(WarpOp op, int line, unsigned mask, T var, int arg, int width = 32) {
    return from_bits<T>(warp_collective(op, line, mask, to_bits(var), arg, width));
}

}  // namespace cuda_host

// The intrinsics are macros so that a report can name the source line.
#define __shfl_sync(mask, var, ...) ::cuda_host::shfl(::cuda_host::WarpOp::ShflIdx, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_up_sync(mask, var, ...) ::cuda_host::shfl(::cuda_host::WarpOp::ShflUp, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_down_sync(mask, var, ...) ::cuda_host::shfl(::cuda_host::WarpOp::ShflDown, __LINE__, mask, var, __VA_ARGS__)
#define __shfl_xor_sync(mask, var, ...) ::cuda_host::shfl(::cuda_host::WarpOp::ShflXor, __LINE__, mask, var, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    static_cast<unsigned>(::cuda_host::warp_collective(::cuda_host::WarpOp::Ballot, __LINE__, mask, (pred) ? 1 : 0, 0, 32))
#define __any_sync(mask, pred) \
    static_cast<int>(::cuda_host::warp_collective(::cuda_host::WarpOp::Any, __LINE__, mask, (pred) ? 1 : 0, 0, 32))
#define __all_sync(mask, pred) \
    static_cast<int>(::cuda_host::warp_collective(::cuda_host::WarpOp::All, __LINE__, mask, (pred) ? 1 : 0, 0, 32))
#define __syncwarp(...) ::cuda_host::syncwarp(__LINE__, ##__VA_ARGS__)
#define __syncthreads() ::cuda_host::syncthreads(__LINE__)

namespace cuda_host {
inline void syncwarp(int line, unsigned mask = 0xffffffffu) {
    warp_collective(WarpOp::SyncWarp, line, mask, 0, 0, 32);
}
}  // namespace cuda_host

// ---------------------------------------------------------------------------------------------
// Atomics: fibers never run at the same time, so a plain read-modify-write is atomic.
template <class T>
T atomicAdd(T* p, std::type_identity_t<T> v) { T old = *p; *p = old + v; return old; }
template <class T>
T atomicSub(T* p, std::type_identity_t<T> v) { T old = *p; *p = old - v; return old; }
template <class T>
T atomicMax(T* p, std::type_identity_t<T> v) { T old = *p; *p = old < v ? v : old; return old; }
template <class T>
T atomicMin(T* p, std::type_identity_t<T> v) { T old = *p; *p = v < old ? v : old; return old; }
template <class T>
T atomicExch(T* p, std::type_identity_t<T> v) { T old = *p; *p = v; return old; }
template <class T>
T atomicOr(T* p, std::type_identity_t<T> v) { T old = *p; *p = old | v; return old; }
template <class T>
T atomicAnd(T* p, std::type_identity_t<T> v) { T old = *p; *p = old & v; return old; }
template <class T>
T atomicCAS(T* p, std::type_identity_t<T> compare, std::type_identity_t<T> v) {
    T old = *p;
    if (old == compare) *p = v;
    return old;
}

// ---------------------------------------------------------------------------------------------
// Bit manipulation and reinterpretation.
inline int __popc(unsigned int x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
template <class T>
T __ldg(const T* p) { return *p; }

// The symbol every kernel's `extern __shared__` array is bound to: the arena, past its leading canary.
__asm__(".globl cuda_host_dynamic_shared\n"
        ".type cuda_host_dynamic_shared, @tls_object\n"
        ".set cuda_host_dynamic_shared, cuda_host_shared_arena + 64\n");

// Binds the kernel source's `extern __shared__ ... NAME[]` (declared inside namespace NS) to the
// emulator's arena. Use before including the kernel source, once per namespace it is included in.
// -fno-extern-tls-init tells g++ that this thread_local needs no dynamic initialisation (it is an
// alias, defined in assembly).
#define CUDA_HOST_DYNAMIC_SHARED(NS, NAME) \
    namespace NS {                         \
    extern thread_local __attribute__((aligned(16))) unsigned char NAME[] __asm__("cuda_host_dynamic_shared"); \
    }
