/*
 * flex_stub.c -- a minimal flex runtime library for the flex-sys loader tests.
 *
 * It implements every function of flex.h. Only a few do real work:
 *
 *  - flex_get_api_version returns FLEX_TEST_VERSION (default: the header's
 *    FLEX_API_VERSION);
 *  - flex_get_device_count writes 3;
 *  - flex_runtime_create fails every device with FLEX_ERROR_NO_DEVICE and the
 *    thread-local message "no device <index>";
 *  - flex_status_string names every status code of flex.h.
 *
 * Every other function fails with FLEX_ERROR_UNSUPPORTED.
 *
 * Compile-time switches, one library per combination:
 *
 *  -DFLEX_TEST_VERSION=<packed>    the version flex_get_api_version reports
 *  -DOMIT_<function name>          leave that function out of the library
 *  -DFLEX_TEST_ABI_1_0             leave out every function ABI 1.1 added
 *                                  (build a 1.0 library with it)
 *  -DFLEX_TEST_NULL_STRINGS        flex_status_string and
 *                                  flex_get_last_error_message return NULL
 *  -DFLEX_TEST_BAD_UTF8            the "no device" message holds a byte that
 *                                  is not UTF-8 (0xFF)
 *  -DFLEX_TEST_UNDEFINED_SYMBOL    flex_get_device_count calls a function that
 *                                  no library defines
 *  -DFLEX_TEST_NEEDS_DEPENDENCY    flex_get_device_count calls a function of
 *                                  libflextestdep.so (tests/c/dependency.c)
 */
#include <stdarg.h>
#include <stdio.h>

#include "flex.h"

#ifndef FLEX_TEST_VERSION
#define FLEX_TEST_VERSION FLEX_API_VERSION
#endif

#define TEST_DEVICE_COUNT 3

static _Thread_local char last_error[256];

static flex_status_t fail(flex_status_t status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    return status;
}

#define NOT_IMPLEMENTED()                                                      \
    fail(FLEX_ERROR_UNSUPPORTED, "%s is not implemented by this test library", \
         __func__)

#ifdef FLEX_TEST_UNDEFINED_SYMBOL
/* Declared, defined nowhere: binding it fails. */
extern int32_t flex_test_undefined_function(void);
#endif

#ifdef FLEX_TEST_NEEDS_DEPENDENCY
/* Defined in libflextestdep.so, which the dynamic loader cannot find. */
extern int32_t flex_test_dependency_device_count(void);
#endif

#ifndef OMIT_flex_get_api_version
uint32_t flex_get_api_version(void) { return FLEX_TEST_VERSION; }
#endif

#ifndef OMIT_flex_status_string
const char *flex_status_string(flex_status_t status) {
#ifdef FLEX_TEST_NULL_STRINGS
    (void)status;
    return NULL;
#else
    switch (status) {
    case FLEX_SUCCESS: return "FLEX_SUCCESS";
    case FLEX_NOT_READY: return "FLEX_NOT_READY";
    case FLEX_ERROR_INVALID_ARGUMENT: return "FLEX_ERROR_INVALID_ARGUMENT";
    case FLEX_ERROR_INVALID_HANDLE: return "FLEX_ERROR_INVALID_HANDLE";
    case FLEX_ERROR_OUT_OF_MEMORY: return "FLEX_ERROR_OUT_OF_MEMORY";
    case FLEX_ERROR_NO_DEVICE: return "FLEX_ERROR_NO_DEVICE";
    case FLEX_ERROR_STREAM_FAILED: return "FLEX_ERROR_STREAM_FAILED";
    case FLEX_ERROR_LAUNCH_FAILED: return "FLEX_ERROR_LAUNCH_FAILED";
    case FLEX_ERROR_SHUTDOWN: return "FLEX_ERROR_SHUTDOWN";
    case FLEX_ERROR_EXECUTION_FAILED: return "FLEX_ERROR_EXECUTION_FAILED";
    case FLEX_ERROR_HOST_CALLBACK_FAILED: return "FLEX_ERROR_HOST_CALLBACK_FAILED";
    case FLEX_ERROR_RUNTIME_FAILED: return "FLEX_ERROR_RUNTIME_FAILED";
    case FLEX_ERROR_UNSUPPORTED: return "FLEX_ERROR_UNSUPPORTED";
    case FLEX_ERROR_INTERNAL: return "FLEX_ERROR_INTERNAL";
    default: return "FLEX_UNKNOWN_STATUS";
    }
#endif
}
#endif

