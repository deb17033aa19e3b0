/*
 * A thin, header-only C++17 wrapper over guild_host.h: owning classes for the host and for
 * operation handles, and exceptions for failures. Everything it does goes through the C table;
 * nothing here is compiled into libguild_host, and no C++ type crosses the library's boundary.
 *
 *     guild::Host host = guild::Host::open("/var/lib/guild");
 *     guild::OpHandle scan = host.resolve(query);      // a guild_operation_query_v1_t
 *     scan.execute(args);                              // a guild_execute_args_v1_t
 *     if (!host.info(scan).current) { ... resolve again ... }
 *
 * Destroy every OpHandle before its Host: a Host whose handles are still live is not closed (its
 * destructor leaves it open rather than throw; close() says why). Exceptions are guild::Error,
 * carrying the guild_host_code_t or guild_status_t and the library's message.
 */
#ifndef GUILD_HOST_HPP
#define GUILD_HOST_HPP

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "guild/guild_host.h"

namespace guild {

/* A failure of the host API (code is a guild_host_code_t) or of the operation service (code is
 * a guild_status_t; from_service() is true). */
class Error : public std::runtime_error {
public:
    Error(int32_t code, bool from_service, const std::string& message)
        : std::runtime_error(message), code_(code), from_service_(from_service) {}
    int32_t code() const noexcept { return code_; }
    bool from_service() const noexcept { return from_service_; }

private:
    int32_t code_;
    bool from_service_;
};

namespace detail {

inline const guild_host_capi_v1_t& api() {
    const guild_host_capi_v1_t* table = guild_host_get_api(GUILD_HOST_CAPI_VERSION);
    if (table == nullptr) {
        throw Error(GUILD_HOST_ERR_INVALID_ARGUMENT, false, "libguild_host does not provide API version 1");
    }
    return *table;
}

/* Throws the error object's code and message (freeing it) unless code is GUILD_HOST_OK. The
 * error is taken by reference so that `check(api().f(..., &error), error)` reads it after the
 * call whatever order the arguments are evaluated in. */
inline void check(guild_host_code_t code, guild_host_error_t*& error) {
    if (code == GUILD_HOST_OK) {
        return;
    }
    const guild_host_capi_v1_t& a = api();
    std::string message = error != nullptr ? a.error_message(error) : "no message";
    a.error_free(error);
    error = nullptr;
    throw Error(code, false, message);
}

inline void check_service(guild_status_t status, const guild_error_info_t& error) {
    if (status != GUILD_STATUS_OK) {
        throw Error(status, true, error.message);
    }
}

} // namespace detail

/* The package version a handle runs and whether it is still the current one. */
struct HandleInfo {
    std::string package_id;
    std::string package_version;
    bool current;
};

class Host;

/* A resolved operation; released when destroyed. Movable, not copyable. */
class OpHandle {
public:
    OpHandle() noexcept = default;
    OpHandle(const guild_operation_service_v1_t* service, guild_op_handle_t* handle) noexcept
        : service_(service), handle_(handle) {}
    OpHandle(OpHandle&& other) noexcept
        : service_(other.service_), handle_(std::exchange(other.handle_, nullptr)) {}
    OpHandle& operator=(OpHandle&& other) noexcept {
        if (this != &other) {
            reset();
            service_ = other.service_;
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    OpHandle(const OpHandle&) = delete;
    OpHandle& operator=(const OpHandle&) = delete;
    ~OpHandle() { reset(); }

    guild_op_handle_t* get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }

    /* The description (strings borrowed from the handle until it is released). */
    guild_op_description_v1_t describe() const {
        guild_op_description_v1_t d{};
        d.struct_size = (uint32_t)sizeof(d);
        guild_error_info_t error = GUILD_ERROR_INFO_INITIALIZER();
        detail::check_service(service_->describe(service_->user, handle_, &d, &error), error);
        return d;
    }

    void execute(const guild_execute_args_v1_t& args) const {
        guild_error_info_t error = GUILD_ERROR_INFO_INITIALIZER();
        detail::check_service(service_->execute(service_->user, handle_, &args, &error), error);
    }

    void reshape(const guild_reshape_args_v1_t& args) const {
        if (service_->struct_size < GUILD_OPERATION_SERVICE_V1_RESHAPE_SIZE) {
            throw Error(GUILD_STATUS_ERR_UNSUPPORTED, true, "this host's operation service has no reshape");
        }
        guild_error_info_t error = GUILD_ERROR_INFO_INITIALIZER();
        detail::check_service(service_->reshape(service_->user, handle_, &args, &error), error);
    }

    /* Releases now (also done by the destructor, which cannot report a failure). */
    void reset() noexcept {
        if (handle_ != nullptr) {
            service_->release(service_->user, handle_, nullptr);
            handle_ = nullptr;
        }
    }

private:
    const guild_operation_service_v1_t* service_ = nullptr;
    guild_op_handle_t* handle_ = nullptr;
};

/* An opened host; closed when destroyed. Movable, not copyable. */
class Host {
public:
    /* Called on the watcher's thread: a report, or a failure (error borrowed for the call). */
    using WatchFn = std::function<void(const guild_host_refresh_v1_t* report, const guild_host_error_t* error)>;

