// sm transport setup: opening (names, stale files, listening socket), connections and their
// handshake, failure of dead peers, addresses, contexts and memory registration. The hot path
// is in sm_datapath.cpp.
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include <fmt/format.h>

#include "na/base/transports.hpp"
#include "na/sm/sm_transport.hpp"
#include "talaria/util/log.hpp"

namespace talaria::na {

Result<std::unique_ptr<Transport>> open_sm(std::string_view rest, const Options& o) {
    return sm::SmTransport::open(rest, o);
}

namespace sm {

namespace {

// epoll keys: the kind in the top byte, a connection id or context id below.
constexpr uint64_t kKeyListen = 1ull << 56;
constexpr uint64_t kKeyConn = 4ull << 56;
constexpr uint64_t kKeyLane = 8ull << 56;  ///< the doorbell of a destroyed context's lane
constexpr uint64_t kKeyMask = (1ull << 56) - 1;

std::string errno_text(int err) {
    return std::string(std::strerror(err));
}

bool pid_alive(pid_t pid) noexcept {
    return !process_gone(pid);
}

/// Closes an fd on scope exit unless released.
struct FdGuard {
    int fd = -1;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
    int release() noexcept { return std::exchange(fd, -1); }
};

/// sendmsg of one handshake packet with fds attached.
bool send_packet(int sock, const Handshake& m, const int* fds, int nfds, int flags) noexcept {
    std::byte buf[kHsMaxSize];
    std::size_t n = encode_handshake(m, buf);
    if (n == 0) return false;
    iovec iov{buf, n};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 3)] = {};
    if (nfds > 3) return false;
    if (nfds > 0) {
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * std::size_t(nfds));
        cmsghdr* cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * std::size_t(nfds));
        std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * std::size_t(nfds));
    }
    for (;;) {
        ssize_t r = ::sendmsg(sock, &mh, flags | MSG_NOSIGNAL);
        if (r == ssize_t(n)) return true;
        if (r < 0 && errno == EINTR) continue;
        return false;
    }
}

bool peer_cred(int sock, ucred& cr) noexcept {
    socklen_t len = sizeof cr;
    return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0;
}

/// A peer's registration table, mapped read-only (unmapped with it unless released).
struct RegsMap {
    const RegEntry* p = nullptr;
    RegsMap() = default;
    RegsMap(const RegsMap&) = delete;
    RegsMap& operator=(const RegsMap&) = delete;
    ~RegsMap() {
        if (p) ::munmap(const_cast<RegEntry*>(p), kRegsBytes);
    }
    const RegEntry* release() noexcept { return std::exchange(p, nullptr); }
};

/// Map the registration table `fd` a peer of uid `uid` sent: a regular file of kRegsBytes,
/// its own, sealed against shrinking (a shrink under our mapping would be a SIGBUS here).
bool map_regs(int fd, uid_t uid, RegsMap& out, std::string& why) {
    struct stat st {};
    struct statfs fs {};
    // tmpfs (a plain memfd): a hugetlbfs one could fault (SIGBUS) once its pages are gone.
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != off_t(kRegsBytes) ||
        st.st_uid != uid || ::fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
        why = fmt::format("registration table is not a tmpfs file of the peer's of {} bytes",
                          kRegsBytes);
        return false;
    }
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
        why = "registration table is not a memfd sealed against shrinking (F_SEAL_SHRINK)";
        return false;
    }
    void* m = ::mmap(nullptr, kRegsBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        why = fmt::format("mmap of its registration table: {}", errno_text(errno));
        return false;
    }
    out.p = static_cast<const RegEntry*>(m);
    return true;
}

/// Who holds the abstract name-lock socket `a` (bind said EADDRINUSE), for the error. Abstract
/// names carry no permissions, so another local user can take ours: the kernel says whose it is.
std::string lock_holder(const sockaddr_un& a, socklen_t len) {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return "already in use (its holder could not be asked)";
    int r;
    do {
        r = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), len);
    } while (r != 0 && errno == EINTR);
    const int err = errno;
    ucred cr{};
    const bool known = r == 0 && peer_cred(fd, cr);
    ::close(fd);
    if (known && cr.uid == ::geteuid())
        return fmt::format("already in use by a live process of this user (pid {})", cr.pid);
    if (known)
        return fmt::format(
            "held by another user's process (uid {}, pid {}), which took the name "
            "this user's endpoint needs",
            cr.uid, cr.pid);
    if (err == ECONNREFUSED)
        return "held by a socket that is not a Talaria endpoint (it does not listen): another "
               "local user may be squatting the name";
    return fmt::format("already in use (its holder could not be asked: {})", std::strerror(err));
}

/// Sockets of endpoint `name` in kShmDir: "talaria-sm-<pid>-<name>.sock" with a live pid.
std::vector<std::string> find_sockets(std::string_view name) {
    std::vector<std::string> out;
    std::string dir(kShmDir);
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    while (dirent* e = ::readdir(d)) {
        pid_t pid;
        std::string_view rest;
        std::string_view file(e->d_name);
        if (!parse_file_name(file, pid, rest)) continue;
        if (rest.size() != name.size() + 5 || rest.substr(0, name.size()) != name ||
            rest.substr(name.size()) != ".sock")
            continue;
        if (!pid_alive(pid)) continue;
        out.push_back(dir + "/" + std::string(file));
    }
    ::closedir(d);
    return out;
}

}  // namespace

bool parse_file_name(std::string_view file, pid_t& pid, std::string_view& rest) noexcept {
    if (file.substr(0, kFilePrefix.size()) != kFilePrefix) return false;
    file.remove_prefix(kFilePrefix.size());
    std::size_t i = 0;
    uint64_t v = 0;
    while (i < file.size() && i < 10 && file[i] >= '0' && file[i] <= '9')
        v = v * 10 + uint64_t(file[i++] - '0');
    if (i == 0 || i >= file.size() || file[i] != '-' || v == 0 || v > 0x7fffffff) return false;
    pid = pid_t(v);
    rest = file.substr(i + 1);
    return true;
}

std::size_t remove_stale_files(std::string_view dir_name) {
    std::string dir(dir_name);
    DIR* d = ::opendir(dir.c_str());
    if (!d) return 0;
    std::size_t removed = 0;
    pid_t self = ::getpid();
    while (dirent* e = ::readdir(d)) {
        pid_t pid;
        std::string_view rest;
        if (!parse_file_name(e->d_name, pid, rest) || pid == self) continue;
        if (!process_gone(pid)) continue;
        std::string path = dir + "/" + e->d_name;
        if (::unlink(path.c_str()) == 0) {
            ++removed;
            TALARIA_LOG(sm, info, "removed stale {} (its process {} no longer exists)", path, pid);
        }
    }
    ::closedir(d);
    return removed;
}

// --- open / close --------------------------------------------------------------------------------

SmTransport::SmTransport(const Options& o, std::string name)
    : addrs_(o.thread_safe),
      opts_(o),
      name_(std::move(name)),
      regs_mu_(o.thread_safe),
      setup_mu_(o.thread_safe),
      route_mu_(o.thread_safe),
      lanes_(o.max_contexts),
      broken_mu_(o.thread_safe) {}

