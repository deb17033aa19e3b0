// An inference engine's skeleton in C++17 that owns main() and embeds the Guild host through
// libguild_host (guild/guild_host.hpp over guild/guild_host.h). It opens a store as a runner,
// resolves the example scan (`example.sequence.inclusive_scan`, provided by the example.scan
// module), executes it, reshapes it for new lengths, and, with --serve, keeps serving requests
// while an operator installs, rolls back or revokes versions: a watcher refreshes the host when
// the store changes, and before each request the engine checks that its handle is still current,
// resolving anew when it is not.
//
//   guild_engine STORE                            one request of 4, then reshaped to 8
//   guild_engine --serve [--interval-ms N] STORE  a request every N ms (default 100) until killed
//
// Each request prints "request K: n=LEN sum=S from example.scan@VERSION ok".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "guild/guild_host.hpp"

namespace {

guild_tensor_desc_v1_t vector_of(uint64_t n, float* data) {
    guild_tensor_desc_v1_t t{};
    t.dtype = GUILD_DTYPE_F32;
    t.rank = 1;
    t.dims[0] = n;
    t.memory_space = GUILD_MEMORY_HOST;
    t.data = data;
    return t;
}

// Resolves the inclusive scan for vectors of n elements, any 1.x version, on the CPU.
guild::OpHandle resolve_scan(const guild::Host& host, uint64_t n) {
    guild_tensor_desc_v1_t in = vector_of(n, nullptr), out = vector_of(n, nullptr);
    guild_operation_query_v1_t q{};
    q.struct_size = sizeof q;
    q.version = GUILD_OPERATION_QUERY_VERSION;
    q.op_name = "example.sequence.inclusive_scan";
    q.min_op_version = GUILD_MAKE_ABI_VERSION(1, 0, 0);
    q.max_op_version = GUILD_MAKE_ABI_VERSION(1, 4095, 4095);
    q.backends = GUILD_BACKEND_CPU;
    q.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    q.inputs = &in;
    q.input_count = 1;
    q.outputs = &out;
    q.output_count = 1;
    q.ram_budget = GUILD_BUDGET_UNLIMITED;
    q.vram_budget = GUILD_BUDGET_UNLIMITED;
    return host.resolve(q);
}

void reshape(const guild::OpHandle& scan, uint64_t n) {
    guild_tensor_desc_v1_t in = vector_of(n, nullptr), out = vector_of(n, nullptr);
    guild_reshape_args_v1_t r{};
    r.struct_size = sizeof r;
    r.inputs = &in;
    r.input_count = 1;
    r.outputs = &out;
    r.output_count = 1;
    scan.reshape(r);
}

// Runs the scan over 1, 2, ..., n and answers the last prefix sum.
float run(const guild::OpHandle& scan, uint64_t n) {
    std::vector<float> input(n), output(n);
    for (uint64_t i = 0; i < n; ++i) {
        input[i] = float(i + 1);
    }
    guild_tensor_desc_v1_t in = vector_of(n, input.data()), out = vector_of(n, output.data());
    guild_execute_args_v1_t a{};
    a.struct_size = sizeof a;
    a.inputs = &in;
    a.input_count = 1;
    a.outputs = &out;
    a.output_count = 1;
    a.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    scan.execute(a);
    return output[n - 1];
}

void log_to_stderr(void*, const char* package, uint32_t level, const char* message) {
    std::fprintf(stderr, "[%s level %u] %s\n", package, level, message);
}

// The engine's serving state: the handle it keeps between requests and the length it was
// negotiated for.
struct Serving {
    guild::OpHandle scan;
    uint64_t length = 0;
    std::string provider;
};

void request(const guild::Host& host, Serving& s, uint64_t k, uint64_t n) {
    try {
        if (s.scan && !host.info(s.scan).current) {
            // A new version, a rollback or a revocation. The switch waits for the handles into
            // the old version: release ours, let the host make the switch now, resolve again.
            s.scan.reset();
            host.refresh();
        }
        if (!s.scan) {
            s.scan = resolve_scan(host, n);
            s.length = n;
            guild::HandleInfo info = host.info(s.scan);
            s.provider = info.package_id + "@" + info.package_version;
        } else if (s.length != n) {
            reshape(s.scan, n);
            s.length = n;
        }
        float sum = run(s.scan, n);
        std::cout << "request " << k << ": n=" << n << " sum=" << sum << " from " << s.provider << " ok"
                  << std::endl;
    } catch (const guild::Error& e) {
        s.scan.reset();
        std::cout << "request " << k << ": no provider: " << e.what() << std::endl;
    }
}

} // namespace

int main(int argc, char** argv) {
    bool serve = false;
    long interval_ms = 100;
    const char* store = nullptr;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--serve") == 0) {
            serve = true;
        } else if (std::strcmp(argv[i], "--interval-ms") == 0 && i + 1 < argc) {
            interval_ms = std::atol(argv[++i]);
        } else if (store == nullptr && argv[i][0] != '-') {
            store = argv[i];
        } else {
            store = nullptr;
            break;
        }
    }
    if (store == nullptr) {
        std::cerr << "usage: guild_engine [--serve [--interval-ms N]] STORE\n";
        return 2;
    }
    try {
        guild_host_open_report_v1_t report{};
        report.struct_size = sizeof report;
        guild::Host host = guild::Host::open(store, GUILD_HOST_OPEN_CPU_ONLY, nullptr, log_to_stderr, nullptr, &report);
        std::cout << "opened " << store << ": " << report.loaded << " package(s) loaded at generation "
                  << report.generation << std::endl;
        Serving s;
        if (!serve) {
            request(host, s, 1, 4);
            request(host, s, 2, 8); // the same handle, reshaped
            s.scan.reset();
            host.close();
            return 0;
        }
        // The watcher refreshes on every commit; failures are reported here, on its thread.
        host.watch(1000, [](const guild_host_refresh_v1_t*, const guild_host_error_t* error) {
            if (error != nullptr) {
                std::fprintf(stderr, "refresh failed: %s\n", guild::detail::api().error_message(error));
            }
        });
        uint64_t generation = host.state().generation;
        for (uint64_t k = 1;; ++k) {
            uint64_t now = host.state().generation;
            if (now != generation) {
                generation = now;
                std::cout << "the store moved to generation " << now << "; the engine follows" << std::endl;
            }
            request(host, s, k, 1 + k % 8);
            std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
        }
    } catch (const guild::Error& e) {
        std::cerr << "guild_engine: " << e.what() << std::endl;
        return 1;
    }
}
