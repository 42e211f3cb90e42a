/* A server and a client in two processes, driven the ways Mercury's own programs drive them,
 * from C11: `mercury_hg_two_proc_test INFO MODE`. The server is a child forked before either
 * opens a class; it prints its address on a pipe, serves "twice" and "quit", and exits. The
 * client makes 200 calls, 4 in flight, and checks every answer. MODE:
 *   threads  the server loops HG_Progress(100 ms) in a thread and HG_Trigger(HG_MAX_IDLE_TIME)
 *            in its main thread (Mercury's unit-test server); the client progresses and triggers
 *            in one thread;
 *   poll     both sides sleep on HG_Event_get_wait_fd whenever HG_Event_ready says so, then
 *            HG_Event_progress and HG_Event_trigger (Mercury's perf tools);
 *   busy     both classes in busy mode (NA_NO_BLOCK): no wait fd, HG_Progress(0) and
 *            HG_Trigger polled.
 * In one process a send's completion signals the same descriptors the receive waits on; only
 * two processes show whether what arrives from another process wakes each of these waits. A
 * wait that never wakes fails the test at its 30 s bound (and ctest's), never hangs it. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mercury.h"
#include "mercury_proc.h"

enum mode { kThreads, kPoll, kBusy };
static enum mode mode;

static hg_return_t proc_u32(hg_proc_t proc, void* data) {
    return hg_proc_uint32_t(proc, data);
}

static atomic_int stop = 0;

static hg_return_t twice(hg_handle_t h) {
    hg_uint32_t in = 0, out;
    if (HG_Get_input(h, &in) != HG_SUCCESS) return HG_OTHER_ERROR;
    out = in * 2;
    HG_Respond(h, NULL, NULL, &out);
    HG_Free_input(h, &in);
    HG_Destroy(h);
    return HG_SUCCESS;
}

static hg_return_t quit(hg_handle_t h) {
    hg_uint32_t in = 0, out = 1;
    HG_Get_input(h, &in);
    HG_Respond(h, NULL, NULL, &out);
    HG_Free_input(h, &in);
    HG_Destroy(h);
    atomic_store(&stop, 1);
    return HG_SUCCESS;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static hg_class_t* open_class(const char* info, int listen) {
    struct hg_init_info ii = HG_INIT_INFO_INITIALIZER;
    if (mode == kBusy) ii.na_init_info.progress_mode = NA_NO_BLOCK;
    return HG_Init_opt(info, (hg_bool_t)listen, &ii);
}

/* One step of the mode's loop on `ctx`, waiting up to `ms` for something to do. */
static void drive(hg_context_t* ctx, unsigned ms) {
    unsigned n = 0;
    if (mode == kPoll) {
        if (!HG_Event_ready(ctx)) {
            struct pollfd p = {.fd = HG_Event_get_wait_fd(ctx), .events = POLLIN};
            (void)poll(&p, 1, (int)ms);
        }
        (void)HG_Event_progress(ctx, &n);
        (void)HG_Event_trigger(ctx, 16, &n);
    } else if (mode == kBusy) {
        (void)HG_Progress(ctx, 0);
        (void)HG_Trigger(ctx, 0, 16, &n);
    } else {
        (void)HG_Progress(ctx, ms);
        (void)HG_Trigger(ctx, 0, 16, &n);
    }
}

static hg_context_t* sctx;

static void* progress_loop(void* arg) {
    (void)arg;
    while (!atomic_load(&stop))
        (void)HG_Progress(sctx, 100);
    return NULL;
}

static int serve(const char* info, int out_fd) {
    hg_class_t* srv = open_class(info, 1);
    if (!srv) return 10;
    sctx = HG_Context_create(srv);
    if (!HG_Register_name(srv, "twice", proc_u32, proc_u32, twice) ||
        !HG_Register_name(srv, "quit", proc_u32, proc_u32, quit))
        return 14;
    hg_addr_t self;
    HG_Addr_self(srv, &self);
    char name[1024];
    hg_size_t len = sizeof name;
    if (HG_Addr_to_string(srv, name, &len, self) != HG_SUCCESS) return 11;
    HG_Addr_free(srv, self);
    strcat(name, "\n");
    if (write(out_fd, name, strlen(name)) != (ssize_t)strlen(name)) return 12;
    close(out_fd);
    const double until = now_s() + 60;
    if (mode == kThreads) {
        pthread_t p;
        pthread_create(&p, NULL, progress_loop, NULL);
        while (!atomic_load(&stop) && now_s() < until)
            (void)HG_Trigger(sctx, HG_MAX_IDLE_TIME, 1, NULL);
        atomic_store(&stop, 1);
        pthread_join(p, NULL);
    } else {
        while (!atomic_load(&stop) && now_s() < until)
            drive(sctx, 1000);
    }
    /* The last respond callbacks hold their handles until a trigger runs them. */
    for (double t_end = now_s() + 5; HG_Context_destroy(sctx) == HG_BUSY && now_s() < t_end;) {
        unsigned n;
        (void)HG_Progress(sctx, 1);
        (void)HG_Trigger(sctx, 0, 16, &n);
    }
    return HG_Finalize(srv) == HG_SUCCESS ? 0 : 13;
}