Result<std::unique_ptr<Transport>> SmTransport::open(std::string_view rest, const Options& o) {
    std::string name;
    if (rest.empty()) {
        static std::atomic<uint32_t> counter{0};
        name = fmt::format("{}.{}", ::getpid(), counter.fetch_add(1));
    } else if (!name_valid(rest)) {
        return Error(Errc::address_invalid,
                     fmt::format("sm endpoint name '{}' is invalid: use 1-{} characters of "
                                 "[A-Za-z0-9._-], e.g. sm://server0, or sm:// for a generated one",
                                 rest, kMaxNameLen));
    } else {
        name = std::string(rest);
    }
    if (o.max_ops == 0)
        return Error(Errc::invalid_argument, "sm: Options::max_ops must be at least 1");
    std::unique_ptr<SmTransport> t(new SmTransport(o, std::move(name)));
    TALARIA_CHECK(t->init());
    return std::unique_ptr<Transport>(std::move(t));
}

Result<void> SmTransport::init() {
    pid_ = ::getpid();
    while (instance_ == 0)
        if (::getrandom(&instance_, sizeof instance_, 0) != ssize_t(sizeof instance_))
            instance_ = (uint64_t(pid_) << 32) ^ now_ns();
    probe_word_ = instance_;
    // The registration table: a memfd every peer maps read-only (pages committed as slots
    // are used), sealed so that nobody can shrink it under their mappings.
    // Our mapping is the only writable one: F_SEAL_FUTURE_WRITE, added once it exists, makes
    // the fd peers receive good for reading only (no write(), no writable mapping, no hole).
    regs_fd_ = ::memfd_create("talaria-sm-regs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (regs_fd_ < 0) return errno_error("sm: memfd_create for the registration table", errno);
    if (::fchmod(regs_fd_, 0600) != 0 || ::ftruncate(regs_fd_, off_t(kRegsBytes)) != 0 ||
        ::fcntl(regs_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
        return errno_error("sm: sizing and sealing the registration table", errno);
    void* regs = ::mmap(nullptr, kRegsBytes, PROT_READ | PROT_WRITE, MAP_SHARED, regs_fd_, 0);
    if (regs == MAP_FAILED) return errno_error("sm: mmap of the registration table", errno);
    regs_ = static_cast<RegEntry*>(regs);
    if (::fcntl(regs_fd_, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
        return errno_error(
            "sm: sealing the registration table against writes (F_SEAL_FUTURE_WRITE, "
            "Linux 5.1)",
            errno);
    free_regs_.reserve(kMaxRegistrations);  // mem_unregister() never allocates

    remove_stale_files(kShmDir);

    // The name lock: an abstract socket named after our uid and name. bind() is atomic, and
    // the kernel releases it when we die, so a live holder is a real conflict.
    lock_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (lock_fd_ < 0) return errno_error("sm: socket() for the name lock", errno);
    {
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::string lock_name = fmt::format("talaria-sm-lock-{}-{}", ::geteuid(), name_);
        std::memcpy(a.sun_path + 1, lock_name.data(), lock_name.size());
        auto len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + lock_name.size());
        if (::bind(lock_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0) {
            int err = errno;
            if (err == EADDRINUSE)
                return Error(Errc::address_in_use,
                             fmt::format("sm endpoint name '{}' is {}: pick another name, or sm:// "
                                         "for a generated one",
                                         name_, lock_holder(a, len)));
            return errno_error(fmt::format("sm: bind of the name lock for '{}'", name_), err);
        }
        // Listening (nobody is ever accepted) so that a process that finds the name taken can
        // ask the kernel who holds it (SO_PEERCRED of a connection to it).
        ::listen(lock_fd_, 1);
    }
    // We hold the name: any socket file still carrying it was left by a dead process.
    for (const auto& path : find_sockets(name_)) {
        TALARIA_LOG(sm, info, "removing {}: left by an earlier holder of name '{}'", path, name_);
        ::unlink(path.c_str());
    }

    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) return errno_error("sm: epoll_create1", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;

    if (opts_.listen) {
        sock_path_ = fmt::format("{}/{}{}-{}.sock", kShmDir, kFilePrefix, pid_, name_);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        if (sock_path_.size() >= sizeof a.sun_path)
            return Error(Errc::address_invalid,
                         fmt::format("sm socket path {} is too long", sock_path_));
        std::memcpy(a.sun_path, sock_path_.c_str(), sock_path_.size() + 1);
        listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (listen_fd_ < 0) return errno_error("sm: socket() for listening", errno);
        ::unlink(sock_path_.c_str());  // ours by pid and by the name lock
        if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
            int err = errno;
            sock_path_.clear();
            return errno_error(fmt::format("sm: bind {}/{}{}-{}.sock (is {} writable?)", kShmDir,
                                           kFilePrefix, pid_, name_, kShmDir),
                               err);
        }
        // Owner only: peers of other users cannot even connect. With Options::sm_group, that
        // group's too (and accept_locked checks each peer's group).
        if (opts_.sm_group >= 0) {
            if (::chown(sock_path_.c_str(), uid_t(-1), gid_t(opts_.sm_group)) != 0)
                return errno_error(fmt::format("sm: Options::sm_group {}: chown {} to that group "
                                               "(does this user belong to it?)",
                                               opts_.sm_group, sock_path_),
                                   errno);
            if (::chmod(sock_path_.c_str(), 0660) != 0)
                return errno_error(fmt::format("sm: chmod 0660 {}", sock_path_), errno);
        } else if (::chmod(sock_path_.c_str(), 0600) != 0) {
            return errno_error(fmt::format("sm: chmod 0600 {}", sock_path_), errno);
        }
        if (::listen(listen_fd_, SOMAXCONN) != 0)
            return errno_error(fmt::format("sm: listen on {}", sock_path_), errno);
        ev.data.u64 = kKeyListen;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0)
            return errno_error("sm: epoll_ctl(listening socket)", errno);
    }

    auto* self = new Peer(this, &addrs_, name_);
    self->self = true;
    self->identified = true;
    self->probed = true;
    self->pid = uint32_t(pid_);
    self->instance = instance_;
    self->regs = regs_;
    self->rma_ready.store(true, std::memory_order_release);
    self_ = Addr(self);
    pins_.push_back(self_);
    addrs_.add(name_, self);
    TALARIA_LOG(sm, debug, "opened sm://{} (pid {}, instance {:#x}, listen {})", name_, pid_,
                instance_, opts_.listen);
    return ok();
}

SmTransport::~SmTransport() {
    std::lock_guard g(setup_mu_);
    // Contexts are gone (the contract): drop what is still pending without completing it.
    std::vector<Conn*> all;
    for (auto& [id, c] : conns_)
        all.push_back(c);
    for (Conn* c : all) {
        close_conn(c, Errc::shutdown, false);
    }
    for (auto& a : pins_) {
        auto& rma = a.as<Peer>()->pending_rma;
        while (SmOp* op = rma.pop_front())
            op->releaser->release(op);
    }
    for (auto& x : lanes_) {
        if (!x) continue;
        Lane& l = *x;
        std::lock_guard lg(l.mu);
        for (auto* list : {&l.recvs, &l.expected_recvs})
            while (SmOp* op = list->pop_front())
                l.pool.release(op);
        {
            std::lock_guard rg(route_mu_);
            l.msgs.splice_back(l.inbox);
        }
        for (auto* list : {&l.msgs, &l.expected_msgs})
            while (Stashed* st = list->pop_front())
                stash_free(l, st);
        l.expected_bytes = 0;
    }
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (!sock_path_.empty()) ::unlink(sock_path_.c_str());
    if (epfd_ >= 0) ::close(epfd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
    self_.reset();
    pins_.clear();  // peers still held by a user (against the contract) stay in addrs_
    if (regs_) ::munmap(regs_, kRegsBytes);
    if (regs_fd_ >= 0) ::close(regs_fd_);
}

// --- contexts ------------------------------------------------------------------------------------

Result<std::unique_ptr<Context>> SmTransport::context_create(uint8_t id,
                                                             const ContextOptions& opts) {
    if (id >= opts_.max_contexts)
        return Error(Errc::invalid_argument,
                     fmt::format("sm: context id {} is not below Options::max_contexts ({})", id,
                                 opts_.max_contexts));
    // Declared before the lock: on an error return it is destroyed after the lock is released
    // (its destructor takes the lock, and finds the context never published).
    std::unique_ptr<SmContext> c;
    std::lock_guard g(setup_mu_);
    if (!lanes_[id]) {
        auto lane = std::make_unique<Lane>(id, opts_);
        if (lane->bell_fd < 0) return errno_error("sm: eventfd for a context's doorbell", errno);
        std::lock_guard rg(route_mu_);
        lanes_[id] = std::move(lane);
    }
    Lane& l = *lanes_[id];
    if (l.ctx) return Error(Errc::already_exists, fmt::format("sm: context {} already exists", id));
    c = std::make_unique<SmContext>(this, id, opts_.thread_safe, &l);
    c->set_takes_unexpected(opts.unexpected);
    if (c->event_fd() < 0) return Error(Errc::io_error, "sm: context eventfd creation failed");
    // The lane's doorbell (peers ring it; it travels in the handshake of each of its
    // connections) wakes a thread blocked on the context's wait_fd() too.
    if (!c->watch_fd(l.bell_fd)) return errno_error("sm: epoll_ctl(a context's doorbell)", errno);
    if (l.orphaned) {
        // Its connections are this context's again: its thread hears the doorbell now.
        ::epoll_ctl(epfd_, EPOLL_CTL_DEL, l.bell_fd, nullptr);
        l.orphaned = false;
    }
    std::lock_guard lg(l.mu);
    std::lock_guard rg(route_mu_);
    l.ctx = c.get();
    return std::unique_ptr<Context>(std::move(c));
}

void SmTransport::context_destroyed(SmContext* c) noexcept {
    std::lock_guard g(setup_mu_);
    Lane& l = c->lane();
    std::lock_guard lg(l.mu);
    if (l.ctx != c) return;
    {
        std::lock_guard rg(route_mu_);
        l.ctx = nullptr;
        l.msgs.splice_back(l.inbox);
        l.has_inbox.store(false, std::memory_order_relaxed);
    }
    // Its connections stay: peers must not take a context's end for the process's. poll_fds()
    // drains their rings from now on and hands what arrives to the contexts left; a context
    // created with this id again takes them back. Their bells now ring the transport's epoll
    // set, which every sleeping context watches, and stay armed (poll_orphan_locked).
    l.orphaned = true;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kKeyLane | l.id;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, l.bell_fd, &ev) != 0)
        TALARIA_LOG(sm, warn,
                    "sm://{}: epoll_ctl for the doorbell of destroyed context {}: {}: messages "
                    "to it wait for the next look at the sockets",
                    name_, l.id, errno_text(errno));
    for (Conn* conn : l.active)
        conn->rx->waiting.store(1, std::memory_order_seq_cst);
    while (Stashed* s = l.msgs.pop_front())
        stash_free(l, s);
    while (Stashed* s = l.expected_msgs.pop_front())
        stash_free(l, s);
    l.expected_bytes = 0;
    // The contract says cancel and drain first; drop leftovers rather than keep dangling ones.
    auto drop = [&](IntrusiveList<SmOp>& list) {
        std::size_t n = 0;
        list.for_each_safe([&](SmOp& op) {
            if (op.ctx != c) return;
            list.erase(op);
            op.list = nullptr;
            l.pool.release(&op);
            ++n;
        });
        return n;
    };
    drop(l.recvs);
    drop(l.expected_recvs);
    for (Conn* conn : l.active)
        l.pending_sends -= drop(conn->pending_sends);
    for (auto& a : pins_)
        drop(a.as<Peer>()->pending_rma);
}

// --- addresses -----------------------------------------------------------------------------------

Result<Peer*> SmTransport::intern_locked(std::string_view name) {
    // Every live Peer is pinned, so the reference find() takes is never the only one: dropping
    // it here cannot free the peer. A dead peer was unlinked from the table (fail_peer_locked).
    if (Addr a = addrs_.find(name)) return a.as<Peer>();
    auto* p = new Peer(this, &addrs_, std::string(name));
    pins_.push_back(Addr(p));
    addrs_.add(name, p);
    return p;
}

void SmTransport::sweep_peers_locked() {
    if (pins_.size() < sweep_at_) return;
    // Peers a posted recv_expected points at (SmOp::peer holds no reference). Other ops point
    // at peers with a connection (sends) or hold the user's reference while they run (put/get
    // to a peer without a connection wait on its pending_rma, which a connection serves).
    // Every lane stays locked until the peers are freed: a receive posted between the scan and
    // the free would otherwise point at a freed peer. (The only place that holds several lane
    // locks: taken in id order, under setup_mu_.)
    std::vector<std::unique_lock<MaybeSpinLock>> held;
    std::vector<const Peer*> used;
    for (auto& x : lanes_) {
        if (!x) continue;
        held.emplace_back(x->mu);
        for (const SmOp& op : x->expected_recvs)
            used.push_back(op.peer);
    }
    std::sort(used.begin(), used.end());
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pins_.size(); ++i) {
        auto* p = pins_[i].as<Peer>();
        // Under setup_mu_ a count of 1 (our pin) is stable: new references come only from
        // intern (under setup_mu_) and from connections (p has none, and lanes route only to
        // peers they have a connection with).
        bool unused = p->ref_count() == 1 && p->conns.empty() && p->pending_rma.empty() &&
                      !std::binary_search(used.begin(), used.end(), p);
        if (unused) {
            pins_[i].reset();  // destroys p (which leaves the table)
        } else {
            if (kept != i) pins_[kept] = std::move(pins_[i]);
            ++kept;
        }
    }
    pins_.resize(kept);
    sweep_at_ = std::max<std::size_t>(64, 2 * kept);
}

Result<Addr> SmTransport::addr_lookup(std::string_view address) {
    std::string_view name = address;
    if (name.substr(0, 5) == "sm://") name.remove_prefix(5);
    if (!name_valid(name))
        return Error(Errc::address_invalid,
                     fmt::format("'{}' is not an sm address: expected sm://<name> with a name of "
                                 "1-{} characters of [A-Za-z0-9._-]",
                                 address, kMaxNameLen));
    std::lock_guard g(setup_mu_);
    sweep_peers_locked();
    TALARIA_TRY(p, intern_locked(name));
    return Addr(p);
}

Addr SmTransport::addr_alias(const Addr& a) {
    if (!a || a.impl()->transport() != this) return a;
    return alias_of(this, a);
}

Addr SmTransport::addr_self() {
    return self_;
}

std::string SmTransport::addr_to_string(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    return "sm://" + peer_of(a)->name;
}

Addr SmTransport::addr_current(const Addr& a) {
    if (!a || a.impl()->transport() != this) return {};
    Peer* p = peer_of(a);  // `a` holds a reference: p outlives the sweep
    if (p->self || !p->dead.load(std::memory_order_acquire)) return {};
    // A dead peer stays dead (its Addr is its identity); whoever holds its name now (a server
    // restarted there, or nobody yet: connecting says so) is a new peer.
    std::lock_guard g(setup_mu_);
    sweep_peers_locked();
    auto r = intern_locked(p->name);
    if (!r) return {};
    return Addr(*r);
}

PeerIdentity SmTransport::peer_identity(const Addr& a) {
    PeerIdentity id;
    if (!a || a.impl()->transport() != this) return id;
    Peer* p = peer_of(a);
    std::lock_guard g(setup_mu_);
    if (!p->identified) return id;
    // The kernel's word (SO_PEERCRED at connect and accept; only this user, or with
    // Options::sm_group that group, is admitted), and the pid a peer's handshake claims is the
    // one the kernel reported (on_hello_locked).
    id.uid = p->self ? int64_t(::geteuid()) : int64_t(p->uid);
    id.pid = int64_t(p->pid);
    return id;
}

std::size_t SmTransport::addr_serialize_size(const Addr& a) {
    if (!a || a.impl()->transport() != this) return 0;
    return addr_wire_size(peer_of(a)->name);
}

Result<std::size_t> SmTransport::addr_serialize(const Addr& a, std::span<std::byte> out) {
    if (!a || a.impl()->transport() != this)
        return Error(Errc::invalid_argument, "sm addr_serialize: not an address of this transport");
    std::size_t n = encode_addr(peer_of(a)->name, out);
    if (n == 0)
        return Error(Errc::invalid_argument,
                     fmt::format("sm addr_serialize: buffer of {} bytes, need {}", out.size(),
                                 addr_wire_size(peer_of(a)->name)));
    return n;
}

Result<Addr> SmTransport::addr_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(name, decode_addr(in));
    std::lock_guard g(setup_mu_);
    sweep_peers_locked();
    TALARIA_TRY(p, intern_locked(name));
    return Addr(p);
}

