#define _POSIX_C_SOURCE 199309L
/*
 * The C test of libguild_host, run by tests/it/programs.rs (and under valgrind by `cargo xtask
 * test`): argv[1] is a store with example.scan 1.0.0 installed, argv[2] a path that is not a
 * store. When the program needs the operator to change the store it prints a line ("need
 * install 1.1.0", "need revoke 1.1.0") and waits for "done" on stdin: the change is made by
 * another process, the test harness, through its package manager. It prints "ok" at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guild/guild_host.h"

static const guild_host_capi_v1_t* api;
static guild_operation_service_v1_t service;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Fails with the error object's message unless code is OK. */
static void ok(guild_host_code_t code, guild_host_error_t* error, const char* what) {
    if (code != GUILD_HOST_OK) {
        fprintf(stderr, "%s failed (%d): %s\n", what, (int)code, api->error_message(error));
        api->error_free(error);
        exit(1);
    }
}

static void sleep_ms(long ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

/* Asks the harness for a change and waits until it is made. */
static void operator_does(const char* what) {
    char line[64];
    printf("need %s\n", what);
    fflush(stdout);
    CHECK(fgets(line, sizeof line, stdin) != NULL);
    CHECK(strncmp(line, "done", 4) == 0);
}

static guild_tensor_desc_v1_t tensor(uint64_t n, float* data) {
    guild_tensor_desc_v1_t t;
    memset(&t, 0, sizeof t);
    t.dtype = GUILD_DTYPE_F32;
    t.rank = 1;
    t.dims[0] = n;
    t.memory_space = GUILD_MEMORY_HOST;
    t.data = data;
    return t;
}

static guild_status_t resolve(uint64_t n, guild_op_handle_t** out, guild_error_info_t* error) {
    guild_tensor_desc_v1_t in = tensor(n, NULL), outt = tensor(n, NULL);
    guild_operation_query_v1_t q;
    memset(&q, 0, sizeof q);
    q.struct_size = (uint32_t)sizeof q;
    q.version = GUILD_OPERATION_QUERY_VERSION;
    q.op_name = "example.sequence.inclusive_scan";
    q.min_op_version = GUILD_MAKE_ABI_VERSION(1, 0, 0);
    q.max_op_version = GUILD_MAKE_ABI_VERSION(1, 4095, 4095);
    q.backends = GUILD_BACKEND_CPU;
    q.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    q.inputs = &in;
    q.input_count = 1;
    q.outputs = &outt;
    q.output_count = 1;
    q.ram_budget = GUILD_BUDGET_UNLIMITED;
    q.vram_budget = GUILD_BUDGET_UNLIMITED;
    guild_error_info_init(error);
    return service.resolve(service.user, &q, out, error);
}

static guild_status_t execute(guild_op_handle_t* h, uint64_t n, float* in, float* out, guild_error_info_t* error) {
    guild_tensor_desc_v1_t ti = tensor(n, in), to = tensor(n, out);
    guild_execute_args_v1_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = (uint32_t)sizeof a;
    a.inputs = &ti;
    a.input_count = 1;
    a.outputs = &to;
    a.output_count = 1;
    a.sync_mode = GUILD_SYNC_HOST_BLOCKING;
    guild_error_info_init(error);
    return service.execute(service.user, h, &a, error);
}

static guild_host_handle_info_v1_t info(guild_host_t* host, guild_op_handle_t* h) {
    guild_host_handle_info_v1_t i;
    guild_host_error_t* error = NULL;
    memset(&i, 0, sizeof i);
    i.struct_size = (uint32_t)sizeof i;
    ok(api->handle_info(host, h, &i, &error), error, "handle_info");
    return i;
}

static guild_host_state_v1_t state(guild_host_t* host) {
    guild_host_state_v1_t s;
    guild_host_error_t* error = NULL;
    memset(&s, 0, sizeof s);
    s.struct_size = (uint32_t)sizeof s;
    ok(api->state(host, &s, &error), error, "state");
    return s;
}

static void release(guild_op_handle_t* h) {
    guild_error_info_t error = GUILD_ERROR_INFO_INITIALIZER();
    CHECK(service.release(service.user, h, &error) == GUILD_STATUS_OK);
}

int main(int argc, char** argv) {
    guild_host_open_options_v1_t options = GUILD_HOST_OPEN_OPTIONS_V1_INIT;
    guild_host_open_report_v1_t report;
    guild_host_refresh_v1_t refreshed;
    guild_host_t* host = NULL;
    guild_host_error_t* error = NULL;
    guild_error_info_t serr = GUILD_ERROR_INFO_INITIALIZER();
    guild_op_handle_t* scan = NULL;
    guild_op_handle_t* newer = NULL;
    guild_op_description_v1_t d;
    float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    uint64_t changes;
    int waited;

    CHECK(argc == 3);
    api = guild_host_get_api(GUILD_HOST_CAPI_VERSION);
    CHECK(api != NULL && api->version == GUILD_HOST_CAPI_VERSION);
    CHECK(api->struct_size >= sizeof(guild_host_capi_v1_t));
    CHECK(guild_host_get_api(GUILD_HOST_CAPI_VERSION + 1) == NULL);

    /* A path that is not a store: refused, naming it; out_host untouched. */
    options.flags = GUILD_HOST_OPEN_CPU_ONLY;
    options.store_dir = argv[2];
    CHECK(api->open(&options, &host, NULL, &error) == GUILD_HOST_ERR_NOT_A_STORE);
    CHECK(host == NULL && error != NULL);
    CHECK(api->error_code(error) == GUILD_HOST_ERR_NOT_A_STORE);
    CHECK(strstr(api->error_message(error), argv[2]) != NULL);
    api->error_free(error);
    error = NULL;

    /* Open, and the service. */
    options.store_dir = argv[1];
    memset(&report, 0, sizeof report);
    report.struct_size = (uint32_t)sizeof report;
    ok(api->open(&options, &host, &report, &error), error, "open");
    CHECK(report.loaded == 1 && report.failed == 0);
    memset(&service, 0, sizeof service);
    service.struct_size = (uint32_t)sizeof service;
    ok(api->operation_service(host, &service, &error), error, "operation_service");
    CHECK(service.struct_size >= GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE);

    /* Resolve, describe (with the package version), execute, reshape, execute. */
    CHECK(resolve(4, &scan, &serr) == GUILD_STATUS_OK);
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)sizeof d;
    CHECK(service.describe(service.user, scan, &d, &serr) == GUILD_STATUS_OK);
    CHECK(strcmp(d.package_id, "example.scan") == 0);
    CHECK(d.package_version != NULL && strcmp(d.package_version, "1.0.0") == 0);
    CHECK(info(host, scan).is_current == 1);
    CHECK(strcmp(info(host, scan).package_version, "1.0.0") == 0);
    CHECK(execute(scan, 4, in, out, &serr) == GUILD_STATUS_OK);
    CHECK(out[0] == 1 && out[1] == 3 && out[2] == 6 && out[3] == 10);
    {
        guild_tensor_desc_v1_t ti = tensor(8, NULL), to = tensor(8, NULL);
        guild_reshape_args_v1_t r;
        memset(&r, 0, sizeof r);
        r.struct_size = (uint32_t)sizeof r;
        r.inputs = &ti;
        r.input_count = 1;
        r.outputs = &to;
        r.output_count = 1;
        CHECK(service.reshape(service.user, scan, &r, &serr) == GUILD_STATUS_OK);
    }
    CHECK(execute(scan, 8, in, out, &serr) == GUILD_STATUS_OK);
    CHECK(out[7] == 36);
    /* The old shape is refused now, in words. */
    CHECK(execute(scan, 4, in, out, &serr) == GUILD_STATUS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(serr.message, "expected f32 [8] packed in host memory") != NULL);
    CHECK(strstr(serr.message, "TensorDesc") == NULL);

    /* Follow the store: a watcher refreshes when another process installs 1.1.0. */
    ok(api->watch(host, 100, NULL, NULL, &error), error, "watch");
    changes = state(host).changes;
    operator_does("install 1.1.0");
    for (waited = 0; state(host).changes == changes; waited += 10) {
        CHECK(waited < 30000);
        sleep_ms(10);
    }
    /* The live handle holds 1.0.0: it still runs, says it is stale, and close is refused. */
    CHECK(info(host, scan).is_current == 0);
    CHECK(execute(scan, 8, in, out, &serr) == GUILD_STATUS_OK);
    CHECK(state(host).live_handles == 1);
    CHECK(api->close(host, &error) == GUILD_HOST_ERR_BUSY);
    CHECK(strstr(api->error_message(error), "live") != NULL);
    api->error_free(error);
    error = NULL;
    release(scan);
    memset(&refreshed, 0, sizeof refreshed);
    refreshed.struct_size = (uint32_t)sizeof refreshed;
    ok(api->refresh(host, &refreshed, &error), error, "refresh");
    /* The watcher may have made the switch already: either way nothing is owed now. */
    CHECK(refreshed.pending == 0);
    CHECK(resolve(8, &newer, &serr) == GUILD_STATUS_OK);
    CHECK(strcmp(info(host, newer).package_version, "1.1.0") == 0);
    CHECK(info(host, newer).is_current == 1);

    /* A revocation reaches the host: the live handle is stale and nothing new resolves. */
    ok(api->unwatch(host, &error), error, "unwatch");
    operator_does("revoke 1.1.0");
    ok(api->refresh(host, &refreshed, &error), error, "refresh");
    CHECK(refreshed.revoked_live == 1);
    CHECK(info(host, newer).is_current == 0);
    {
        guild_op_handle_t* none = NULL;
        CHECK(resolve(8, &none, &serr) == GUILD_STATUS_ERR_NOT_FOUND);
        CHECK(none == NULL);
    }
    release(newer);

    ok(api->close(host, &error), error, "close");
    CHECK(api->close(NULL, NULL) == GUILD_HOST_OK);
    printf("ok\n");
    return 0;
}
