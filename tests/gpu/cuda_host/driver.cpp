// driver.cpp: runs kernel launches described on stdin on the CPU (cuda_host.h) and writes the
// output arrays to stdout. tests/test_kernels_host.py builds and drives it:
//
//   g++ -std=c++20 -O2 -fno-extern-tls-init -fsanitize=bounds -include cuda_host.h
//       -DKERNEL_SOURCE='"kernels/select_topk.cu"' -DKERNEL_TABLE='"kernel_table.inc"' driver.cpp
//
// KERNEL_TABLE lists the instantiations to run, one `{"name", bind(&name)},` line each; the test
// writes it from ksae_cupy's list of kernel names, so the driver can run every kernel the
// launchers can choose and nothing else.
//
// One request per launch, text lines, each array followed by its raw bytes:
//   launch <kernel name as listed>
//   label <case description, for reports>
//   grid <x> <y> <z>
//   block <x> <y> <z>
//   shared <dynamic bytes> <opt-in bytes, 0 if not raised> <static bytes the launcher counted>
//   order <forward|reverse|shuffle for blocks> <same, or warps-forward|warps-reverse|warps-shuffle,
//         for threads> <seed>
//   array <float32|float64|int32|int64|uint32> <count> <in|out> <start|end>   + count*itemsize bytes
//   scalar <dtype> <value>
//   go
// The arrays and scalars are the kernel's arguments in order; each is checked against the
// parameter's C++ type (an int64 scalar for an `int` parameter is an error, as it would be a wrong
// argument on a GPU). Every array lives in a GuardedBuffer placed against the guard page at its
// start or its end. Answer: "done <bytes>\n" and the final contents of the `out` arrays, in order.
// Any fault of the kernel ends the process with a "cuda_host: ..." report on stderr (status 70).
#include <cinttypes>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <tuple>

CUDA_HOST_DYNAMIC_SHARED(ksae, smem_raw)
#include KERNEL_SOURCE

namespace driver {

using cuda_host::fail;

struct Arg {
    std::string dtype;
    bool is_array = false;
    bool is_out = false;
    std::unique_ptr<cuda_host::GuardedBuffer> buffer;
    std::int64_t ivalue = 0;
    double fvalue = 0;
};

template <class T>
constexpr const char* dtype_of() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return "float32";
    else if constexpr (std::is_same_v<U, double>) return "float64";
    else if constexpr (std::is_same_v<U, int>) return "int32";
    else if constexpr (std::is_same_v<U, unsigned int>) return "uint32";
    else if constexpr (std::is_same_v<U, long long>) return "int64";
    else static_assert(sizeof(U) == 0, "add this parameter type to dtype_of");
}

inline std::size_t itemsize(const std::string& dtype) {
    if (dtype == "float32" || dtype == "int32" || dtype == "uint32") return 4;
    if (dtype == "float64" || dtype == "int64") return 8;
    fail("unknown dtype %s in the request", dtype.c_str());
}

// The i-th argument as the kernel's i-th parameter type P, or a report of the mismatch.
template <class P>
P take(std::vector<Arg>& args, std::size_t i) {
    Arg& a = args[i];
    if constexpr (std::is_pointer_v<P>) {
        using E = std::remove_pointer_t<P>;
        if (!a.is_array) fail("argument %zu: the kernel takes a pointer, the launcher passes a %s scalar", i, a.dtype.c_str());
        if (a.dtype != dtype_of<E>())
            fail("argument %zu: the kernel takes %s*, the launcher passes a %s array", i, dtype_of<E>(), a.dtype.c_str());
        return reinterpret_cast<P>(a.buffer->data());
    } else {
        if (a.is_array) fail("argument %zu: the kernel takes a %s scalar, the launcher passes an array", i, dtype_of<P>());
        if (a.dtype != dtype_of<P>())
            fail("argument %zu: the kernel takes %s, the launcher passes %s", i, dtype_of<P>(), a.dtype.c_str());
        if constexpr (std::is_floating_point_v<P>) return static_cast<P>(a.fvalue);
        else return static_cast<P>(a.ivalue);
    }
}

using Runner = std::function<void(const cuda_host::LaunchConfig&, std::vector<Arg>&)>;

template <class... P, std::size_t... I>
std::tuple<P...> take_all(std::vector<Arg>& args, std::index_sequence<I...>) {
    return std::tuple<P...>{take<P>(args, I)...};
}

