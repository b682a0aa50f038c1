/*
 * flex.h -- the C ABI of a flex device runtime.
 *
 * This header is the one contract between the spyre-stream workspace and any
 * library that drives a Spyre device: the vendor runtime on a Spyre host, or
 * the software device (spyre-mock) built as a shared library. The Rust
 * bindings in flex-sys are generated from it.
 *
 * Conventions that hold for every function below:
 *
 *  - Every function except flex_get_api_version, flex_status_string and
 *    flex_get_last_error_message returns a flex_status_t. Results come back
 *    through out-parameters, which are written only on FLEX_SUCCESS unless a
 *    function says otherwise.
 *  - A caller must treat any status value it does not know as an error. A
 *    library may add status codes in a later minor version.
 *  - Booleans crossing the ABI are int32_t: 0 is false, any other value is
 *    true. No function takes or returns C `bool`.
 *  - Sizes and offsets are in bytes.
 *  - Every function may be called from any thread, at the same time as any
 *    other function, unless its documentation says otherwise. Handles are not
 *    tied to the thread that created them. The only per-thread state is the
 *    last-error message (flex_get_last_error_message).
 *  - On failure a function sets the calling thread's last-error message to a
 *    human-readable description; on success the message is left unchanged.
 *
 * Ownership:
 *
 *  - A flex_runtime_t is created by flex_runtime_create and owned by the
 *    caller until flex_runtime_destroy.
 *  - Every flex_stream_t belongs to the runtime that made it. The default
 *    stream is destroyed with its runtime and must not be passed to
 *    flex_stream_destroy. Streams from flex_runtime_create_stream may be
 *    destroyed one by one with flex_stream_destroy, and any still alive are
 *    destroyed by flex_runtime_destroy.
 *  - Device memory from flex_memory_allocate belongs to the caller until
 *    flex_memory_free or until its runtime is destroyed.
 *  - A flex_event_t (ABI 1.1) belongs to the runtime that made it and is
 *    owned by the caller until flex_event_destroy or until its runtime is
 *    destroyed.
 *  - A runtime does not cross fork(): in a child forked after it was
 *    created, every call on it, its streams or its events (its destroy
 *    included) returns FLEX_ERROR_RUNTIME_FAILED, and the child leaves it
 *    to its exit. The child may create runtimes of its own.
 *
 * Versions: 1.0 is the first ABI. 1.1 adds capabilities, the device's
 * memory info and events (the sections marked ABI 1.1 below). A loader built for 1.1 accepts a 1.0 library; the
 * 1.1 functions are then absent, and a caller must report them unsupported.
 */
#ifndef FLEX_H
#define FLEX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Versions                                                                 */
/* ------------------------------------------------------------------------ */

/** Major version of the ABI this header declares. A library with another
 *  major version is not compatible and must be refused by the loader. */
#define FLEX_API_VERSION_MAJOR 1
/** Minor version of the ABI this header declares. A library with a newer
 *  minor version is compatible: it only adds functions or status codes. */
#define FLEX_API_VERSION_MINOR 1

/** Packs a major and a minor version into the value that
 *  flex_get_api_version returns: major in bits 16..31, minor in bits 0..15. */
#define FLEX_MAKE_API_VERSION(major, minor) \
    ((((uint32_t)(major)) << 16) | (((uint32_t)(minor)) & 0xFFFFu))
/** The major version inside a packed version. */
#define FLEX_API_VERSION_GET_MAJOR(version) (((uint32_t)(version)) >> 16)
/** The minor version inside a packed version. */
#define FLEX_API_VERSION_GET_MINOR(version) (((uint32_t)(version)) & 0xFFFFu)

/** The version this header declares, packed. */
#define FLEX_API_VERSION \
    FLEX_MAKE_API_VERSION(FLEX_API_VERSION_MAJOR, FLEX_API_VERSION_MINOR)

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/** Result of a flex call. An integer, not an enum: a library may return a
 *  value this header does not name, and callers must treat it as an error. */
typedef int32_t flex_status_t;

