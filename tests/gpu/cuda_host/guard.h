// Bounds-checked memory for the CUDA emulation: buffers fenced by inaccessible pages and canary
// bytes, and the fault handler that turns a stray access into a report naming the kernel, the case
// and the CUDA thread (instead of a silent corruption or a bare "Segmentation fault").
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cuda_host {

// Who is running: filled in by the launcher (cuda_host.h), read by every report.
struct Where {
    std::string kernel = "(no kernel)";
    std::string label = "(no case)";
    unsigned block[3] = {0, 0, 0};
    unsigned thread[3] = {0, 0, 0};
    bool in_block = false;
    bool in_thread = false;
};
inline Where g_where;

inline void print_where() {
    std::fprintf(stderr, "  kernel %s, case %s", g_where.kernel.c_str(), g_where.label.c_str());
    if (g_where.in_block)
        std::fprintf(stderr, ", block (%u,%u,%u)", g_where.block[0], g_where.block[1], g_where.block[2]);
    if (g_where.in_thread)
        std::fprintf(stderr, ", thread (%u,%u,%u)", g_where.thread[0], g_where.thread[1], g_where.thread[2]);
    std::fprintf(stderr, "\n");
}

// Every error of the emulation ends here: one "cuda_host: ..." line, the context, exit status 70.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char* fmt, ...) {
    std::fflush(stdout);
    std::fprintf(stderr, "cuda_host: ");
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "\n");
    print_where();
    std::fflush(stderr);
    _exit(70);
}

inline constexpr unsigned char kCanary = 0xA5;
inline constexpr std::size_t kCanaryBytes = 64;
inline constexpr std::size_t kQuickCanaryBytes = 16;  // checked after every stretch a thread runs

inline std::size_t page_size() {
    static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

// Index of the first byte in [p, p + n) that is not the canary, or n. Runs after every stretch
// of every CUDA thread, so the common case (intact) is one memcmp per 64 bytes.
inline std::size_t first_non_canary(const unsigned char* p, std::size_t n) {
    static const auto block = [] {
        std::array<unsigned char, kCanaryBytes> b;
        b.fill(kCanary);
        return b;
    }();
    std::size_t i = 0;
    if (n == kQuickCanaryBytes) {  // the hot case: two 8-byte compares
        std::uint64_t w[2];
        std::memcpy(w, p, sizeof w);
        if (w[0] == 0xA5A5A5A5A5A5A5A5ull && w[1] == 0xA5A5A5A5A5A5A5A5ull) return n;
    }
    for (; i + kCanaryBytes <= n; i += kCanaryBytes)
        if (std::memcmp(p + i, block.data(), kCanaryBytes) != 0) break;
    for (; i < n; ++i)
        if (p[i] != kCanary) return i;
    return n;
}

// A buffer of `bytes` in its own mapping: [guard page][gap][data][gap][guard page]. The data
// touches one guard page (the end one, or the start one: the harness alternates, so both overruns
// and underruns fault somewhere), the gap on the other side is filled with canary bytes that
// check_canaries() compares after every stretch a CUDA thread runs.
class GuardedBuffer {
public:
    GuardedBuffer(std::string name, std::size_t bytes, bool data_at_end) : name_(std::move(name)), bytes_(bytes) {
        const std::size_t page = page_size();
        inner_ = (bytes + kCanaryBytes + page - 1) / page * page;
        map_size_ = inner_ + 2 * page;
        void* p = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) fail("cannot map %zu bytes for %s", map_size_, name_.c_str());
        base_ = static_cast<unsigned char*>(p);
        if (mprotect(base_, page, PROT_NONE) != 0 || mprotect(base_ + page + inner_, page, PROT_NONE) != 0)
            fail("cannot protect the guard pages of %s", name_.c_str());
        unsigned char* lo = base_ + page;
        data_ = data_at_end ? lo + inner_ - bytes : lo;
        std::memset(lo, kCanary, inner_);
        registry().push_back(this);
    }
    ~GuardedBuffer() {
        auto& r = registry();
        r.erase(std::remove(r.begin(), r.end(), this), r.end());
        munmap(base_, map_size_);
    }
    GuardedBuffer(const GuardedBuffer&) = delete;
    GuardedBuffer& operator=(const GuardedBuffer&) = delete;

    unsigned char* data() { return data_; }
    std::size_t size() const { return bytes_; }
    const std::string& name() const { return name_; }

    // Reports (and exits) if a canary byte next to the data changed: the 16 bytes nearest to it
    // (`quick`: after every stretch a thread runs) or the whole gap (after every block).
    void check_canaries(bool quick) const {
        if (!watched_) return;
        const unsigned char* lo = base_ + page_size();
        const std::size_t before = static_cast<std::size_t>(data_ - lo);
        const std::size_t after = inner_ - before - bytes_;
        const std::size_t limit = quick ? kQuickCanaryBytes : inner_;
        const std::size_t b = std::min(before, limit), a = std::min(after, limit);
        const std::size_t i = first_non_canary(data_ - b, b);
        if (i < b) fail("out-of-bounds write: %zu bytes before the start of %s (%zu bytes)", b - i, name_.c_str(), bytes_);
        const std::size_t j = first_non_canary(data_ + bytes_, a);
        if (j < a) fail("out-of-bounds write: byte %zu past the end of %s (%zu bytes)", j, name_.c_str(), bytes_);
    }

    // Inputs need no canary checks (a write to them faults on a guard page or is caught by the
    // kernel's const parameters); outputs do.
    void watch(bool on) { watched_ = on; }

    // For the fault handler: a sentence naming where `addr` lies relative to this buffer, if in
    // one of its guard pages or gaps.
    bool describe(const void* addr, char* out, std::size_t n) const {
        const auto* a = static_cast<const unsigned char*>(addr);
        if (a < base_ || a >= base_ + map_size_) return false;
        if (a < data_)
            std::snprintf(out, n, "%zu bytes before the start of %s (%zu bytes)", static_cast<std::size_t>(data_ - a),
                          name_.c_str(), bytes_);
        else
            std::snprintf(out, n, "byte %zu past the end of %s (%zu bytes)",
                          static_cast<std::size_t>(a - (data_ + bytes_)), name_.c_str(), bytes_);
        return true;
    }

    static std::vector<GuardedBuffer*>& registry() {
        static std::vector<GuardedBuffer*> r;
        return r;
    }

private:
    std::string name_;
    std::size_t bytes_ = 0, inner_ = 0, map_size_ = 0;
    unsigned char* base_ = nullptr;
    unsigned char* data_ = nullptr;
    bool watched_ = true;
};

