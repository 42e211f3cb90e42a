// Keeps the process's signal dispositions as they were across a transport library's set-up.
//
// A library leaves a process's signals as it found them. Some fabric libraries do not: loading
// libfabric loads libinfinipath (its PSM provider), whose constructor installs handlers for
// SIGTERM, SIGINT, SIGSEGV, SIGBUS, SIGILL and SIGABRT that exit the process, so an application's
// own SIGTERM handler (a graceful stop) never runs; UCX's libucs takes SIGSEGV, SIGBUS, SIGILL,
// SIGFPE and SIGHUP as it loads. A KeepSignals on the stack around such a set-up (a plugin's
// dlopen, a provider's open) reads the dispositions of the signals an application handles when it
// is made, and puts back, when it goes, each one that the set-up changed, saying so in the log at
// debug.
//
// Signal dispositions are the process's: two threads setting up at once would each restore what
// it read, and one could read the other's library's handler as the application's. So every
// KeepSignals holds one process-wide mutex for its life (the only process-wide state of the na
// layer, as the dispositions it guards are). A handler the application changes in another thread
// while a transport opens is put back as it was when the open began.
//
// Header-only: both libtalaria and the transport plugins (which reach only what libtalaria
// exports) use it.
#pragma once

#include <csignal>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "talaria/util/log.hpp"

namespace talaria::na {

class KeepSignals {
  public:
    /// `who` names the set-up in the log ("libfabric's providers").
    explicit KeepSignals(std::string who) : who_(std::move(who)), hold_(mutex()) {
        for (std::size_t i = 0; i < kCount; ++i)
            saved_ok_[i] = ::sigaction(kSignals[i], nullptr, &saved_[i]) == 0;
    }
    ~KeepSignals() { restore(); }
    KeepSignals(const KeepSignals&) = delete;
    KeepSignals& operator=(const KeepSignals&) = delete;

    /// The signals kept: those an application installs handlers for to stop cleanly or to
    /// report a crash, and those a library may take for itself.
    static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSEGV,
                                       SIGBUS,  SIGILL, SIGFPE, SIGABRT, SIGPIPE, SIGCHLD, SIGALRM};
    static constexpr std::size_t kCount = sizeof kSignals / sizeof kSignals[0];

    /// Put back what changed since the constructor (also done by the destructor). Returns how
    /// many dispositions were put back.
    unsigned restore() noexcept {
        unsigned undone = 0;
        for (std::size_t i = 0; i < kCount; ++i) {
            if (!saved_ok_[i]) continue;
            struct sigaction now {};
            if (::sigaction(kSignals[i], nullptr, &now) != 0 || same(now, saved_[i])) continue;
            if (::sigaction(kSignals[i], &saved_[i], nullptr) == 0) {
                ++undone;
                TALARIA_LOG(na, debug,
                            "{} changed the process's handler of {} (to {}); put back as the "
                            "application had it ({})",
                            who_, name(kSignals[i]), describe(now), describe(saved_[i]));
            }
        }
        return undone;
    }

  private:
    static std::mutex& mutex() noexcept {
        static std::mutex m;
        return m;
    }
    static bool same(const struct sigaction& a, const struct sigaction& b) noexcept {
        const bool a_info = (a.sa_flags & SA_SIGINFO) != 0, b_info = (b.sa_flags & SA_SIGINFO) != 0;
        if (a_info != b_info) return false;
        if (a_info ? a.sa_sigaction != b.sa_sigaction : a.sa_handler != b.sa_handler) return false;
        return a.sa_flags == b.sa_flags;
    }
    static std::string describe(const struct sigaction& a) {
        if (!(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL) return "the default";
        if (!(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_IGN) return "ignored";
        return "a handler";
    }
    static std::string name(int sig) {
        const char* n = ::sigabbrev_np(sig);
        return n ? std::string("SIG") + n : "signal " + std::to_string(sig);
    }

    std::string who_;
    std::lock_guard<std::mutex> hold_;
    struct sigaction saved_[kCount] {};
    bool saved_ok_[kCount] = {};
};

}  // namespace talaria::na