template <class... P>
Runner bind(void (*kernel)(P...)) {
    return [kernel](const cuda_host::LaunchConfig& cfg, std::vector<Arg>& args) {
        if (args.size() != sizeof...(P))
            fail("the kernel takes %zu arguments, the launcher passes %zu", sizeof...(P), args.size());
        const std::tuple<P...> values = take_all<P...>(args, std::index_sequence_for<P...>{});
        cuda_host::launch(cfg, [&] { std::apply(kernel, values); });
    };
}

const std::map<std::string, Runner>& kernels() {
    static const std::map<std::string, Runner> table = {
#include KERNEL_TABLE
    };
    return table;
}

cuda_host::Order parse_order(const std::string& s) {
    if (s == "forward") return cuda_host::Order::Forward;
    if (s == "reverse") return cuda_host::Order::Reverse;
    if (s == "shuffle") return cuda_host::Order::Shuffle;
    if (s == "warps-forward") return cuda_host::Order::WarpsForward;
    if (s == "warps-reverse") return cuda_host::Order::WarpsReverse;
    if (s == "warps-shuffle") return cuda_host::Order::WarpsShuffle;
    fail("unknown order %s", s.c_str());
}

void read_exact(void* p, std::size_t n) {
    if (n && std::fread(p, 1, n, stdin) != n) fail("request truncated");
}

// Reads one request; false at the end of input.
bool serve_one() {
    cuda_host::LaunchConfig cfg;
    std::vector<Arg> args;
    std::string name;
    char linebuf[4096];
    bool started = false;
    for (;;) {
        if (!std::fgets(linebuf, sizeof linebuf, stdin)) {
            if (!started) return false;
            fail("request truncated");
        }
        started = true;
        std::string line(linebuf);
        if (!line.empty() && line.back() == '\n') line.pop_back();
        const std::size_t sp = line.find(' ');
        const std::string key = line.substr(0, sp);
        const std::string rest = sp == std::string::npos ? "" : line.substr(sp + 1);
        std::istringstream in(rest);
        if (key == "launch") {
            name = rest;
        } else if (key == "label") {
            cfg.label = rest;
        } else if (key == "grid") {
            in >> cfg.grid.x >> cfg.grid.y >> cfg.grid.z;
        } else if (key == "block") {
            in >> cfg.block.x >> cfg.block.y >> cfg.block.z;
        } else if (key == "shared") {
            in >> cfg.dynamic_shared >> cfg.shared_optin >> cfg.static_shared;
        } else if (key == "order") {
            std::string b, t;
            in >> b >> t >> cfg.seed;
            cfg.block_order = parse_order(b);
            cfg.thread_order = parse_order(t);
        } else if (key == "array") {
            Arg a;
            std::size_t count = 0;
            std::string role, place;
            in >> a.dtype >> count >> role >> place;
            a.is_array = true;
            a.is_out = role == "out";
            const std::size_t bytes = count * itemsize(a.dtype);
            a.buffer = std::make_unique<cuda_host::GuardedBuffer>(
                "argument " + std::to_string(args.size()) + " (" + a.dtype + "[" + std::to_string(count) + "])", bytes,
                place == "end");
            a.buffer->watch(a.is_out);
            read_exact(a.buffer->data(), bytes);
            args.push_back(std::move(a));
        } else if (key == "scalar") {
            Arg a;
            std::string value;
            in >> a.dtype >> value;
            if (a.dtype.rfind("float", 0) == 0) a.fvalue = std::stod(value);
            else a.ivalue = std::stoll(value);
            args.push_back(std::move(a));
        } else if (key == "go") {
            break;
        } else {
            fail("unknown request line: %s", line.c_str());
        }
    }
    const auto& table = kernels();
    const auto it = table.find(name);
    if (it == table.end()) fail("kernel %s is not in the driver's table", name.c_str());
    cfg.kernel = name;
    it->second(cfg, args);
    std::size_t total = 0;
    for (const Arg& a : args)
        if (a.is_out) total += a.buffer->size();
    std::printf("done %zu\n", total);
    for (Arg& a : args)
        if (a.is_out) std::fwrite(a.buffer->data(), 1, a.buffer->size(), stdout);
    std::fflush(stdout);
    return true;
}

}  // namespace driver

// The bounds sanitizer of static shared arrays prints its report, then aborts: the fault handler
// adds the kernel, case and thread.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:print_stacktrace=0"; }

int main() {
    cuda_host::install_fault_handler();
    while (driver::serve_one()) {
    }
    return 0;
}