/** The call succeeded. */
#define FLEX_SUCCESS 0
/** flex_stream_query, flex_event_query and flex_event_elapsed_time only:
 *  the work waited for has not finished. */
#define FLEX_NOT_READY 1
/** An argument is out of range, null where a value is required, misaligned,
 *  or inconsistent with another argument. Nothing was done. */
#define FLEX_ERROR_INVALID_ARGUMENT 2
/** A handle is null or does not belong to this library. */
#define FLEX_ERROR_INVALID_HANDLE 3
/** Device memory is exhausted. */
#define FLEX_ERROR_OUT_OF_MEMORY 4
/** The logical device does not exist or cannot be opened. */
#define FLEX_ERROR_NO_DEVICE 5
/** The stream hit an error earlier; it no longer runs work. Sticky. */
#define FLEX_ERROR_STREAM_FAILED 6
/** The runtime refused to enqueue the operation. Nothing was enqueued. */
#define FLEX_ERROR_LAUNCH_FAILED 7
/** The stream needs a shutdown of the runtime; it accepts no more work. */
#define FLEX_ERROR_SHUTDOWN 8
/** An operation failed while executing on the device (for example a compute
 *  program that the device cannot run). Makes the stream failed. */
#define FLEX_ERROR_EXECUTION_FAILED 9
/** A host callback returned an error status. Makes the stream failed. */
#define FLEX_ERROR_HOST_CALLBACK_FAILED 10
/** The runtime cannot be created or has failed as a whole. */
#define FLEX_ERROR_RUNTIME_FAILED 11
/** The call is not supported by this library or this device. */
#define FLEX_ERROR_UNSUPPORTED 12
/** An internal error of the library. */
#define FLEX_ERROR_INTERNAL 13

/* ------------------------------------------------------------------------ */
/* Enumerations (integers, for the same reason as flex_status_t)            */
/* ------------------------------------------------------------------------ */

/** Priority of a stream. When more streams have work than the device has
 *  engines, queued work of HIGH streams starts first. */
typedef int32_t flex_stream_priority_t;
/** Normal priority. */
#define FLEX_STREAM_PRIORITY_NORMAL 0
/** High priority. */
#define FLEX_STREAM_PRIORITY_HIGH 1

/** Ordering mode of a stream. */
typedef int32_t flex_stream_mode_t;
/** Operations on the stream start and finish in submission order (FIFO). */
#define FLEX_STREAM_MODE_STRICT_ORDERING 0

/** Element format of device data, for fill. */
typedef int32_t flex_data_format_t;
/** IEEE 754 binary32, 4 bytes, little-endian. */
#define FLEX_DATA_FORMAT_IEEE_FP32 0
/** IEEE 754 binary16, 2 bytes, little-endian. */
#define FLEX_DATA_FORMAT_IEEE_FP16 1
/** Two's complement signed 32-bit integer, 4 bytes, little-endian. */
#define FLEX_DATA_FORMAT_INT32 2
/** Unsigned 8-bit integer, 1 byte. */
#define FLEX_DATA_FORMAT_UINT8 3

/* ------------------------------------------------------------------------ */
/* Handles and plain data                                                   */
/* ------------------------------------------------------------------------ */

/** One device context, bound to one logical device. Opaque. */
typedef struct flex_runtime flex_runtime_t;
/** One hardware queue of a runtime. Opaque. */
typedef struct flex_stream flex_stream_t;

/** Required alignment, in bytes, of every chunk offset in device memory. */
#define FLEX_ADDRESS_ALIGNMENT 128
/** Most chunks flex_memory_allocate ever returns for one allocation. */
#define FLEX_MAX_ADDRESS_CHUNKS 64

/** A place in device memory: a region of the device and a byte offset in it.
 *  The offset of a chunk start is a multiple of FLEX_ADDRESS_ALIGNMENT. */
typedef struct flex_logical_address {
    /** Identifier of a device memory region. */
    uint32_t region_id;
    /** Byte offset inside the region. */
    uint64_t offset;
} flex_logical_address_t;