// --- memory registration -------------------------------------------------------------------------

Result<MemHandle> SmTransport::mem_register(void* buf, std::size_t len, Access access) {
    if (!buf && len != 0)
        return Error(Errc::invalid_argument, "sm mem_register: null buffer with non-zero length");
    if (access != Access::read_only && access != Access::write_only && access != Access::read_write)
        return Error(Errc::invalid_argument,
                     "sm mem_register: access must be read_only, "
                     "write_only or read_write");
    MemWire w;
    w.access = access;
    w.pid = uint32_t(pid_);
    w.instance = instance_;
    w.base = reinterpret_cast<uint64_t>(buf);
    w.length = len;
    if (len > 0) {
        // An entry in the table peers check before each put/get: the region first, the key
        // (random, never 0) last, so that a reader never sees the key over another region.
        uint64_t key = 0;
        while (key == 0)
            if (::getrandom(&key, sizeof key, 0) != ssize_t(sizeof key))
                key = (uint64_t(now_ns()) * 0x9e3779b97f4a7c15ull) ^ instance_;
        {
            std::lock_guard g(regs_mu_);
            if (!free_regs_.empty()) {
                w.slot = free_regs_.back();
                free_regs_.pop_back();
            } else if (regs_top_ < kMaxRegistrations) {
                w.slot = regs_top_++;
            } else {
                return Error(Errc::no_memory,
                             fmt::format("sm mem_register: {} registrations are live in this "
                                         "transport, the most its table holds; deregister some "
                                         "(drop their MemHandles) first",
                                         kMaxRegistrations));
            }
        }
        RegEntry& e = regs_[w.slot];
        // Release stores: none is seen before the zero key of the slot's last deregistration
        // (no fences: ThreadSanitizer does not model them).
        __atomic_store_n(&e.base, w.base, __ATOMIC_RELEASE);
        __atomic_store_n(&e.length, w.length, __ATOMIC_RELEASE);
        __atomic_store_n(&e.access, uint64_t(access), __ATOMIC_RELEASE);
        __atomic_store_n(&e.key, key, __ATOMIC_RELEASE);
        w.key = key;
    }
    return MemHandle(std::make_unique<SmMem>(this, w, true));
}

