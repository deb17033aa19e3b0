/*
 * other_thread: init starts a POSIX thread, registers a kernel from it and joins it before
 * returning. Registration is only allowed on the thread that runs init, so the host answers that
 * thread with GUILD_STATUS_ERR_STATE and the load fails; init passes the status on.
 */
#include <guild/abi/kernel_abi.h>

#include <pthread.h>

#include "guild_test_kernel.h"

typedef struct other_thread_job_t {
    const guild_host_api_v1_t* host;
    guild_status_t status;
    guild_error_info_t error;
} other_thread_job_t;

static void* other_thread_register(void* arg) {
    other_thread_job_t* job = (other_thread_job_t*)arg;
    guild_kernel_op_desc_v1_t desc;
    guild_test_kernel_desc(&desc, "test.other_thread.add");
    job->status = job->host->register_kernel(job->host->host_context, &desc, &job->error);
    return NULL;
}

static guild_status_t other_thread_init(const guild_host_api_v1_t* host, void** plugin_state,
                                        guild_error_info_t* error) {
    pthread_t thread;
    other_thread_job_t job;
    guild_status_t status = guild_test_init_prologue(host, plugin_state, error, "test.other_thread");
    if (status != GUILD_STATUS_OK) {
        return status;
    }
    job.host = host;
    job.status = GUILD_STATUS_ERR_INTERNAL;
    guild_error_info_init(&job.error);
    if (pthread_create(&thread, NULL, other_thread_register, &job) != 0) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, "test.other_thread", "cannot start a thread");
    }
    if (pthread_join(thread, NULL) != 0) {
        return guild_error_info_set(error, GUILD_STATUS_ERR_INTERNAL, "test.other_thread", "cannot join the thread");
    }
    if (job.status != GUILD_STATUS_OK) {
        return guild_error_info_set(error, job.status, "test.other_thread", "registration from a helper thread failed");
    }
    return GUILD_STATUS_OK;
}

static void other_thread_shutdown(void* plugin_state) {
    (void)plugin_state;
}

static const guild_plugin_descriptor_v1_t other_thread_descriptor = {
    (uint32_t)sizeof(guild_plugin_descriptor_v1_t),
    GUILD_KERNEL_ABI_VERSION,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    GUILD_KERNEL_ABI_VERSION_1_0_0,
    "other_thread",
    "1.0.0",
    other_thread_init,
    other_thread_shutdown,
};

const guild_plugin_descriptor_v1_t* guild_plugin_entry_v1(void) {
    return &other_thread_descriptor;
}