/** A contiguous run of device memory: where it starts and its length. */
typedef struct flex_address_chunk {
    /** Start of the chunk; the offset is FLEX_ADDRESS_ALIGNMENT-aligned. */
    flex_logical_address_t address;
    /** Length in bytes; greater than zero. */
    uint64_t size;
} flex_address_chunk_t;

/** A composite address: one logical buffer made of one or more chunks, in
 *  order. Its total size is the sum of the chunk sizes. The array is read
 *  during the call that receives it and never kept. */
typedef struct flex_composite_address {
    /** num_chunks chunks, in buffer order. */
    const flex_address_chunk_t *chunks;
    /** Number of chunks, 1..FLEX_MAX_ADDRESS_CHUNKS. */
    size_t num_chunks;
} flex_composite_address_t;

/** Completion callback of a launch. `status` is FLEX_SUCCESS when the
 *  operation completed, or the error it failed with (an operation that never
 *  ran because its stream had failed earlier gets FLEX_ERROR_STREAM_FAILED;
 *  one on a stream that needs shutdown gets FLEX_ERROR_SHUTDOWN).
 *
 *  The runtime calls it exactly once for every launch that returned
 *  FLEX_SUCCESS, on a thread the runtime owns, never inside the launch call.
 *  Callbacks of one stream are called in submission order. It must not call
 *  flex_stream_synchronize, flex_stream_destroy or flex_runtime_destroy on
 *  its own runtime, and it
 *  should return quickly: the stream does not advance while it runs. It
 *  must return normally: a C++ exception, a longjmp or a thread exit out
 *  of it passes through the runtime's frames and is undefined behaviour.
 *
 *  A launch that returns anything other than FLEX_SUCCESS enqueued nothing
 *  and never calls its completion: user_data stays with the caller. */
typedef void (*flex_completion_fn)(void *user_data, flex_status_t status);

/** An optional completion: `fn` may be NULL for none. */
typedef struct flex_completion {
    /** Called once when the operation has finished or failed, or NULL. */
    flex_completion_fn fn;
    /** Passed to `fn` unchanged; the runtime never reads it. */
    void *user_data;
} flex_completion_t;

/** Host function run in stream order by flex_launch_host_callback. Returns
 *  FLEX_SUCCESS, or an error status that makes the stream failed. It must
 *  return normally, as a completion must. */
typedef flex_status_t (*flex_host_fn)(void *user_data);

/* ------------------------------------------------------------------------ */
/* Library                                                                  */
/* ------------------------------------------------------------------------ */

/** The ABI version the library implements, packed as FLEX_MAKE_API_VERSION.
 *  Never fails; needs no runtime. A loader calls this first. */
uint32_t flex_get_api_version(void);

/** A static, NUL-terminated English name for a status code, for example
 *  "FLEX_ERROR_OUT_OF_MEMORY". An unknown code gives "FLEX_UNKNOWN_STATUS".
 *  Never NULL; the string lives as long as the library is loaded. */
const char *flex_status_string(flex_status_t status);

/** The calling thread's last-error message: a NUL-terminated string that
 *  describes the most recent failed call on this thread, or "" if none.
 *  The pointer is valid until the next flex call on the same thread; copy
 *  it at once. Never NULL. */
const char *flex_get_last_error_message(void);

/** Number of logical devices visible to this process, written to *count.
 *  Returns FLEX_SUCCESS, or FLEX_ERROR_INVALID_ARGUMENT if count is NULL. */
flex_status_t flex_get_device_count(int32_t *count);

/* ------------------------------------------------------------------------ */
/* Runtime                                                                  */
/* ------------------------------------------------------------------------ */

/** Creates a runtime bound to `logical_device` (0-based) and writes it to
 *  *runtime_out. The runtime has a default stream from the start.
 *  Returns FLEX_SUCCESS; FLEX_ERROR_INVALID_ARGUMENT (runtime_out NULL);
 *  FLEX_ERROR_NO_DEVICE (index negative or not below the device count);
 *  FLEX_ERROR_RUNTIME_FAILED (the device could not be opened). */