inline void check_all_canaries(bool quick) {
    for (const GuardedBuffer* b : GuardedBuffer::registry()) b->check_canaries(quick);
}

// Extra address ranges the fault handler can name (fiber stacks' guard pages).
struct NamedRange {
    const void* lo;
    std::size_t size;
    const char* what;
};
inline std::vector<NamedRange>& named_ranges() {
    static std::vector<NamedRange> r;
    return r;
}

// SIGSEGV/SIGBUS: name the buffer and the thread; SIGABRT (the bounds sanitizer of static arrays,
// or an assert) and SIGFPE: add the context to what was already printed.
inline void fault_handler(int sig, siginfo_t* info, void*) {
    char what[256];
    bool named = false;
    if (sig == SIGSEGV || sig == SIGBUS) {
        for (const GuardedBuffer* b : GuardedBuffer::registry())
            if (b->describe(info->si_addr, what, sizeof what)) {
                named = true;
                break;
            }
        if (!named)
            for (const NamedRange& r : named_ranges()) {
                const auto* a = static_cast<const unsigned char*>(info->si_addr);
                const auto* lo = static_cast<const unsigned char*>(r.lo);
                if (a >= lo && a < lo + r.size) {
                    std::snprintf(what, sizeof what, "%s", r.what);
                    named = true;
                    break;
                }
            }
        if (!named) std::snprintf(what, sizeof what, "address %p, in no buffer of the harness", info->si_addr);
        std::fprintf(stderr, "cuda_host: out-of-bounds access: %s\n", what);
    } else {
        std::fprintf(stderr, "cuda_host: %s\n", strsignal(sig));
    }
    print_where();
    std::fflush(stderr);
    _exit(70);
}

inline void install_fault_handler() {
    static std::vector<unsigned char> alt(1 << 16);  // the handler may run on an overflowed stack
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = fault_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

}  // namespace cuda_host
