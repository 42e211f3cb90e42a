#include "talaria/util/poll_set.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace talaria {

Result<PollSet> PollSet::create() {
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return errno_error("epoll_create1", errno);
    int ev = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ev < 0) {
        int e = errno;
        ::close(ep);
        return errno_error("eventfd", e);
    }
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = nullptr;
    if (::epoll_ctl(ep, EPOLL_CTL_ADD, ev, &e) < 0) {
        int err = errno;
        ::close(ep);
        ::close(ev);
        return errno_error("epoll_ctl(eventfd)", err);
    }
    return PollSet(ep, ev);
}

PollSet::PollSet(PollSet&& o) noexcept
    : epfd_(std::exchange(o.epfd_, -1)), evfd_(std::exchange(o.evfd_, -1)) {}

PollSet& PollSet::operator=(PollSet&& o) noexcept {
    if (this != &o) {
        // Close ours directly: calling ~PollSet() on a live object and then assigning its
        // members is undefined behaviour.
        if (epfd_ >= 0) ::close(epfd_);
        if (evfd_ >= 0) ::close(evfd_);
        epfd_ = std::exchange(o.epfd_, -1);
        evfd_ = std::exchange(o.evfd_, -1);
    }
    return *this;
}

PollSet::~PollSet() {
    if (epfd_ >= 0) ::close(epfd_);
    if (evfd_ >= 0) ::close(evfd_);
}

static Result<void> ctl(int epfd, int op, int fd, uint32_t events, void* cookie, const char* what) {
    if (op != EPOLL_CTL_DEL && cookie == nullptr)
        return Error(Errc::invalid_argument, "PollSet: cookie must not be nullptr");
    epoll_event e{};
    e.events = events;
    e.data.ptr = cookie;
    if (::epoll_ctl(epfd, op, fd, &e) < 0) return errno_error(what, errno);
    return ok();
}

Result<void> PollSet::add(int fd, uint32_t events, void* cookie) {
    return ctl(epfd_, EPOLL_CTL_ADD, fd, events, cookie, "epoll_ctl(ADD)");
}
Result<void> PollSet::modify(int fd, uint32_t events, void* cookie) {
    return ctl(epfd_, EPOLL_CTL_MOD, fd, events, cookie, "epoll_ctl(MOD)");
}
Result<void> PollSet::remove(int fd) {
    return ctl(epfd_, EPOLL_CTL_DEL, fd, 0, nullptr, "epoll_ctl(DEL)");
}

Result<int> PollSet::wait(std::span<Event> out, int timeout_ms) {
    constexpr int kMax = 64;
    epoll_event evs[kMax];
    int max = static_cast<int>(out.size() < kMax ? out.size() : kMax);
    if (max == 0) return Error(Errc::invalid_argument, "PollSet::wait: empty output span");
    int n = ::epoll_wait(epfd_, evs, max, timeout_ms);
    if (n < 0) {
        if (errno == EINTR) return 0;
        return errno_error("epoll_wait", errno);
    }
    int k = 0;
    for (int i = 0; i < n; ++i) {
        if (evs[i].data.ptr == nullptr) {  // the wake-up eventfd: consume it
            uint64_t v;
            while (::read(evfd_, &v, sizeof v) > 0) {
            }
            continue;
        }
        out[k++] = Event{evs[i].data.ptr, evs[i].events};
    }
    return k;
}

void PollSet::wake() noexcept {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = ::write(evfd_, &one, sizeof one);
}

}  // namespace talaria