flex_status_t flex_runtime_create(int32_t logical_device,
                                  flex_runtime_t **runtime_out);

/** Destroys a runtime: waits for all work on all its streams to finish and
 *  for every completion callback to return, destroys its streams, frees its
 *  device memory, stops its threads. The handle and every stream handle of
 *  it are invalid afterwards. Must not be called from a completion callback
 *  or a host function of this runtime, nor while another thread uses it.
 *  Returns FLEX_SUCCESS, FLEX_ERROR_INVALID_HANDLE (NULL), or
 *  FLEX_ERROR_UNSUPPORTED (called from a completion callback or host
 *  function of this runtime; nothing is destroyed). */
flex_status_t flex_runtime_destroy(flex_runtime_t *runtime);

/** Writes the logical device the runtime is bound to to *device_out.
 *  Returns FLEX_SUCCESS, FLEX_ERROR_INVALID_HANDLE or
 *  FLEX_ERROR_INVALID_ARGUMENT (device_out NULL). */
flex_status_t flex_runtime_get_logical_device(flex_runtime_t *runtime,
                                              int32_t *device_out);

/** Writes the runtime's default stream to *stream_out. The default stream has
 *  normal priority, strict ordering, no hazard tracking, and lives as long as
 *  the runtime. Every call returns the same handle.
 *  Returns FLEX_SUCCESS, FLEX_ERROR_INVALID_HANDLE or
 *  FLEX_ERROR_INVALID_ARGUMENT (stream_out NULL). */
flex_status_t flex_runtime_get_default_stream(flex_runtime_t *runtime,
                                              flex_stream_t **stream_out);

/** Creates a stream on the runtime and writes it to *stream_out.
 *  `track_hazards` (0 or 1) asks the runtime to order this stream's accesses
 *  against other tracking streams that touch the same memory.
 *  Returns FLEX_SUCCESS; FLEX_ERROR_INVALID_HANDLE;
 *  FLEX_ERROR_INVALID_ARGUMENT (unknown priority or mode, stream_out NULL);
 *  FLEX_ERROR_RUNTIME_FAILED (no more streams can be made). */
flex_status_t flex_runtime_create_stream(flex_runtime_t *runtime,
                                         flex_stream_priority_t priority,
                                         flex_stream_mode_t mode,
                                         int32_t track_hazards,
                                         flex_stream_t **stream_out);

/** Destroys a stream made by flex_runtime_create_stream after its pending
 *  work has finished and its completion callbacks have returned. Not for the
 *  default stream. The handle is invalid afterwards. A launch, record or
 *  device-side wait on a recorded event on the stream from another thread
 *  during the call is either
 *  enqueued before the destroy (which then waits for it) or refused with
 *  FLEX_ERROR_INVALID_HANDLE. Like flex_stream_synchronize it waits, so it
 *  must not be called from a completion callback or host function of the
 *  same runtime (FLEX_ERROR_UNSUPPORTED).
 *  Returns FLEX_SUCCESS; FLEX_ERROR_INVALID_HANDLE (NULL, another runtime's
 *  stream, or the default stream); FLEX_ERROR_UNSUPPORTED. */
flex_status_t flex_stream_destroy(flex_runtime_t *runtime,
                                  flex_stream_t *stream);

/** Writes 1 to *has_error_out if any stream of the runtime has failed or
 *  needs shutdown, else 0. Returns FLEX_SUCCESS, FLEX_ERROR_INVALID_HANDLE
 *  or FLEX_ERROR_INVALID_ARGUMENT (has_error_out NULL). */
flex_status_t flex_runtime_has_stream_error(flex_runtime_t *runtime,
                                            int32_t *has_error_out);

/* ------------------------------------------------------------------------ */
/* Device memory                                                            */
/* ------------------------------------------------------------------------ */