SmMem::SmMem(SmTransport* t, const MemWire& w, bool local) noexcept
    : MemImpl(t, w.base, w.length, w.access, local),
      pid(w.pid),
      instance(w.instance),
      slot(w.slot),
      key(w.key),
      owner_(t) {}

SmMem::~SmMem() {
    if (local() && key != 0) owner_->mem_unregister(slot);
}

void SmTransport::mem_unregister(uint32_t slot) noexcept {
    // From here on a peer's check fails (a put/get it checked just before may still copy: a
    // peer is the same user, docs/architecture.md "Trust model").
    __atomic_store_n(&regs_[slot].key, uint64_t{0}, __ATOMIC_RELEASE);
    std::lock_guard g(regs_mu_);
    free_regs_.push_back(slot);
}

std::size_t SmTransport::mem_serialize_size(const MemHandle& h) {
    return h && h->transport() == this ? kMemWireSize : 0;
}

Result<std::size_t> SmTransport::mem_serialize(const MemHandle& h, std::span<std::byte> out) {
    if (!h || h->transport() != this)
        return Error(Errc::invalid_argument, "sm mem_serialize: not a handle of this transport");
    if (out.size() < kMemWireSize)
        return Error(
            Errc::invalid_argument,
            fmt::format("sm mem_serialize: buffer of {} bytes, need {}", out.size(), kMemWireSize));
    const auto* m = h.as<SmMem>();
    MemWire w{m->access(), m->pid, m->instance, m->base(), m->length(), m->slot, m->key};
    encode_mem(w, std::span<std::byte, kMemWireSize>(out.data(), kMemWireSize));
    return kMemWireSize;
}

Result<MemHandle> SmTransport::mem_deserialize(std::span<const std::byte> in) {
    TALARIA_TRY(w, decode_mem(in));
    return MemHandle(std::make_unique<SmMem>(this, w, false));
}

// --- connections ---------------------------------------------------------------------------------

bool SmTransport::admitted(const ucred& cr) const noexcept {
    return cr.uid == ::geteuid() || (opts_.sm_group >= 0 && cr.gid == gid_t(opts_.sm_group));
}

bool SmTransport::group_server(const ucred& cr, const std::string& path) const noexcept {
    // A server of another user that Options::sm_group admits: its socket file is its own and
    // given to that group (only a member, or root, can give a file to a group), the group we
    // name too. (Its process's effective group may be another one.)
    if (opts_.sm_group < 0) return false;
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && st.st_uid == cr.uid &&
           st.st_gid == gid_t(opts_.sm_group);
}

std::string SmTransport::who_is_admitted() const {
    if (opts_.sm_group < 0)
        return fmt::format(
            "sm peers must run as the same user (uid {}), or both ends must set "
            "Options::sm_group to a group they share",
            ::geteuid());
    return fmt::format("neither this user (uid {}) nor group {} (Options::sm_group)", ::geteuid(),
                       opts_.sm_group);
}

Result<void> SmTransport::ensure_route(Lane& l, Peer* peer, uint8_t remote_ctx) {
    std::lock_guard g(setup_mu_);
    if (peer->dead.load(std::memory_order_relaxed)) return ok();  // the post completes with it
    {
        std::lock_guard lg(l.mu);
        if (route_locked(l, peer, remote_ctx)) return ok();  // another thread connected it
    }
    TALARIA_TRY(c, connect_locked(l, peer, remote_ctx));
    (void)c;
    return ok();
}