#ifndef OMIT_flex_get_last_error_message
const char *flex_get_last_error_message(void) {
#ifdef FLEX_TEST_NULL_STRINGS
    return NULL;
#else
    return last_error;
#endif
}
#endif

#ifndef OMIT_flex_get_device_count
flex_status_t flex_get_device_count(int32_t *count) {
    if (count == NULL) {
        return fail(FLEX_ERROR_INVALID_ARGUMENT, "count is NULL");
    }
#if defined(FLEX_TEST_UNDEFINED_SYMBOL)
    *count = flex_test_undefined_function();
#elif defined(FLEX_TEST_NEEDS_DEPENDENCY)
    *count = flex_test_dependency_device_count();
#else
    *count = TEST_DEVICE_COUNT;
#endif
    return FLEX_SUCCESS;
}
#endif

#ifndef OMIT_flex_runtime_create
flex_status_t flex_runtime_create(int32_t logical_device,
                                  flex_runtime_t **runtime_out) {
    (void)runtime_out;
#ifdef FLEX_TEST_BAD_UTF8
    return fail(FLEX_ERROR_NO_DEVICE, "no device %d \xff", (int)logical_device);
#else
    return fail(FLEX_ERROR_NO_DEVICE, "no device %d", (int)logical_device);
#endif
}
#endif