/** Allocates `size` bytes (> 0) of device memory. The chunks, in buffer
 *  order, are written to chunks_out (room for `capacity` entries) and their
 *  number to *num_chunks_out; their sizes add up to `size`. Every chunk
 *  offset is FLEX_ADDRESS_ALIGNMENT-aligned. The memory is not initialized.
 *  Returns FLEX_SUCCESS; FLEX_ERROR_INVALID_HANDLE;
 *  FLEX_ERROR_INVALID_ARGUMENT (size 0, a NULL pointer, or capacity too
 *  small: then *num_chunks_out holds the number needed and nothing is
 *  allocated); FLEX_ERROR_OUT_OF_MEMORY. */
flex_status_t flex_memory_allocate(flex_runtime_t *runtime, uint64_t size,
                                   flex_address_chunk_t *chunks_out,
                                   size_t capacity, size_t *num_chunks_out);

/** Frees memory from flex_memory_allocate, given exactly the chunks it
 *  returned. Work that still uses the memory and runs while it is free
 *  fails with FLEX_ERROR_EXECUTION_FAILED; once the memory has been
 *  allocated again it belongs to the new allocation, and such work may
 *  read and write it. Free memory only once the work that uses it has
 *  completed. Returns FLEX_SUCCESS;
 *  FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (address NULL, or
 *  not an allocation of this runtime; nothing is freed). */
flex_status_t flex_memory_free(flex_runtime_t *runtime,
                               const flex_composite_address_t *address);

/* ------------------------------------------------------------------------ */
/* Streams                                                                  */
/* ------------------------------------------------------------------------ */

/** Writes the stream's identifier, unique within its runtime, to *id_out.
 *  The default stream has id 0. Returns FLEX_SUCCESS,
 *  FLEX_ERROR_INVALID_HANDLE or FLEX_ERROR_INVALID_ARGUMENT. */
flex_status_t flex_stream_get_id(flex_stream_t *stream, uint64_t *id_out);

/** Writes the stream's priority to *priority_out. Returns FLEX_SUCCESS,
 *  FLEX_ERROR_INVALID_HANDLE or FLEX_ERROR_INVALID_ARGUMENT. */
flex_status_t flex_stream_get_priority(flex_stream_t *stream,
                                       flex_stream_priority_t *priority_out);

/** Does not block. Returns FLEX_SUCCESS when every operation enqueued before
 *  the call has completed and its completion callback has returned, and
 *  every wait enqueued before it (flex_stream_wait_event) has passed;
 *  FLEX_NOT_READY when some has not; the stream's first error
 *  (FLEX_ERROR_EXECUTION_FAILED, FLEX_ERROR_HOST_CALLBACK_FAILED, ...) if it
 *  has failed; FLEX_ERROR_INVALID_HANDLE. */
flex_status_t flex_stream_query(flex_stream_t *stream);

/** Blocks until every operation enqueued before the call has completed and
 *  its completion callback has returned, and every wait enqueued before it
 *  (flex_stream_wait_event) has passed. Returns FLEX_SUCCESS, the stream's
 *  first error if it has failed (sticky: later calls return it again),
 *  FLEX_ERROR_INVALID_HANDLE, or FLEX_ERROR_UNSUPPORTED when called from a
 *  completion callback or host function of the same runtime, which it must
 *  not be. */
flex_status_t flex_stream_synchronize(flex_stream_t *stream);

/** Writes 1 to *needs_shutdown_out if the stream has entered a state that
 *  only a shutdown of the runtime clears, else 0. Such a stream rejects new
 *  launches with FLEX_ERROR_SHUTDOWN. Returns FLEX_SUCCESS,
 *  FLEX_ERROR_INVALID_HANDLE or FLEX_ERROR_INVALID_ARGUMENT. */
flex_status_t flex_stream_needs_shutdown(flex_stream_t *stream,
                                         int32_t *needs_shutdown_out);

