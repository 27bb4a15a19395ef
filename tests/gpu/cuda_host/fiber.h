// Fibers: cooperative threads on one host thread, each with its own stack, switched explicitly.
//
// The CUDA emulation (cuda_host.h) runs every CUDA thread of a block as a fiber. A block of 512
// threads switches context hundreds of thousands of times per row (at every __syncthreads and every
// warp shuffle), so the switch must be cheap: glibc's swapcontext makes a system call per switch
// (~350 ns here), the few instructions below take a few ns. Other architectures, or
// -DCUDA_HOST_UCONTEXT, fall back to swapcontext: slower, same behaviour.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if !defined(__x86_64__) && !defined(CUDA_HOST_UCONTEXT)
#define CUDA_HOST_UCONTEXT 1
#endif
#ifdef CUDA_HOST_UCONTEXT
#include <ucontext.h>
#endif

namespace cuda_host::fiber {

// A stack from mmap with one inaccessible page below it, so an overflow faults instead of
// overwriting the neighbouring fiber's stack.
struct Stack {
    unsigned char* guard = nullptr;  // the inaccessible page
    unsigned char* lo = nullptr;     // lowest usable byte
    std::size_t size = 0;            // usable bytes

    void allocate(std::size_t bytes) {
        const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        size = (bytes + page - 1) / page * page;
        void* p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) {
            std::perror("cuda_host: fiber stack");
            std::exit(70);
        }
        guard = static_cast<unsigned char*>(p);
        lo = guard + page;
    }
    bool contains_guard(const void* addr, std::size_t page) const {
        const auto* a = static_cast<const unsigned char*>(addr);
        return guard && a >= guard && a < guard + page;
    }
};

#ifndef CUDA_HOST_UCONTEXT

// Saved state of a suspended fiber: its stack pointer; everything else is on its stack.
struct Context {
    void* sp = nullptr;
};

extern "C" void cuda_host_fiber_switch(void** save_sp, void* load_sp);

// System V x86-64: push the callee-saved registers and the SSE/x87 control words on the current
// stack, store the stack pointer, load the other one, pop in reverse order, return into the other
// fiber. Caller-saved registers need no saving: the switch is an ordinary function call.
asm(R"(
    .text
    .globl cuda_host_fiber_switch
    .type cuda_host_fiber_switch, @function
cuda_host_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_host_fiber_switch, .-cuda_host_fiber_switch
)");

inline void switch_to(Context& from, Context& to) { cuda_host_fiber_switch(&from.sp, to.sp); }

// Lays out a frame on `stack` that cuda_host_fiber_switch "returns" into: `entry` starts with the
// stack aligned as after a call (rsp % 16 == 8) and must never return.
inline void make(Context& ctx, Stack& stack, void (*entry)()) {
    auto* top = reinterpret_cast<std::uintptr_t*>(
        (reinterpret_cast<std::uintptr_t>(stack.lo + stack.size)) & ~std::uintptr_t(15));
    *--top = 0;                                              // fake return address of entry
    *--top = reinterpret_cast<std::uintptr_t>(entry);        // popped by ret
    for (int i = 0; i < 6; ++i) *--top = 0;                  // rbp rbx r12 r13 r14 r15
    *--top = 0x1F80u | (std::uintptr_t(0x037Fu) << 32);      // default MXCSR, x87 control word
    ctx.sp = top;
}

#else  // portable fallback

struct Context {
    ucontext_t uc;
};

inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

inline void make(Context& ctx, Stack& stack, void (*entry)()) {
    getcontext(&ctx.uc);
    ctx.uc.uc_stack.ss_sp = stack.lo;
    ctx.uc.uc_stack.ss_size = stack.size;
    ctx.uc.uc_link = nullptr;
    makecontext(&ctx.uc, entry, 0);
}

#endif

}  // namespace cuda_host::fiber
