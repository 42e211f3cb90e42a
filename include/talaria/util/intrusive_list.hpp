// Intrusive doubly-linked list and FIFO: the element embeds a ListHook, so linking never
// allocates. The list does not own its elements.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cassert>
#include <cstddef>

namespace talaria {

/// Derive from ListHook<Tag> once per list an object can be on at the same time
/// (distinct tags); `struct Op : ListHook<> {...}` for the common single-list case.
template <class Tag = void>
struct ListHook {
    ListHook* prev = nullptr;
    ListHook* next = nullptr;
    [[nodiscard]] bool linked() const noexcept { return next != nullptr; }
};

/// Circular doubly-linked list of T, linked through its ListHook<Tag> base.
template <class T, class Tag = void>
class IntrusiveList {
    using Hook = ListHook<Tag>;

  public:
    IntrusiveList() noexcept { head_.prev = head_.next = &head_; }
    IntrusiveList(const IntrusiveList&) = delete;
    IntrusiveList& operator=(const IntrusiveList&) = delete;
    IntrusiveList(IntrusiveList&& o) noexcept : IntrusiveList() { splice_back(o); }
    ~IntrusiveList() { clear(); }

    [[nodiscard]] bool empty() const noexcept { return head_.next == &head_; }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }

    void push_back(T& v) noexcept { insert_before(&head_, hook(v)); }
    void push_front(T& v) noexcept { insert_before(head_.next, hook(v)); }
    T* front() noexcept { return empty() ? nullptr : owner(head_.next); }
    T* back() noexcept { return empty() ? nullptr : owner(head_.prev); }
    T* pop_front() noexcept {
        if (empty()) return nullptr;
        T* v = owner(head_.next);
        erase(*v);
        return v;
    }
    /// The element before `v` (which must be on this list), or nullptr when `v` is the first.
    T* prev_of(T& v) noexcept {
        Hook* p = hook(v)->prev;
        return p == &head_ ? nullptr : owner(p);
    }
    /// Unlink `v`, which must be on this list.
    void erase(T& v) noexcept {
        Hook* h = hook(v);
        assert(h->linked());
        h->prev->next = h->next;
        h->next->prev = h->prev;
        h->prev = h->next = nullptr;
        --size_;
    }
    /// Move every element of `o` to the back of this list (no-op when `o` is this list).
    void splice_back(IntrusiveList& o) noexcept {
        if (&o == this || o.empty()) return;
        Hook* first = o.head_.next;
        Hook* last = o.head_.prev;
        first->prev = head_.prev;
        head_.prev->next = first;
        last->next = &head_;
        head_.prev = last;
        size_ += o.size_;
        o.head_.prev = o.head_.next = &o.head_;
        o.size_ = 0;
    }
    /// Unlink everything (elements are not destroyed).
    void clear() noexcept {
        while (pop_front()) {
        }
    }

    class iterator {
      public:
        explicit iterator(Hook* h) : h_(h) {}
        T& operator*() const { return *owner(h_); }
        T* operator->() const { return owner(h_); }
        iterator& operator++() {
            h_ = h_->next;
            return *this;
        }
        bool operator==(const iterator& o) const { return h_ == o.h_; }

      private:
        Hook* h_;
    };
    iterator begin() noexcept { return iterator(head_.next); }
    iterator end() noexcept { return iterator(&head_); }

    /// Call f(T&) for each element; f may erase the element it is given.
    template <class F>
    void for_each_safe(F&& f) {
        for (Hook* h = head_.next; h != &head_;) {
            Hook* next = h->next;
            f(*owner(h));
            h = next;
        }
    }

  private:
    static Hook* hook(T& v) noexcept { return static_cast<Hook*>(&v); }
    static T* owner(Hook* h) noexcept { return static_cast<T*>(h); }
    void insert_before(Hook* pos, Hook* h) noexcept {
        assert(!h->linked());
        h->next = pos;
        h->prev = pos->prev;
        pos->prev->next = h;
        pos->prev = h;
        ++size_;
    }

    Hook head_;
    std::size_t size_ = 0;
};

}  // namespace talaria

#pragma GCC visibility pop