#ifndef OMIT_flex_runtime_destroy
flex_status_t flex_runtime_destroy(flex_runtime_t *runtime) {
    (void)runtime;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_runtime_get_logical_device
flex_status_t flex_runtime_get_logical_device(flex_runtime_t *runtime,
                                              int32_t *device_out) {
    (void)runtime;
    (void)device_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_runtime_get_default_stream
flex_status_t flex_runtime_get_default_stream(flex_runtime_t *runtime,
                                              flex_stream_t **stream_out) {
    (void)runtime;
    (void)stream_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_runtime_create_stream
flex_status_t flex_runtime_create_stream(flex_runtime_t *runtime,
                                         flex_stream_priority_t priority,
                                         flex_stream_mode_t mode,
                                         int32_t track_hazards,
                                         flex_stream_t **stream_out) {
    (void)runtime;
    (void)priority;
    (void)mode;
    (void)track_hazards;
    (void)stream_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_destroy
flex_status_t flex_stream_destroy(flex_runtime_t *runtime,
                                  flex_stream_t *stream) {
    (void)runtime;
    (void)stream;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_runtime_has_stream_error
flex_status_t flex_runtime_has_stream_error(flex_runtime_t *runtime,
                                            int32_t *has_error_out) {
    (void)runtime;
    (void)has_error_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_memory_allocate
flex_status_t flex_memory_allocate(flex_runtime_t *runtime, uint64_t size,
                                   flex_address_chunk_t *chunks_out,
                                   size_t capacity, size_t *num_chunks_out) {
    (void)runtime;
    (void)size;
    (void)chunks_out;
    (void)capacity;
    (void)num_chunks_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_memory_free
flex_status_t flex_memory_free(flex_runtime_t *runtime,
                               const flex_composite_address_t *address) {
    (void)runtime;
    (void)address;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_get_id
flex_status_t flex_stream_get_id(flex_stream_t *stream, uint64_t *id_out) {
    (void)stream;
    (void)id_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_get_priority
flex_status_t flex_stream_get_priority(flex_stream_t *stream,
                                       flex_stream_priority_t *priority_out) {
    (void)stream;
    (void)priority_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_query
flex_status_t flex_stream_query(flex_stream_t *stream) {
    (void)stream;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_synchronize
flex_status_t flex_stream_synchronize(flex_stream_t *stream) {
    (void)stream;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_needs_shutdown
flex_status_t flex_stream_needs_shutdown(flex_stream_t *stream,
                                         int32_t *needs_shutdown_out) {
    (void)stream;
    (void)needs_shutdown_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_launch_h2d
flex_status_t flex_launch_h2d(flex_stream_t *stream, const void *host_src,
                              const flex_composite_address_t *dst,
                              int32_t pipeline_barrier,
                              flex_completion_t completion) {
    (void)stream;
    (void)host_src;
    (void)dst;
    (void)pipeline_barrier;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_launch_d2h
flex_status_t flex_launch_d2h(flex_stream_t *stream,
                              const flex_composite_address_t *src,
                              void *host_dst, int32_t pipeline_barrier,
                              flex_completion_t completion) {
    (void)stream;
    (void)src;
    (void)host_dst;
    (void)pipeline_barrier;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_launch_compute
flex_status_t flex_launch_compute(flex_stream_t *stream,
                                  const flex_composite_address_t *program,
                                  int32_t pipeline_barrier,
                                  flex_completion_t completion) {
    (void)stream;
    (void)program;
    (void)pipeline_barrier;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_launch_host_callback
flex_status_t flex_launch_host_callback(flex_stream_t *stream,
                                        flex_host_fn host_fn,
                                        void *host_user_data,
                                        int32_t pipeline_barrier,
                                        flex_completion_t completion) {
    (void)stream;
    (void)host_fn;
    (void)host_user_data;
    (void)pipeline_barrier;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_launch_fill
flex_status_t flex_launch_fill(flex_stream_t *stream,
                               const flex_composite_address_t *dst,
                               double value, flex_data_format_t format,
                               int32_t pipeline_barrier,
                               flex_completion_t completion) {
    (void)stream;
    (void)dst;
    (void)value;
    (void)format;
    (void)pipeline_barrier;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

/* ABI 1.1: events and capabilities. */
#ifndef FLEX_TEST_ABI_1_0

#ifndef OMIT_flex_runtime_get_capability
flex_status_t flex_runtime_get_capability(flex_runtime_t *runtime,
                                          flex_capability_t capability,
                                          int32_t *value_out) {
    (void)runtime;
    (void)capability;
    (void)value_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_runtime_get_memory_info
flex_status_t flex_runtime_get_memory_info(flex_runtime_t *runtime,
                                           uint64_t *free_out,
                                           uint64_t *total_out) {
    (void)runtime;
    (void)free_out;
    (void)total_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_create
flex_status_t flex_event_create(flex_runtime_t *runtime,
                                flex_event_flags_t flags,
                                flex_event_t **event_out) {
    (void)runtime;
    (void)flags;
    (void)event_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_destroy
flex_status_t flex_event_destroy(flex_runtime_t *runtime, flex_event_t *event) {
    (void)runtime;
    (void)event;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_record
flex_status_t flex_event_record(flex_event_t *event, flex_stream_t *stream,
                                flex_completion_t completion) {
    (void)event;
    (void)stream;
    (void)completion;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_stream_wait_event
flex_status_t flex_stream_wait_event(flex_stream_t *stream,
                                     flex_event_t *event) {
    (void)stream;
    (void)event;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_notify
flex_status_t flex_event_notify(flex_event_t *event,
                                flex_completion_t completion,
                                int32_t *complete_out) {
    (void)event;
    (void)completion;
    (void)complete_out;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_query
flex_status_t flex_event_query(flex_event_t *event) {
    (void)event;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_synchronize
flex_status_t flex_event_synchronize(flex_event_t *event) {
    (void)event;
    return NOT_IMPLEMENTED();
}
#endif

#ifndef OMIT_flex_event_elapsed_time
flex_status_t flex_event_elapsed_time(flex_event_t *start, flex_event_t *end,
                                      int64_t *nanoseconds_out) {
    (void)start;
    (void)end;
    (void)nanoseconds_out;
    return NOT_IMPLEMENTED();
}
#endif

#endif /* FLEX_TEST_ABI_1_0 */