Result<Conn*> SmTransport::connect_locked(Lane& l, Peer* peer, uint8_t remote_ctx) {
    auto c = open_conn_locked(l, peer, remote_ctx);
    if (!c) note(LinkEvent::connect_failed);
    return c;
}

Result<Conn*> SmTransport::open_conn_locked(Lane& l, Peer* peer, uint8_t remote_ctx) {
    auto paths = find_sockets(peer->name);
    if (paths.empty())
        return Error(
            Errc::unreachable,
            fmt::format("no sm endpoint 'sm://{}' on this host (no live {}/{}<pid>-{}.sock):"
                        " is the peer running, and did it open with Options::listen?",
                        peer->name, kShmDir, kFilePrefix, peer->name));
    FdGuard sock;
    ucred cr{};
    std::string why;
    Errc why_code = Errc::unreachable;
    for (const auto& path : paths) {
        // Non-blocking: a full listen backlog (a stopped peer) must not block a post_*.
        sock.fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sock.fd < 0) return errno_error("sm: socket()", errno);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::memcpy(a.sun_path, path.c_str(), std::min(path.size() + 1, sizeof a.sun_path - 1));
        int r;
        do {
            r = ::connect(sock.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
        } while (r != 0 && errno == EINTR);
        if (r == 0 && peer_cred(sock.fd, cr) && (admitted(cr) || group_server(cr, path))) break;
        if (r == 0) {
            why = fmt::format("{} belongs to uid {} (gid {}), {}", path, cr.uid, cr.gid,
                              who_is_admitted());
            why_code = Errc::permission_denied;
        } else if (errno == EAGAIN) {
            why = fmt::format(
                "the listen backlog of {} is full (is the peer progressing?): "
                "retry later",
                path);
            why_code = Errc::again;
        } else {
            why = fmt::format("connect {}: {}", path, errno_text(errno));
            if (errno == EACCES || errno == EPERM) why_code = Errc::permission_denied;
        }
        ::close(sock.release());
    }
    if (sock.fd < 0)
        return Error(why_code, fmt::format("cannot connect to sm://{}: {}", peer->name, why));

    // The segment: an owner-only memfd (shmem, like /dev/shm, but with no name to leak or clean
    // up), sealed against shrinking and growing before the peer gets it, so that neither side
    // can truncate the other's mapping into a SIGBUS. Passed over the socket with SCM_RIGHTS.
    std::string seg_name = fmt::format("{}{}-{}.{}", kFilePrefix, pid_, name_, next_seg_id_++);
    FdGuard seg_fd;
    seg_fd.fd = ::memfd_create(seg_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (seg_fd.fd < 0) return errno_error(fmt::format("sm: memfd_create {}", seg_name), errno);
    if (::fchmod(seg_fd.fd, 0600) != 0 || ::ftruncate(seg_fd.fd, off_t(kSegmentSize)) != 0)
        return errno_error(fmt::format("sm: size segment {} to {} bytes (shared memory full? "
                                       "see df /dev/shm)",
                                       seg_name, kSegmentSize),
                           errno);
    if (::fcntl(seg_fd.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        return errno_error(fmt::format("sm: sealing segment {}", seg_name), errno);
    void* seg = ::mmap(nullptr, kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd.fd, 0);
    if (seg == MAP_FAILED) return errno_error(fmt::format("sm: mmap {}", seg_name), errno);
    auto* base = static_cast<std::byte*>(seg);
    SegHeader h{};
    h.magic = kSegMagic;
    h.version = kVersion;
    h.ring_slots = kRingSlots;
    h.slot_size = kSlotSize;
    h.segment_size = kSegmentSize;
    h.creator_pid = uint32_t(pid_);
    std::memcpy(base, &h, sizeof h);
    for (std::size_t off : kRingCtlOffset)
        new (base + off) RingCtl{};

    Handshake m;
    m.type = HsType::hello;
    m.pid = uint32_t(pid_);
    m.instance = instance_;
    m.probe_addr = reinterpret_cast<uint64_t>(&probe_word_);
    m.name = name_;
    m.src_ctx = l.id;
    m.dst_ctx = remote_ctx;
    int fds[3] = {seg_fd.fd, l.bell_fd, regs_fd_};
    if (!send_packet(sock.fd, m, fds, 3, MSG_DONTWAIT)) {
        int err = errno;
        ::munmap(seg, kSegmentSize);
        return Error(Errc::unreachable, fmt::format("sm: sending the handshake to sm://{} failed:"
                                                    " {}",
                                                    peer->name, errno_text(err)));
    }

    auto* c = new Conn;
    c->id = next_conn_id_++;
    c->state = Conn::State::ack_wait;
    c->outbound = true;
    c->remote_ctx = remote_ctx;
    c->sock = sock.release();
    c->cred_pid = cr.pid;
    c->cred_uid = cr.uid;
    c->peer = peer;
    c->source = alias_of(this, Addr(peer));
    c->seg = seg;
    c->tx = reinterpret_cast<RingCtl*>(base + kRingCtlOffset[0]);
    c->tx_slots = base + kSlotsOffset[0];
    c->rx = reinterpret_cast<RingCtl*>(base + kRingCtlOffset[1]);
    c->rx_slots = base + kSlotsOffset[1];
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = kKeyConn | c->id;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, c->sock, &ev) != 0) {
        int err = errno;
        ::close(c->sock);
        ::munmap(seg, kSegmentSize);
        delete c;
        return errno_error("sm: epoll_ctl(connection)", err);
    }
    conns_.emplace(c->id, c);
    peer->conns.push_back(c);
    {
        std::lock_guard lg(l.mu);
        c->lane = &l;
        // A thread of the lane asleep now wants a bell for this ring too.
        c->rx->waiting.store(l.armed != 0 || l.try_armed ? 1 : 0, std::memory_order_seq_cst);
        l.active.push_back(c);
        l.routes.push_back({peer, remote_ctx, c});
        if (l.armed != 0 || l.try_armed) l.ring_own_bell();  // as in on_hello_locked
    }
    TALARIA_LOG(sm, debug, "sm://{}: context {} connected to sm://{} (pid {}) context {}, conn {}",
                name_, l.id, peer->name, cr.pid, remote_ctx, c->id);
    return c;
}

void SmTransport::accept_locked() {
    for (;;) {
        int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                TALARIA_LOG(sm, warn, "sm://{}: accept: {}", name_, errno_text(errno));
            return;
        }
        ucred cr{};
        if (!peer_cred(s, cr) || !admitted(cr)) {
            TALARIA_LOG(sm, warn, "sm://{}: refused a connection from uid {} gid {} (pid {}): {}",
                        name_, cr.uid, cr.gid, cr.pid, who_is_admitted());
            ::close(s);
            continue;
        }
        auto* c = new Conn;
        c->id = next_conn_id_++;
        c->state = Conn::State::hello_wait;
        c->sock = s;
        c->cred_pid = cr.pid;
        c->cred_uid = cr.uid;
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = kKeyConn | c->id;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, s, &ev) != 0) {
            TALARIA_LOG(sm, warn, "sm://{}: epoll_ctl: {}", name_, errno_text(errno));
            ::close(s);
            delete c;
            continue;
        }
        conns_.emplace(c->id, c);
    }
}

