// A fixed-size object pool: storage for `capacity` objects allocated once, a free list
// threaded through the free slots. acquire()/release() never touch the heap.
// Not thread-safe: keep one per context (or guard it yourself).
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cassert>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace talaria {

template <class T>
class ObjectPool {
    union Slot {
        Slot* next;
        alignas(T) unsigned char storage[sizeof(T)];
    };

  public:
    explicit ObjectPool(std::size_t capacity)
        : slots_(std::make_unique<Slot[]>(capacity)), capacity_(capacity) {
        for (std::size_t i = 0; i < capacity; ++i)
            slots_[i].next = (i + 1 < capacity) ? &slots_[i + 1] : nullptr;
        free_ = capacity ? &slots_[0] : nullptr;
    }
    ObjectPool(const ObjectPool&) = delete;
    ObjectPool& operator=(const ObjectPool&) = delete;
    /// All objects must have been released.
    ~ObjectPool() { assert(in_use_ == 0); }

    /// Construct a T in a free slot; nullptr when the pool is exhausted (back-pressure).
    template <class... Args>
    T* acquire(Args&&... args) {
        if (!free_) return nullptr;
        Slot* s = free_;
        free_ = s->next;
        ++in_use_;
        return ::new (static_cast<void*>(s->storage)) T(std::forward<Args>(args)...);
    }

    /// Like acquire() with no arguments, but default-initializes the T (`new T`, not `new T()`):
    /// a class with member initializers gets exactly those, without first zero-filling the whole
    /// object; members without initializers are left indeterminate.
    T* acquire_default() {
        if (!free_) return nullptr;
        Slot* s = free_;
        free_ = s->next;
        ++in_use_;
        return ::new (static_cast<void*>(s->storage)) T;
    }

    /// Destroy `p` (from this pool) and return its slot.
    void release(T* p) noexcept {
        assert(owns(p));
        p->~T();
        Slot* s = reinterpret_cast<Slot*>(p);
        s->next = free_;
        free_ = s;
        --in_use_;
    }

    [[nodiscard]] bool owns(const T* p) const noexcept {
        auto* b = reinterpret_cast<const unsigned char*>(slots_.get());
        auto* q = reinterpret_cast<const unsigned char*>(p);
        return q >= b && q < b + capacity_ * sizeof(Slot) &&
               (std::size_t(q - b) % sizeof(Slot)) == 0;
    }
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    [[nodiscard]] std::size_t in_use() const noexcept { return in_use_; }
    [[nodiscard]] std::size_t available() const noexcept { return capacity_ - in_use_; }

  private:
    std::unique_ptr<Slot[]> slots_;
    std::size_t capacity_;
    Slot* free_ = nullptr;
    std::size_t in_use_ = 0;
};

}  // namespace talaria

#pragma GCC visibility pop
