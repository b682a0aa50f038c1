// torch-spyre's stream-pool locking discipline, re-implemented as the
// baseline of the pool benchmark (tests/benches/pool.rs): a
// std::shared_mutex guarding a std::unordered_map<int64_t, Handle*>;
// resolution takes a shared_lock and calls find; assignment takes a
// unique_lock, advances the cursor and inserts a handle on a miss.
// Written from the stream-ownership spec, not copied from torch-spyre.

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace {

struct Handle {
    int64_t id;
};

constexpr int64_t kStreamsPerPool = 32;
constexpr int64_t kNormalStart = 1;
constexpr int64_t kHighStart = 33;
constexpr int64_t kHostComputeStart = 65;
constexpr int64_t kHostComputeStreams = 4;

struct Pool {
    mutable std::shared_mutex mutex;
    std::unordered_map<int64_t, Handle*> stream_handle_map;
    int64_t next_low = 0;
    int64_t next_high = 0;
};

}  // namespace

extern "C" {

// A pool with the default stream and the host-compute streams mapped, as
// after initializeStreamPoolImpl.
void* cpp_pool_new() {
    auto* pool = new Pool();
    pool->stream_handle_map[0] = new Handle{0};
    for (int64_t i = 0; i < kHostComputeStreams; ++i) {
        int64_t id = kHostComputeStart + i;
        pool->stream_handle_map[id] = new Handle{id};
    }
    return pool;
}

void cpp_pool_free(void* raw) {
    auto* pool = static_cast<Pool*>(raw);
    for (auto& entry : pool->stream_handle_map) {
        delete entry.second;
    }
    delete pool;
}

// resolveRuntimeHandle: shared_lock, find; null when the id has no handle.
const void* cpp_pool_resolve(const void* raw, int64_t id) {
    const auto* pool = static_cast<const Pool*>(raw);
    std::shared_lock<std::shared_mutex> lock(pool->mutex);
    auto found = pool->stream_handle_map.find(id);
    return found == pool->stream_handle_map.end() ? nullptr : found->second;
}

// getStreamFromPool: unique_lock, advance the cursor, insert on a miss.
int64_t cpp_pool_stream_from_pool(void* raw, int32_t priority) {
    auto* pool = static_cast<Pool*>(raw);
    std::unique_lock<std::shared_mutex> lock(pool->mutex);
    int64_t& cursor = priority < 0 ? pool->next_high : pool->next_low;
    int64_t id = (priority < 0 ? kHighStart : kNormalStart) + cursor;
    cursor = (cursor + 1) % kStreamsPerPool;
    if (pool->stream_handle_map.find(id) == pool->stream_handle_map.end()) {
        pool->stream_handle_map[id] = new Handle{id};
    }
    return id;
}

}  // extern "C"