/* ------------------------------------------------------------------------ */
/* Launches                                                                 */
/*                                                                          */
/* Every launch enqueues one operation at the end of the stream's FIFO and  */
/* returns without waiting for it. `pipeline_barrier` (0 or 1) asks that    */
/* the operation start only after every operation enqueued before it on the */
/* stream has completed, with no overlap of pipeline stages. `completion`   */
/* follows flex_completion_fn. Launches on one stream from several threads  */
/* at once are not serialized by the runtime: the caller must serialize     */
/* them. Every launch returns FLEX_SUCCESS (enqueued), or, having enqueued   */
/* nothing: FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (as      */
/* listed); FLEX_ERROR_STREAM_FAILED (the stream has failed);               */
/* FLEX_ERROR_SHUTDOWN (the stream needs shutdown); FLEX_ERROR_LAUNCH_FAILED */
/* (the runtime refused it).                                                */
/* ------------------------------------------------------------------------ */

/** Host-to-device copy of dst->total size bytes from `host_src` to `dst`.
 *  host_src must stay valid and unchanged (written neither by the host nor
 *  by another operation in flight, such as a D2H into overlapping bytes)
 *  until the completion callback is called. INVALID_ARGUMENT: host_src or dst NULL, empty or misaligned dst. */
flex_status_t flex_launch_h2d(flex_stream_t *stream, const void *host_src,
                              const flex_composite_address_t *dst,
                              int32_t pipeline_barrier,
                              flex_completion_t completion);

/** Device-to-host copy of src's total size bytes from `src` to `host_dst`.
 *  host_dst must stay valid, and must be neither read nor written by the
 *  host nor by another operation in flight (a D2H into overlapping bytes,
 *  on any stream, or an H2D from them), until the completion callback is
 *  called: two such operations would race. INVALID_ARGUMENT: a NULL
 *  pointer, an empty or misaligned src. */
flex_status_t flex_launch_d2h(flex_stream_t *stream,
                              const flex_composite_address_t *src,
                              void *host_dst, int32_t pipeline_barrier,
                              flex_completion_t completion);

/** Runs the compute program stored in device memory at `program` (loaded
 *  there with an H2D copy, as a binary would be). A program the device cannot
 *  run fails the operation with FLEX_ERROR_EXECUTION_FAILED.
 *  INVALID_ARGUMENT: program NULL, empty or misaligned. */
flex_status_t flex_launch_compute(flex_stream_t *stream,
                                  const flex_composite_address_t *program,
                                  int32_t pipeline_barrier,
                                  flex_completion_t completion);

/** Runs `host_fn(host_user_data)` on a runtime thread in stream order: it
 *  starts after every earlier operation on the stream has completed, and the
 *  stream does not advance until it returns. host_fn is called at most once;
 *  it is not called if the stream has failed before its turn. A status other
 *  than FLEX_SUCCESS from it fails the operation with
 *  FLEX_ERROR_HOST_CALLBACK_FAILED. host_user_data must stay valid until the
 *  completion callback is called. INVALID_ARGUMENT: host_fn NULL. */
flex_status_t flex_launch_host_callback(flex_stream_t *stream,
                                        flex_host_fn host_fn,
                                        void *host_user_data,
                                        int32_t pipeline_barrier,
                                        flex_completion_t completion);

/** Fills `dst` with `value` converted to `format` (rounded to nearest for
 *  FP16/FP32, saturated and truncated toward zero for the integers).
 *  INVALID_ARGUMENT: dst NULL, empty or misaligned; unknown format; a total
 *  size that is not a multiple of the element size. */
flex_status_t flex_launch_fill(flex_stream_t *stream,
                               const flex_composite_address_t *dst,
                               double value, flex_data_format_t format,
                               int32_t pipeline_barrier,
                               flex_completion_t completion);

/* ------------------------------------------------------------------------ */
/* Capabilities (ABI 1.1)                                                   */
/* ------------------------------------------------------------------------ */

/** A capability a runtime may have; queried with
 *  flex_runtime_get_capability. */
typedef int32_t flex_capability_t;
/** 1 if flex_stream_wait_event makes the stream wait on the device side
 *  (the call returns at once; the device holds the stream's later work);
 *  0 if the call instead blocks the calling host thread until the event has
 *  completed (the ordering is the same, but the host waits). */
#define FLEX_CAPABILITY_DEVICE_SIDE_WAIT 0
/** 1 if events created with FLEX_EVENT_TIMING take device timestamps, so
 *  flex_event_elapsed_time can work; 0 if it never can. */
