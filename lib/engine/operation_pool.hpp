// Where non-blocking operations live: a small per-thread free list of blocks, so that an
// isend/irecv does not go through malloc and free (which cost more than a small message's
// whole transfer once a window of 64 operations is alive, tcache being full). A block freed
// by another thread than the one that took it just joins that thread's list; a thread's list
// is freed when the thread ends. Under AddressSanitizer every block goes to operator new and
// delete, so that use-after-free of an operation is still caught.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define SHMDIST_POOL_OPERATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHMDIST_POOL_OPERATIONS 0
#endif
#endif
#ifndef SHMDIST_POOL_OPERATIONS
#define SHMDIST_POOL_OPERATIONS 1
#endif

namespace shmdist::engine {

namespace detail {
template <std::size_t Size>
class BlockCache {
 public:
  static void* take() {
    BlockCache& c = local();
    return c.count_ ? c.blocks_[--c.count_] : nullptr;
  }
  static bool give(void* p) {
    BlockCache& c = local();
    if (c.count_ == kCapacity) return false;
    c.blocks_[c.count_++] = p;
    return true;
  }
  // Leaves the cache empty: a take() after this thread's cache was destroyed (from another
  // thread_local's destructor) gets nothing instead of a freed block; a late give() leaks.
  ~BlockCache() {
    for (std::size_t i = 0; i < count_; ++i) ::operator delete(blocks_[i]);
    count_ = 0;
  }

 private:
  // A few windows of operations: an any-source receiver of 16 ranks' windows of 64 has 960
  // receives alive at once (8 KiB of pointers per thread that uses the engine).
  static constexpr std::size_t kCapacity = 1024;
  static BlockCache& local() {
    thread_local BlockCache cache;
    return cache;
  }
  void* blocks_[kCapacity];
  std::size_t count_ = 0;
};
}  // namespace detail

// A std::allocator for std::allocate_shared<Operation> (it allocates the shared_ptr's
// control block and the operation together, one block at a time).
template <class T>
struct PooledAllocator {
  using value_type = T;
  PooledAllocator() = default;
  template <class U>
  PooledAllocator(const PooledAllocator<U>&) {}  // NOLINT: rebinding, as allocators do

  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
#if SHMDIST_POOL_OPERATIONS
    if (n == 1)
      if (void* p = detail::BlockCache<sizeof(T)>::take()) return static_cast<T*>(p);
#endif
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, [[maybe_unused]] std::size_t n) {
#if SHMDIST_POOL_OPERATIONS
    if (n == 1 && detail::BlockCache<sizeof(T)>::give(p)) return;
#endif
    ::operator delete(p);
  }
  template <class U>
  friend bool operator==(const PooledAllocator&, const PooledAllocator<U>&) {
    return true;
  }
};

}  // namespace shmdist::engine