struct slot {
    hg_handle_t h;
    hg_uint32_t in;
    int busy;
};
static int good = 0, bad = 0;

static hg_return_t answered(const struct hg_cb_info* info) {
    struct slot* s = (struct slot*)info->arg;
    hg_uint32_t out = 0;
    if (info->ret == HG_SUCCESS && HG_Get_output(s->h, &out) == HG_SUCCESS) {
        if (out == s->in * 2)
            ++good;
        else
            ++bad;
        HG_Free_output(s->h, &out);
    } else {
        fprintf(stderr, "call %u: %s\n", (unsigned)s->in, HG_Error_to_string(info->ret));
        ++bad;
    }
    s->busy = 0;
    return HG_SUCCESS;
}

static int quit_done = 0;
static hg_return_t quit_answered(const struct hg_cb_info* info) {
    quit_done = info->ret == HG_SUCCESS ? 1 : -1;
    return HG_SUCCESS;
}

int main(int argc, char** argv) {
    const char* info = argc > 1 ? argv[1] : "na+sm";
    const char* m = argc > 2 ? argv[2] : "threads";
    mode = strcmp(m, "poll") == 0 ? kPoll : strcmp(m, "busy") == 0 ? kBusy : kThreads;
    int pfd[2];
    if (pipe(pfd) != 0) return 1;
    const pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        close(pfd[0]);
        alarm(90); /* never outlive a client that died */
        _exit(serve(info, pfd[1]));
    }
    close(pfd[1]);
    char name[1024];
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (got + 1 >= sizeof name || poll(&p, 1, 20000) <= 0) break;
        ssize_t r = read(pfd[0], name + got, sizeof name - 1 - got);
        if (r <= 0) break;
        got += (size_t)r;
        if (memchr(name, '\n', got)) break;
    }
    name[got] = '\0';
    char* nl = strchr(name, '\n');
    if (!nl) {
        fprintf(stderr, "the server printed no address\n");
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return 1;
    }
    *nl = '\0';

    /* The client's info: the server's class and protocol, any port. */
    char client_info[128];
    snprintf(client_info, sizeof client_info, "%s", info);
    char* sep = strstr(client_info, "://");
    if (sep) {
        char* port = strrchr(sep + 3, ':');
        if (port) strcpy(port, ":0");
    }
    hg_class_t* cli = open_class(client_info, 0);
    if (!cli) return 1;
    hg_context_t* cctx = HG_Context_create(cli);
    hg_id_t id = HG_Register_name(cli, "twice", proc_u32, proc_u32, NULL);
    hg_id_t quit_id = HG_Register_name(cli, "quit", proc_u32, proc_u32, NULL);
    hg_addr_t server = HG_ADDR_NULL;
    if (HG_Addr_lookup2(cli, name, &server) != HG_SUCCESS) {
        fprintf(stderr, "lookup of %s failed\n", name);
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return 1;
    }

    enum { kCalls = 200, kSlots = 4 };
    struct slot slots[kSlots];
    for (int i = 0; i < kSlots; ++i) {
        HG_Create(cctx, server, id, &slots[i].h);
        slots[i].busy = 0;
    }
    const double t0 = now_s(), until = t0 + 30;
    double first = 0;
    int sent = 0;
    while (good + bad < kCalls && now_s() < until) {
        for (int i = 0; i < kSlots && sent < kCalls; ++i) {
            if (slots[i].busy) continue;
            slots[i].in = (hg_uint32_t)sent;
            slots[i].busy = 1;
            if (HG_Forward(slots[i].h, answered, &slots[i], &slots[i].in) != HG_SUCCESS) {
                slots[i].busy = 0;
                ++bad;
            }
            ++sent;
        }
        drive(cctx, 100);
        if (good + bad > 0 && first == 0) first = now_s() - t0;
    }
    const double took = now_s() - t0;
    hg_handle_t qh;
    hg_uint32_t one = 1;
    HG_Create(cctx, server, quit_id, &qh);
    if (HG_Forward(qh, quit_answered, NULL, &one) == HG_SUCCESS)
        for (const double q_end = now_s() + 10; quit_done == 0 && now_s() < q_end;)
            drive(cctx, 100);
    HG_Destroy(qh);
    for (int i = 0; i < kSlots; ++i)
        HG_Destroy(slots[i].h);
    HG_Addr_free(cli, server);
    HG_Context_destroy(cctx);
    const int closed = HG_Finalize(cli) == HG_SUCCESS;

    int status = -1;
    for (const double w_end = now_s() + 15; now_s() < w_end;) {
        pid_t w = waitpid(child, &status, WNOHANG);
        if (w == child) break;
        struct timespec ms = {0, 10 * 1000 * 1000};
        nanosleep(&ms, NULL);
        status = -1;
    }
    if (status == -1) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    const int server_ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf(
        "%s, %s: %d of %d calls answered right, %d wrong or failed, in %.3f s (first after "
        "%.3f s); quit %s; server %s\n",
        info, m, good, kCalls, bad, took, first, quit_done == 1 ? "answered" : "not answered",
        server_ok ? "exited 0" : "did not exit cleanly");
    return good == kCalls && bad == 0 && quit_done == 1 && closed && server_ok ? 0 : 1;
}
