// AddrTable: a transport's weak intern table of addresses (one AddrImpl per peer, so Addr
// equality is pointer equality), which never keeps an address alive by itself.
//
// Ownership: the table maps a key (the peer's name) to a raw AddrImpl pointer and holds no
// reference. An address lives while something holds an Addr on it: a user, a connection or
// peer state that is in use, a pending op, a queued message. When the last reference goes, the
// address's destructor calls remove(), which erases the entry only if it still points to that
// address (a lookup may already have replaced a dying address with a new one).
//
// Locking: the table has its own small lock (`mu_`), taken only around map operations, never
// while an Addr is released and never around a call out. So the destructor of an address may
// run on any thread, including inside the transport while it holds its own lock (a connection
// closing drops the last reference): lock order is always transport lock -> table lock, and
// the table lock is a leaf. find() and then add() of a missing key must run under the
// transport's lock (which serializes creators), so that two threads do not create two
// addresses for one key.
//
// A dying address (its count reached zero, its destructor not yet through remove()) stays
// allocated while find() looks at it: the destructor blocks on `mu_` before the memory goes.
// find() sees the zero count (AddrImpl::try_ref fails) and reports "absent"; the caller
// creates a new address and add() overwrites the entry.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>

#include "na/base/op.hpp"
#include "talaria/na/na.hpp"

namespace talaria::na {

class AddrTable {
  public:
    explicit AddrTable(bool thread_safe) noexcept : mu_(thread_safe) {}
    AddrTable(const AddrTable&) = delete;
    AddrTable& operator=(const AddrTable&) = delete;

    /// A new reference on the live address interned under `key`, or an empty Addr when there
    /// is none (or it is being destroyed).
    Addr find(std::string_view key) {
        std::lock_guard g(mu_);
        auto it = map_.find(key);
        if (it == map_.end() || !it->second->try_ref()) return {};
        return Addr::adopt(it->second);
    }

    /// Intern the new address `p` (no reference taken) under `key`, replacing a dying one. It
    /// counts as live until its destructor calls remove().
    void add(std::string_view key, AddrImpl* p) {
        live_.fetch_add(1, std::memory_order_relaxed);
        put(key, p);
    }
    /// Also intern the live address `p` under another name (an alias). Its destructor must
    /// call unlink() for it.
    void alias(std::string_view key, AddrImpl* p) { put(key, p); }

    /// From the destructor of `p`: erase its entry unless it was already replaced (and count
    /// it as no longer live).
    void remove(std::string_view key, const AddrImpl* p) noexcept {
        unlink(key, p);
        live_.fetch_sub(1, std::memory_order_relaxed);
    }
    /// Erase the entry `key` if it points to `p` (an alias, or an address that must no longer
    /// be found, e.g. a dead peer: the next lookup creates a new one). Never frees anything.
    void unlink(std::string_view key, const AddrImpl* p) noexcept {
        std::lock_guard g(mu_);
        auto it = map_.find(key);
        if (it != map_.end() && it->second == p) map_.erase(it);
    }

    /// Addresses created and not yet destroyed (for tests and diagnostics).
    [[nodiscard]] std::size_t live() const noexcept {
        return live_.load(std::memory_order_relaxed);
    }
    /// Entries in the table, aliases included.
    [[nodiscard]] std::size_t entries() {
        std::lock_guard g(mu_);
        return map_.size();
    }

  private:
    struct StrHash {
        using is_transparent = void;
        std::size_t operator()(std::string_view s) const noexcept {
            return std::hash<std::string_view>{}(s);
        }
    };
    void put(std::string_view key, AddrImpl* p) {
        std::lock_guard g(mu_);
        auto it = map_.find(key);
        if (it != map_.end())
            it->second = p;
        else
            map_.emplace(std::string(key), p);
    }

    MaybeMutex mu_;
    std::unordered_map<std::string, AddrImpl*, StrHash, std::equal_to<>> map_;
    std::atomic<std::size_t> live_{0};
};

/// Another handle on an address (equal to it: AddrImpl::canonical, which Addr's == compares),
/// one per connection or per context, so that the threads of different contexts do not all
/// write the one reference count of a peer they share. Keeps the canonical address alive.
struct AddrAlias final : AddrImpl {
    AddrAlias(Transport* t, AddrImpl* canonical) noexcept
        : AddrImpl(t, canonical), keep(canonical) {}
    Addr keep;
};

/// A new alias of `a`'s canonical address, owned by transport `t` (`a` itself when out of
/// memory). `a` must be an address of `t`.
inline Addr alias_of(Transport* t, const Addr& a) {
    auto* alias = new (std::nothrow) AddrAlias(t, a.impl()->canonical());
    return alias ? Addr(alias) : a;
}

}  // namespace talaria::na