    /* Opens the store at store_dir as a runner. Throws guild::Error (code
     * GUILD_HOST_ERR_NOT_A_STORE when it is not a store). */
    static Host open(const std::string& store_dir, uint32_t flags = 0, const char* lock_file = nullptr,
                     guild_host_log_fn log = nullptr, void* log_user = nullptr,
                     guild_host_open_report_v1_t* report = nullptr) {
        guild_host_open_options_v1_t options = GUILD_HOST_OPEN_OPTIONS_V1_INIT;
        options.flags = flags;
        options.store_dir = store_dir.c_str();
        options.lock_file = lock_file;
        options.log = log;
        options.log_user = log_user;
        guild_host_t* host = nullptr;
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().open(&options, &host, report, &error), error);
        return Host(host);
    }

    Host(Host&& other) noexcept
        : host_(std::exchange(other.host_, nullptr)), service_(std::move(other.service_)),
          watch_(std::move(other.watch_)) {}
    Host& operator=(Host&& other) noexcept {
        if (this != &other) {
            close_quietly();
            host_ = std::exchange(other.host_, nullptr);
            service_ = std::move(other.service_);
            watch_ = std::move(other.watch_);
        }
        return *this;
    }
    Host(const Host&) = delete;
    Host& operator=(const Host&) = delete;
    ~Host() { close_quietly(); }

    guild_host_t* get() const noexcept { return host_; }

    /* The operation service (valid while this Host is open). */
    const guild_operation_service_v1_t& service() const { return *service_; }

    OpHandle resolve(const guild_operation_query_v1_t& query) const {
        guild_op_handle_t* handle = nullptr;
        guild_error_info_t error = GUILD_ERROR_INFO_INITIALIZER();
        detail::check_service(service_->resolve(service_->user, &query, &handle, &error), error);
        return OpHandle(service_.get(), handle);
    }

    HandleInfo info(const OpHandle& handle) const {
        guild_host_handle_info_v1_t out{};
        out.struct_size = (uint32_t)sizeof(out);
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().handle_info(host_, handle.get(), &out, &error), error);
        return HandleInfo{out.package_id, out.package_version, out.is_current != 0};
    }

    guild_host_refresh_v1_t refresh() const {
        guild_host_refresh_v1_t out{};
        out.struct_size = (uint32_t)sizeof(out);
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().refresh(host_, &out, &error), error);
        return out;
    }

    guild_host_state_v1_t state() const {
        guild_host_state_v1_t out{};
        out.struct_size = (uint32_t)sizeof(out);
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().state(host_, &out, &error), error);
        return out;
    }

    /* Starts (or replaces) the watcher. on_change must not throw. */
    void watch(uint32_t fallback_ms, WatchFn on_change) {
        auto fn = std::make_unique<WatchFn>(std::move(on_change));
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().watch(host_, fallback_ms, &Host::trampoline, fn.get(), &error), error);
        watch_ = std::move(fn);
    }

    void unwatch() {
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().unwatch(host_, &error), error);
        watch_.reset();
    }

    /* Closes now, throwing guild::Error (GUILD_HOST_ERR_BUSY while handles are live). */
    void close() {
        if (host_ == nullptr) {
            return;
        }
        guild_host_error_t* error = nullptr;
        detail::check(detail::api().close(host_, &error), error);
        host_ = nullptr;
        watch_.reset();
    }

private:
    explicit Host(guild_host_t* host) : host_(host), service_(new guild_operation_service_v1_t()) {
        service_->struct_size = (uint32_t)sizeof(guild_operation_service_v1_t);
        guild_host_error_t* error = nullptr;
        guild_host_code_t code = detail::api().operation_service(host_, service_.get(), &error);
        if (code != GUILD_HOST_OK) {
            detail::api().close(host_, nullptr);
            host_ = nullptr;
            detail::check(code, error);
        }
    }

    void close_quietly() noexcept {
        if (host_ != nullptr && detail::api().close(host_, nullptr) == GUILD_HOST_OK) {
            host_ = nullptr;
            watch_.reset();
        }
    }

    static void trampoline(void* user, const guild_host_refresh_v1_t* report, const guild_host_error_t* error) {
        (*static_cast<WatchFn*>(user))(report, error);
    }

    guild_host_t* host_ = nullptr;
    std::unique_ptr<guild_operation_service_v1_t> service_;
    std::unique_ptr<WatchFn> watch_;
};

} // namespace guild

#endif /* GUILD_HOST_HPP */
