// A poll set: epoll plus an eventfd for wake-ups from other threads.
#pragma once

#pragma GCC visibility push(default)  // public API: exported from libtalaria.so

#include <cstdint>
#include <span>

#include <sys/epoll.h>

#include "talaria/util/clock.hpp"
#include "talaria/util/result.hpp"

namespace talaria {

/// Owns an epoll fd and a wake-up eventfd (registered in the set with data.ptr == nullptr...
/// see wake()). Not thread-safe except wake(), which any thread may call.
class PollSet {
  public:
    static Result<PollSet> create();
    PollSet(PollSet&& o) noexcept;
    PollSet& operator=(PollSet&& o) noexcept;
    PollSet(const PollSet&) = delete;
    PollSet& operator=(const PollSet&) = delete;
    ~PollSet();

    /// Watch `fd` for `events` (EPOLLIN, EPOLLOUT, EPOLLET...); `cookie` comes back in wait().
    /// Cookies must not be nullptr (reserved for the wake-up eventfd).
    Result<void> add(int fd, uint32_t events, void* cookie);
    Result<void> modify(int fd, uint32_t events, void* cookie);
    Result<void> remove(int fd);

    struct Event {
        void* cookie;
        uint32_t events;
    };
    /// Wait until an fd is ready, wake() is called, or `timeout_ms` passes (-1: forever,
    /// 0: poll). Fills `out` and returns the number of fd events; a wake-up is consumed
    /// and counts as zero events. EINTR returns 0.
    Result<int> wait(std::span<Event> out, int timeout_ms);

    /// Wake a thread blocked in wait(). Async-signal-safe and thread-safe.
    void wake() noexcept;

    /// The epoll fd itself: readable when any watched fd is ready (nest it in another epoll).
    [[nodiscard]] int fd() const noexcept { return epfd_; }

  private:
    PollSet(int epfd, int evfd) : epfd_(epfd), evfd_(evfd) {}
    int epfd_ = -1;
    int evfd_ = -1;
};

}  // namespace talaria

#pragma GCC visibility pop
