// A move-only callable stored in a fixed inline buffer: no heap allocation, ever.
// Completion callbacks use it so that posting an operation never allocates.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

namespace talaria {

template <class Signature, std::size_t Capacity = 48>
class InplaceFunction;

template <class R, class... Args, std::size_t Capacity>
class InplaceFunction<R(Args...), Capacity> {
  public:
    InplaceFunction() noexcept = default;
    InplaceFunction(std::nullptr_t) noexcept {}  // NOLINT

    template <class F>
    requires(!std::is_same_v<std::decay_t<F>, InplaceFunction> &&
             std::is_invocable_r_v<R, std::decay_t<F>&, Args...>)
        InplaceFunction(F&& f) {  // NOLINT: implicit, like std::function
        using Fn = std::decay_t<F>;
        static_assert(sizeof(Fn) <= Capacity,
                      "callable too large for InplaceFunction: capture less or raise Capacity");
        static_assert(alignof(Fn) <= alignof(std::max_align_t), "over-aligned callable");
        static_assert(std::is_nothrow_move_constructible_v<Fn>, "callable must be nothrow-movable");
        ::new (static_cast<void*>(&storage_)) Fn(std::forward<F>(f));
        invoke_ = [](void* s, Args&&... args) -> R {
            return (*static_cast<Fn*>(s))(std::forward<Args>(args)...);
        };
        // Trivially copyable callables (lambdas capturing pointers and integers, the common
        // case on the fast path) move by copying the buffer: no indirect call, nothing to
        // destroy.
        if constexpr (!(std::is_trivially_copyable_v<Fn> && std::is_trivially_destructible_v<Fn>))
            manage_ = [](void* dst, void* src) noexcept {
                if (dst) ::new (dst) Fn(std::move(*static_cast<Fn*>(src)));
                static_cast<Fn*>(src)->~Fn();
            };
    }

    InplaceFunction(InplaceFunction&& o) noexcept { move_from(o); }
    InplaceFunction& operator=(InplaceFunction&& o) noexcept {
        if (this != &o) {
            reset();
            move_from(o);
        }
        return *this;
    }
    InplaceFunction(const InplaceFunction&) = delete;
    InplaceFunction& operator=(const InplaceFunction&) = delete;
    ~InplaceFunction() { reset(); }

    explicit operator bool() const noexcept { return invoke_ != nullptr; }

    R operator()(Args... args) { return invoke_(&storage_, std::forward<Args>(args)...); }

    void reset() noexcept {
        if (manage_) manage_(nullptr, &storage_);
        invoke_ = nullptr;
        manage_ = nullptr;
    }

  private:
    void move_from(InplaceFunction& o) noexcept {
        if (!o.invoke_) return;
        if (o.manage_)
            o.manage_(&storage_, &o.storage_);
        else
            std::memcpy(&storage_, &o.storage_, Capacity);
        invoke_ = o.invoke_;
        manage_ = o.manage_;
        o.invoke_ = nullptr;
        o.manage_ = nullptr;
    }

    alignas(std::max_align_t) unsigned char storage_[Capacity];
    R (*invoke_)(void*, Args&&...) = nullptr;
    void (*manage_)(void*, void*) noexcept = nullptr;
};

}  // namespace talaria

#pragma GCC visibility pop