void SmTransport::on_socket_readable_locked(Conn* c) {
    while (!c->broken.load(std::memory_order_relaxed)) {
        alignas(8) std::byte buf[kHsMaxSize + 8];
        alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)];
        iovec iov{buf, sizeof buf};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctl;
        mh.msg_controllen = sizeof ctl;
        ssize_t n = ::recvmsg(c->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            fail_conn_later(c, Errc::disconnected, errno_text(errno));
            return;
        }
        int fds[8];
        int nfds = 0;
        for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            std::size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (std::size_t i = 0; i < k; ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                if (nfds < 8)
                    fds[nfds++] = fd;
                else
                    ::close(fd);
            }
        }
        auto close_fds = [&] {
            for (int i = 0; i < nfds; ++i)
                ::close(fds[i]);
            nfds = 0;
        };
        if (n == 0) {
            close_fds();
            fail_conn_later(c, Errc::disconnected, "the peer closed the connection");
            return;
        }
        if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
            close_fds();
            fail_conn_later(c, Errc::protocol_error, "oversized handshake packet");
            return;
        }
        auto m = decode_handshake(std::span<const std::byte>(buf, std::size_t(n)));
        if (!m) {
            close_fds();
            fail_conn_later(c, Errc::protocol_error, m.error().message());
            return;
        }
        switch (m->type) {
            case HsType::wake:
                if (nfds != 0) {
                    close_fds();
                    fail_conn_later(c, Errc::protocol_error, "wake packet carrying fds");
                }
                // Its only job was to make the lane poll its rings: ring the lane's doorbell
                // (another thread may have taken this packet while that lane went to sleep).
                if (c->lane) c->lane->ring_own_bell();
                break;
            case HsType::hello:
                if (c->outbound || c->state != Conn::State::hello_wait) {
                    close_fds();
                    fail_conn_later(c, Errc::protocol_error, "unexpected hello");
                    return;
                }
                on_hello_locked(c, *m, fds, nfds);
                break;
            case HsType::ack:
                if (!c->outbound || c->state != Conn::State::ack_wait) {
                    close_fds();
                    fail_conn_later(c, Errc::protocol_error, "unexpected ack");
                    return;
                }
                on_ack_locked(c, *m, fds, nfds);
                break;
        }
    }
}