#define FLEX_CAPABILITY_EVENT_TIMING 1

/** Writes the value of `capability` for this runtime to *value_out (0 or 1
 *  for the capabilities above). Returns FLEX_SUCCESS;
 *  FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (value_out NULL,
 *  or a capability this library does not know). */
flex_status_t flex_runtime_get_capability(flex_runtime_t *runtime,
                                          flex_capability_t capability,
                                          int32_t *value_out);

/** Writes the runtime's device memory, in bytes: to *free_out what is not
 *  taken by live allocations (fragmentation may make the largest single
 *  allocation smaller), to *total_out all of it. Returns FLEX_SUCCESS;
 *  FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (a NULL pointer;
 *  nothing is written). */
flex_status_t flex_runtime_get_memory_info(flex_runtime_t *runtime,
                                           uint64_t *free_out,
                                           uint64_t *total_out);

/* ------------------------------------------------------------------------ */
/* Events (ABI 1.1)                                                         */
/*                                                                          */
/* An event marks a point in a stream's FIFO. Recording it on a stream      */
/* captures exactly the work enqueued on that stream before the record;     */
/* the event completes when that work has completed. Recording again moves  */
/* the event: query, synchronize and later waits see only the latest        */
/* record, while a wait already enqueued keeps the record it saw. An event  */
/* never recorded is complete. If the recording stream fails before the     */
/* event's point, the record fails as an operation that never ran does:     */
/* its error (the "record's error" below) is FLEX_ERROR_STREAM_FAILED, its  */
/* message naming the stream's first error, or FLEX_ERROR_SHUTDOWN on a     */
/* stream that needs shutdown. A stream that waits on a failed event        */
/* fails with FLEX_ERROR_STREAM_FAILED (its message names the event's       */
/* stream) instead of waiting forever. A wait is work of the waiting        */
/* stream: until the record it waits for has completed, that stream's       */
/* query returns FLEX_NOT_READY and its synchronize blocks (unless the      */
/* stream has failed: they return its error, and nothing behind the wait    */
/* runs).                                                                   */
/* ------------------------------------------------------------------------ */

/** One marker in stream order. Opaque. */
typedef struct flex_event flex_event_t;

/** Flags of flex_event_create, OR-ed together. */
typedef int32_t flex_event_flags_t;
/** No flags: the event orders work but takes no timestamp (cheaper). */
#define FLEX_EVENT_DEFAULT 0
/** The event takes a device timestamp when it completes, for
 *  flex_event_elapsed_time. */
#define FLEX_EVENT_TIMING 1

/** Creates an event on the runtime, not yet recorded, and writes it to
 *  *event_out. Returns FLEX_SUCCESS; FLEX_ERROR_INVALID_HANDLE;
 *  FLEX_ERROR_INVALID_ARGUMENT (event_out NULL, or an unknown flag bit);
 *  FLEX_ERROR_RUNTIME_FAILED (no more events can be made). */
flex_status_t flex_event_create(flex_runtime_t *runtime,
                                flex_event_flags_t flags,
                                flex_event_t **event_out);

/** Destroys an event. Never blocks: work already enqueued that records or
 *  waits on the event is unaffected (pending waits are still honoured) and
 *  the event's resources are released when that work is done. The handle is
 *  invalid afterwards. Returns FLEX_SUCCESS or FLEX_ERROR_INVALID_HANDLE
 *  (NULL, or an event of another runtime). */
flex_status_t flex_event_destroy(flex_runtime_t *runtime,
                                 flex_event_t *event);

/** Records the event on `stream`: the event now marks the end of the work
 *  enqueued on the stream so far. `completion` follows flex_completion_fn:
 *  it is called once when the event completes (FLEX_SUCCESS) or fails (the
 *  record's error). Calls recording the same event from several threads at
 *  once are serialized by the library. Returns FLEX_SUCCESS (recorded), or,
 *  having changed nothing: FLEX_ERROR_INVALID_HANDLE;
 *  FLEX_ERROR_INVALID_ARGUMENT (the event and the stream belong to
 *  different runtimes); FLEX_ERROR_STREAM_FAILED; FLEX_ERROR_SHUTDOWN;
 *  FLEX_ERROR_LAUNCH_FAILED. */
