// The C++17 test of libguild_host through guild_host.hpp, run by tests/it/programs.rs (and under
// valgrind by `cargo xtask test`) with the same arguments and requests as api_test.c: a store
// with example.scan 1.0.0, a path that is not a store; "need ..." lines answered with "done".
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "guild/guild_host.hpp"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);          \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

namespace {

void operator_does(const char* what) {
    std::cout << "need " << what << std::endl;
    std::string line;
    CHECK(std::getline(std::cin, line) && line == "done");
}

guild_tensor_desc_v1_t tensor(uint64_t n, float* data) {
    guild_tensor_desc_v1_t t{};
    t.dtype = GUILD_DTYPE_F32;
    t.rank = 1;
    t.dims[0] = n;
    t.memory_space = GUILD_MEMORY_HOST;
    t.data = data;
    return t;
}

guild::OpHandle resolve(const guild::Host& host, uint64_t n) {
    guild_tensor_desc_v1_t in = tensor(n, nullptr), out = tensor(n, nullptr);
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

std::vector<float> scan(const guild::OpHandle& h, std::vector<float> input) {
    std::vector<float> output(input.size());
    guild_tensor_desc_v1_t in = tensor(input.size(), input.data());
    guild_tensor_desc_v1_t out = tensor(output.size(), output.data());
    guild_execute_args_v1_t a{};
    a.struct_size = sizeof a;
    a.inputs = &in;
    a.input_count = 1;
    a.outputs = &out;
    a.output_count = 1;
    a.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    h.execute(a);
    return output;
}

} // namespace

int main(int argc, char** argv) {
    CHECK(argc == 3);
    try {
        guild::Host::open(argv[2], GUILD_HOST_OPEN_CPU_ONLY);
        CHECK(!"opened a path that is not a store");
    } catch (const guild::Error& e) {
        CHECK(e.code() == GUILD_HOST_ERR_NOT_A_STORE && !e.from_service());
        CHECK(std::string(e.what()).find(argv[2]) != std::string::npos);
    }

    guild::Host host = guild::Host::open(argv[1], GUILD_HOST_OPEN_CPU_ONLY);
    guild::OpHandle h = resolve(host, 4);
    CHECK(std::strcmp(h.describe().package_version, "1.0.0") == 0);
    CHECK((scan(h, {1, 2, 3, 4}) == std::vector<float>{1, 3, 6, 10}));
    {
        guild_tensor_desc_v1_t in = tensor(2, nullptr), out = tensor(2, nullptr);
        guild_reshape_args_v1_t r{};
        r.struct_size = sizeof r;
        r.inputs = &in;
        r.input_count = 1;
        r.outputs = &out;
        r.output_count = 1;
        h.reshape(r);
    }
    CHECK((scan(h, {5, 6}) == std::vector<float>{5, 11}));
    try {
        scan(h, {1, 2, 3});
        CHECK(!"executed with the old shape");
    } catch (const guild::Error& e) {
        CHECK(e.from_service() && e.code() == GUILD_STATUS_ERR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("expected f32 [2] packed in host memory") != std::string::npos);
    }

    std::atomic<int> reports{0};
    host.watch(100, [&reports](const guild_host_refresh_v1_t* report, const guild_host_error_t*) {
        if (report != nullptr) {
            reports.fetch_add(1);
        }
    });
    operator_does("install 1.1.0");
    for (int waited = 0; reports.load() == 0; waited += 10) {
        CHECK(waited < 30000);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    guild::HandleInfo info = host.info(h);
    CHECK(info.package_id == "example.scan" && info.package_version == "1.0.0" && !info.current);
    try {
        host.close();
        CHECK(!"closed with a live handle");
    } catch (const guild::Error& e) {
        CHECK(e.code() == GUILD_HOST_ERR_BUSY);
    }
    h.reset();
    guild_host_refresh_v1_t r = host.refresh();
    CHECK(r.pending == 0); // the watcher may have made the switch first
    h = resolve(host, 4);
    CHECK(host.info(h).package_version == "1.1.0" && host.info(h).current);

    host.unwatch();
    operator_does("revoke 1.1.0");
    r = host.refresh();
    CHECK(r.revoked_live == 1 && !host.info(h).current);
    try {
        resolve(host, 4);
        CHECK(!"resolved a revoked version");
    } catch (const guild::Error& e) {
        CHECK(e.from_service() && e.code() == GUILD_STATUS_ERR_NOT_FOUND);
    }
    h.reset();
    host.close();
    std::cout << "ok" << std::endl;
    return 0;
}