void SmTransport::on_hello_locked(Conn* c, const Handshake& m, int* fds, int nfds) {
    auto reject = [&](std::string why) {
        for (int i = 0; i < nfds; ++i)
            ::close(fds[i]);
        fail_conn_later(c, Errc::protocol_error, fmt::format("hello from '{}': {}", m.name, why));
    };
    if (nfds != 3) return reject(fmt::format("{} fds attached, expected 3", nfds));
    if (pid_t(m.pid) != c->cred_pid)
        return reject(fmt::format("claims pid {} but the kernel says {}", m.pid, c->cred_pid));
    RegsMap regs;
    if (std::string why; !map_regs(fds[2], c->cred_uid, regs, why)) return reject(why);
    ::close(fds[2]);
    fds[2] = -1;
    struct stat st {};
    if (::fstat(fds[0], &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != off_t(kSegmentSize) ||
        st.st_uid != c->cred_uid || (st.st_mode & 077) != 0)
        return reject(
            fmt::format("segment is not an owner-only regular file of {} bytes", kSegmentSize));
    // Unsealed, the peer could shrink it under our mapping and crash us with SIGBUS.
    int seals = ::fcntl(fds[0], F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL))
        return reject("segment is not a memfd sealed against shrinking (F_SEAL_SHRINK)");
    void* seg = ::mmap(nullptr, kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (seg == MAP_FAILED) return reject(fmt::format("mmap: {}", errno_text(errno)));
    ::close(fds[0]);
    fds[0] = -1;
    SegHeader h;
    std::memcpy(&h, seg, sizeof h);
    if (!seg_header_valid(h)) {
        ::munmap(seg, kSegmentSize);
        ::close(fds[1]);
        fail_conn_later(c, Errc::protocol_error,
                        fmt::format("hello from '{}': segment header does not match this build's "
                                    "layout",
                                    m.name));
        return;
    }
    // The segment is ours to unmap from here on, and the eventfd ours to close.
    c->seg = seg;
    c->peer_evfd = fds[1];
    auto* base = static_cast<std::byte*>(seg);
    c->rx = reinterpret_cast<RingCtl*>(base + kRingCtlOffset[0]);
    c->rx_slots = base + kSlotsOffset[0];
    c->tx = reinterpret_cast<RingCtl*>(base + kRingCtlOffset[1]);
    c->tx_slots = base + kSlotsOffset[1];

    // Hellos create peers too (a peer may connect under ever new names): sweep here as well.
    // Safe: whoever is up the stack holds a reference on any Peer* it keeps (or its
    // connection does).
    sweep_peers_locked();
    Peer* p = *intern_locked(m.name);
    if (p->self && (m.pid != uint32_t(pid_) || m.instance != instance_)) {
        fail_conn_later(c, Errc::protocol_error,
                        fmt::format("pid {} connected claiming our own name '{}'", m.pid, m.name));
        return;
    }
    if (p->identified && (p->pid != m.pid || p->instance != m.instance)) {
        // A new incarnation of a peer we still consider connected: the old one is gone.
        TALARIA_LOG(sm, info, "sm://{}: sm://{} reconnected as pid {} (was pid {})", name_, m.name,
                    m.pid, p->pid);
        fail_peer_locked(p, Errc::disconnected);
        p = *intern_locked(m.name);
    }
    if (p->dead.load(std::memory_order_relaxed)) p = *intern_locked(m.name);
    if (!p->identified) {  // written once: lanes read them without a lock after rma_ready
        p->pid = m.pid;
        p->uid = uint32_t(c->cred_uid);
        p->instance = m.instance;
        if (!p->self) p->regs = regs.release();
        p->identified = true;
    }
    c->peer = p;
    c->source = alias_of(this, Addr(p));
    c->remote_ctx = m.src_ctx;

    Handshake ack;
    ack.type = HsType::ack;
    ack.pid = uint32_t(pid_);
    ack.instance = instance_;
    ack.probe_addr = reinterpret_cast<uint64_t>(&probe_word_);
    ack.name = name_;
    ack.dst_ctx = m.src_ctx;
    // The lane it joins: the context asked for, where it takes unexpected messages; else the
    // one its unexpected messages are routed to (deliver_locked hands them on if that
    // changes). So the context that answers a call to a context this process lacks, or to one
    // that takes no calls (the API's bulk context), holds the connection its answer goes back
    // on: a peer that does not listen cannot be connected to.
    Lane* l = nullptr;
    {
        std::lock_guard rg(route_mu_);
        auto ctx_of = [](const std::unique_ptr<Lane>& x) -> const Context* {
            return x ? x->ctx : nullptr;
        };
        if (auto* r = route_unexpected(lanes_, lanes_.size(), m.dst_ctx, ctx_of)) {
            l = r->get();
        } else if (m.dst_ctx < lanes_.size() && ctx_of(lanes_[m.dst_ctx])) {
            l = lanes_[m.dst_ctx].get();
        } else {
            for (auto& x : lanes_)
                if (ctx_of(x)) {
                    l = x.get();
                    break;
                }
        }
    }
    if (!l) {
        // No context at all: refuse this connection (not the peer): its sends fail with it.
        ack.status = uint8_t(Errc::not_found);
        send_packet(c->sock, ack, nullptr, 0, MSG_DONTWAIT);
        c->refused = true;
        fail_conn_later(c, Errc::not_found,
                        fmt::format("refused sm://{}: no context exists here", p->name));
        return;
    }
    ack.src_ctx = l->id;
    const int ack_fds[2] = {l->bell_fd, regs_fd_};
    if (!send_packet(c->sock, ack, ack_fds, 2, MSG_DONTWAIT)) {
        fail_conn_later(c, Errc::disconnected, fmt::format("sending ack: {}", errno_text(errno)));
        return;
    }
    p->conns.push_back(c);
    {
        std::lock_guard lg(l->mu);
        c->state = Conn::State::established;
        note(LinkEvent::accepted);
        c->lane = l;
        c->rx->waiting.store(l->armed != 0 || l->try_armed ? 1 : 0, std::memory_order_seq_cst);
        l->active.push_back(c);
        // Its replies go back on it, unless this lane already sends to that context elsewhere.
        if (!route_locked(*l, p, m.src_ctx)) l->routes.push_back({p, m.src_ctx, c});
        // A message may be in its ring already, published while nobody watched it (waiting
        // was 0): a sleeping thread of the lane must look.
        if (l->armed != 0 || l->try_armed) l->ring_own_bell();
    }
    TALARIA_LOG(sm, debug, "sm://{}: context {} accepted sm://{} (pid {}) context {}, conn {}",
                name_, l->id, p->name, p->pid, m.src_ctx, c->id);
    probe_rma_locked(p, m.probe_addr);
    run_pending_rma_locked(p);
}

void SmTransport::on_ack_locked(Conn* c, const Handshake& m, int* fds, int nfds) {
    auto reject = [&](Errc code, std::string why) {
        for (int i = 0; i < nfds; ++i)
            ::close(fds[i]);
        fail_conn_later(c, code, fmt::format("ack from sm://{}: {}", c->peer->name, why));
    };
    if (m.status != 0) {
        // Refused (the peer has no context): this connection ends, the peer is not dead.
        for (int i = 0; i < nfds; ++i)
            ::close(fds[i]);
        c->refused = true;
        fail_conn_later(c, Errc(m.status) == Errc::not_found ? Errc::not_found : Errc::unreachable,
                        fmt::format("sm://{} refused it: {}", c->peer->name,
                                    Errc(m.status) == Errc::not_found ? "it has no context"
                                                                      : errc_name(Errc(m.status))));
        return;
    }
    if (nfds != 2) return reject(Errc::protocol_error, fmt::format("{} fds, expected 2", nfds));
    if (m.name != c->peer->name)
        return reject(Errc::protocol_error, fmt::format("the endpoint is named '{}'", m.name));
    if (pid_t(m.pid) != c->cred_pid)
        return reject(Errc::protocol_error,
                      fmt::format("claims pid {} but the kernel says {}", m.pid, c->cred_pid));
    Peer* p = c->peer;
    if (p->identified && (p->pid != m.pid || p->instance != m.instance))
        return reject(Errc::protocol_error,
                      fmt::format("pid {} instance {:#x} differs from the pid {} instance {:#x} "
                                  "seen on another connection",
                                  m.pid, m.instance, p->pid, p->instance));
    RegsMap regs;
    if (std::string why; !map_regs(fds[1], c->cred_uid, regs, why))
        return reject(Errc::protocol_error, why);
    ::close(fds[1]);
    fds[1] = -1;
    if (!p->identified) {  // written once: lanes read them without a lock after rma_ready
        p->pid = m.pid;
        p->uid = uint32_t(c->cred_uid);
        p->instance = m.instance;
        if (!p->self) p->regs = regs.release();
        p->identified = true;
    }
    {
        std::lock_guard lg(c->lane->mu);
        c->peer_evfd = fds[0];
        c->state = Conn::State::established;
        note(LinkEvent::connected);
        // A doorbell we could not ring while the eventfd was unknown went out as a wake
        // packet; ring once more in case the peer armed its flag since.
        if (c->tx->waiting.exchange(0, std::memory_order_acq_rel) != 0) ring_bell(c);
    }
    probe_rma_locked(p, m.probe_addr);
    run_pending_rma_locked(p);
}

void SmTransport::probe_rma_locked(Peer* p, uint64_t probe_addr) {
    if (p->probed || p->dead.load(std::memory_order_relaxed)) return;
    p->probed = true;
    // Whatever the verdict, it is final once written: lanes read it after this flag.
    struct Publish {
        Peer* p;
        ~Publish() { p->rma_ready.store(true, std::memory_order_release); }
    } publish{p};
    uint64_t word = 0;
    iovec l{&word, sizeof word};
    iovec r{reinterpret_cast<void*>(probe_addr), sizeof word};
    ssize_t n = ::process_vm_readv(pid_t(p->pid), &l, 1, &r, 1, 0);
    int err = errno;
    if (n == ssize_t(sizeof word) && word == p->instance) return;
    if (n == ssize_t(sizeof word)) {
        // pid p->pid is not the process that connected (or lies about its probe word).
        p->rma_errc = Errc::protocol_error;
        p->rma_error = fmt::format(
            "sm://{} (pid {}) failed the identity check: its probe word "
            "does not hold its instance id",
            p->name, p->pid);
        for (Conn* c : p->conns)
            fail_conn_later(c, Errc::protocol_error, p->rma_error);
        return;
    }
    if (n < 0 && (err == EPERM || err == EACCES)) {
        p->rma_errc = Errc::permission_denied;
        p->rma_error = fmt::format(
            "sm put/get with sm://{} (pid {}) is not possible: the kernel refused "
            "process_vm_readv ({}). Cross-process memory access needs ptrace permission over the "
            "peer: check /proc/sys/kernel/yama/ptrace_scope (set it to 0 with `sysctl "
            "kernel.yama.ptrace_scope=0`; 1 only allows descendants), run both processes as the "
            "same user and keep them dumpable (no setuid, no PR_SET_DUMPABLE 0), or grant "
            "CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE); otherwise use tcp for bulk data",
            p->name, p->pid, errno_text(err));
    } else if (n < 0 && err == ENOSYS) {
        p->rma_errc = Errc::not_supported;
        p->rma_error = fmt::format(
            "sm put/get with sm://{} is not possible: process_vm_readv is not available (ENOSYS; "
            "a seccomp filter or an old kernel); use tcp for bulk data",
            p->name);
    } else if (n < 0 && err == ESRCH) {
        p->rma_errc = Errc::disconnected;
        p->rma_error = fmt::format("sm://{} (pid {}) has exited", p->name, p->pid);
    } else {
        p->rma_errc = Errc::protocol_error;
        p->rma_error = fmt::format(
            "sm://{} (pid {}) gave a probe address that cannot be read "
            "({})",
            p->name, p->pid, n < 0 ? errno_text(err) : "short read");
    }
    if (p->rma_errc == Errc::disconnected)
        TALARIA_LOG(sm, info, "{}", p->rma_error);
    else
        TALARIA_LOG(sm, warn, "{}", p->rma_error);
}

void SmTransport::run_pending_rma_locked(Peer* p) {
    while (SmOp* op = p->pending_rma.pop_front()) {
        op->list = nullptr;
        Errc st = p->rma_errc;
        if (st == Errc::ok) {
            if (op->remote_pid != p->pid || op->remote_instance != p->instance) {
                TALARIA_LOG(sm, warn,
                            "sm {}: the remote handle belongs to pid {}, not to sm://{}"
                            " (pid {})",
                            op_type_name(op->completion.type), op->remote_pid, p->name, p->pid);
                st = Errc::invalid_argument;
            } else {
                st = exec_rma(*op);
            }
        } else {
            TALARIA_LOG(sm, warn, "{}", p->rma_error);
        }
        complete_op(op, st);
    }
}

void SmTransport::send_wake(Conn* c) noexcept {
    Handshake m;
    m.type = HsType::wake;
    send_packet(c->sock, m, nullptr, 0, MSG_DONTWAIT);
}

// --- failures ------------------------------------------------------------------------------------

void SmTransport::fail_conn_later(Conn* c, Errc why, std::string_view reason) noexcept {
    if (c->broken.exchange(true, std::memory_order_acq_rel)) return;
    c->fail_why = why;  // read by process_broken_locked() after broken_mu_
    {
        std::lock_guard g(broken_mu_);
        broken_.push_back(c->id);  // on failure to grow, process_broken_locked() sweeps conns_
    }
    any_broken_.store(true, std::memory_order_seq_cst);
    const char* who = c->peer ? c->peer->name.c_str() : "(handshake pending)";
    if (why == Errc::protocol_error)
        TALARIA_LOG(sm, warn, "sm://{}: disconnecting {} (conn {}): protocol_error: {}", name_, who,
                    c->id, reason);
    else
        TALARIA_LOG(sm, info, "sm://{}: connection {} with {} lost: {}", name_, c->id, who, reason);
}

void SmTransport::process_broken_locked() {
    while (any_broken_.exchange(false, std::memory_order_acq_rel)) {
        std::vector<uint64_t> ids;
        {
            std::lock_guard g(broken_mu_);
            ids.swap(broken_);
        }
        for (uint64_t id : ids) {
            auto it = conns_.find(id);
            if (it == conns_.end()) continue;
            Conn* c = it->second;
            // Messages the peer published before it died are still good.
            if (c->fail_why != Errc::protocol_error && c->rx_slots && c->lane) {
                std::lock_guard lg(c->lane->mu);
                ring_drain(c);
            }
            if (c->refused) {
                // This connection alone ends; put/get waiting for a handshake with the peer
                // have none left to wait for.
                Peer* p = c->peer;
                close_conn(c, c->fail_why, true);
                if (p && p->conns.empty() && !p->rma_ready.load(std::memory_order_relaxed)) {
                    while (SmOp* op = p->pending_rma.pop_front()) {
                        op->list = nullptr;
                        complete_op(op, Errc::unreachable);
                    }
                }
            } else if (c->peer) {
                fail_peer_locked(c->peer, Errc::disconnected);
                // A connection not yet counted among the peer's (its ack failed) is still here.
                if (conns_.contains(id)) {
                    close_conn(c, Errc::disconnected, true);
                }
            } else {
                close_conn(c, Errc::disconnected, true);
            }
        }
    }
}

void SmTransport::fail_peer_locked(Peer* p, Errc why) {
    auto conns = p->conns;
    for (Conn* c : conns) {
        close_conn(c, why, true);
    }
    p->conns.clear();
    if (p->self) return;  // never declare ourselves dead: a new self connection is made on use
    if (p->dead.load(std::memory_order_relaxed)) return;
    // Dead first, then the lanes' receives (under their locks): post_recv_expected() either
    // sees the flag or has queued its receive where we look.
    p->dead.store(true, std::memory_order_seq_cst);
    p->mark_superseded();  // another process may take its name: addr_current says who
    for (auto& x : lanes_) {
        if (!x) continue;
        std::lock_guard lg(x->mu);
        x->expected_recvs.for_each_safe([&](SmOp& op) {
            if (op.peer != p) return;
            x->expected_recvs.erase(op);
            op.list = nullptr;
            complete_op(&op, why);
        });
    }
    while (SmOp* op = p->pending_rma.pop_front()) {
        op->list = nullptr;
        complete_op(op, why);
    }
    // Lookups from now on make a new Peer; this one stays (pinned) while anything uses it,
    // and the next sweep frees it once nothing does.
    addrs_.unlink(p->name, p);
    TALARIA_LOG(sm, info, "sm://{}: peer sm://{} (pid {}) is gone: {}", name_, p->name, p->pid,
                errc_name(why));
}

void SmTransport::close_conn(Conn* c, Errc why, bool complete) noexcept {
    std::unique_lock<MaybeSpinLock> lg;
    if (c->lane) lg = std::unique_lock(c->lane->mu);
    close_conn_locked(c, why, complete);
}

void SmTransport::close_conn_locked(Conn* c, Errc why, bool complete) noexcept {
    if (why != Errc::shutdown && why != Errc::canceled) {  // else this side closes it
        if (c->state == Conn::State::established)
            note(LinkEvent::lost);
        else if (c->state == Conn::State::ack_wait)  // ours, refused or gone before its ack
            note(LinkEvent::connect_failed);
    }
    if (Lane* l = c->lane) {
        if (c->paused) {
            c->paused = false;
            --l->paused;
        }
        while (SmOp* op = c->pending_sends.pop_front()) {
            op->list = nullptr;
            --l->pending_sends;
            if (complete)
                complete_op(op, why);
            else
                l->pool.release(op);
        }
        auto a = std::find(l->active.begin(), l->active.end(), c);
        if (a != l->active.end()) l->active.erase(a);
        std::erase_if(l->routes, [c](const Lane::Route& r) { return r.conn == c; });
        l->last_route = 0;
    }
    ::close(c->sock);  // also leaves the epoll set
    if (c->peer_evfd >= 0) ::close(c->peer_evfd);
    if (c->seg) ::munmap(c->seg, kSegmentSize);
    conns_.erase(c->id);
    if (Peer* p = c->peer) {
        auto pc = std::find(p->conns.begin(), p->conns.end(), c);
        if (pc != p->conns.end()) p->conns.erase(pc);
    }
    delete c;
}

// --- events --------------------------------------------------------------------------------------

void SmTransport::handle_event_locked(uint64_t key, uint32_t events) {
    uint64_t kind = key & ~kKeyMask;
    if (kind == kKeyListen) {
        accept_locked();
    } else if (kind == kKeyLane) {
        // A destroyed context's lane was rung: drain the bell; poll_fds() drains its rings.
        uint64_t id = key & kKeyMask;
        if (id < lanes_.size() && lanes_[id]) {
            uint64_t v;
            while (::read(lanes_[id]->bell_fd, &v, sizeof v) > 0) {
            }
        }
    } else if (kind == kKeyConn) {
        auto it = conns_.find(key & kKeyMask);
        if (it == conns_.end()) return;
        Conn* c = it->second;
        if (events & EPOLLIN) on_socket_readable_locked(c);
        if (!c->broken.load(std::memory_order_relaxed) && (events & (EPOLLHUP | EPOLLERR)))
            fail_conn_later(c, Errc::disconnected, "hang-up on the socket");
    }
}

void SmTransport::poll_fds(bool wait) {
    touch::Pause off_call_path;  // every 100 µs, or on a socket event: not per message
    std::unique_lock g(setup_mu_, std::defer_lock);
    if (wait) {
        g.lock();
    } else if (!g.try_lock()) {
        return;  // another context's thread is at it
    }
    epoll_event evs[32];
    int n = ::epoll_wait(epfd_, evs, 32, 0);
    for (int i = 0; i < n; ++i)
        handle_event_locked(evs[i].data.u64, evs[i].events);
    process_broken_locked();
    for (auto& x : lanes_) {
        if (!x || !x->orphaned) continue;
        std::lock_guard lg(x->mu);
        poll_orphan_locked(*x);
    }
}

}  // namespace sm
}  // namespace talaria::na