flex_status_t flex_event_record(flex_event_t *event, flex_stream_t *stream,
                                flex_completion_t completion);

/** Makes every operation enqueued on `stream` after this call start only
 *  after the event's latest record (as of this call) has completed. A no-op
 *  for an event never recorded and for an event recorded on `stream`
 *  itself, but on a stream that has failed, which refuses every wait
 *  (FLEX_ERROR_STREAM_FAILED, FLEX_ERROR_SHUTDOWN). With FLEX_CAPABILITY_DEVICE_SIDE_WAIT the call returns at once,
 *  and the wait is work of the stream until the record has completed
 *  (flex_stream_query and flex_stream_synchronize see it); without it the
 *  call blocks until the event has completed. If the event has failed, the
 *  stream fails (see above). Returns FLEX_SUCCESS, or,
 *  having changed nothing: FLEX_ERROR_INVALID_HANDLE;
 *  FLEX_ERROR_INVALID_ARGUMENT (different runtimes);
 *  FLEX_ERROR_STREAM_FAILED; FLEX_ERROR_SHUTDOWN; FLEX_ERROR_LAUNCH_FAILED.
 *  Without device-side waits it must not be called from a completion
 *  callback or host function of the same runtime (FLEX_ERROR_UNSUPPORTED). */
flex_status_t flex_stream_wait_event(flex_stream_t *stream,
                                     flex_event_t *event);

/** Asks for `completion` to be called once when the event's latest record
 *  (as of this call) completes (FLEX_SUCCESS) or fails (the record's
 *  error), without adding anything to any stream: how a caller
 *  that did not ask for a completion when recording can still be told.
 *  If that record has already completed or failed, or the event was never
 *  recorded, writes 1 to *complete_out and never calls `completion`
 *  (user_data stays with the caller); else writes 0, and `completion`
 *  follows flex_completion_fn. Returns FLEX_SUCCESS;
 *  FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (complete_out
 *  NULL; nothing is registered then). */
flex_status_t flex_event_notify(flex_event_t *event,
                                flex_completion_t completion,
                                int32_t *complete_out);

/** Does not block. Returns FLEX_SUCCESS when the event's latest record has
 *  completed (or it was never recorded); FLEX_NOT_READY when it has not;
 *  the record's error if it failed;
 *  FLEX_ERROR_INVALID_HANDLE. */
flex_status_t flex_event_query(flex_event_t *event);

/** Blocks until the event's latest record (as of this call) has completed.
 *  Returns at once for an event never recorded. Returns FLEX_SUCCESS, the
 *  record's error if it failed, FLEX_ERROR_INVALID_HANDLE,
 *  or FLEX_ERROR_UNSUPPORTED when called from a completion callback or host
 *  function of the same runtime. */
flex_status_t flex_event_synchronize(flex_event_t *event);

/** Writes the device time from the completion of `start` to the completion
 *  of `end`, in nanoseconds, to *nanoseconds_out (negative when `end`
 *  completed first). Timestamps are taken when the device reaches each event
 *  in stream order, not when the host recorded it. Returns FLEX_SUCCESS;
 *  FLEX_ERROR_INVALID_HANDLE; FLEX_ERROR_INVALID_ARGUMENT (nanoseconds_out
 *  NULL, an event created without FLEX_EVENT_TIMING, an event never
 *  recorded, or events of different runtimes); FLEX_NOT_READY (an event has
 *  not completed); the record's error if a record failed;
 *  FLEX_ERROR_UNSUPPORTED when the runtime cannot time events
 *  (FLEX_CAPABILITY_EVENT_TIMING is 0). The last-error message names the
 *  precondition that failed. */
flex_status_t flex_event_elapsed_time(flex_event_t *start, flex_event_t *end,
                                      int64_t *nanoseconds_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLEX_H */
