/* Several threads on one HG context, as Mercury's own test server runs (one thread looping
 * HG_Progress, another looping HG_Trigger), from C11 with pthreads, over argv[1]: the server's
 * context is driven by two threads of its own while the client, in the main thread, makes 300
 * calls, 8 in flight at a time; every call must come back with its own answer. Run under
 * ThreadSanitizer too. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mercury.h"
#include "mercury_proc.h"

static hg_return_t proc_u32(hg_proc_t proc, void* data) {
    return hg_proc_uint32_t(proc, data);
}

static hg_return_t twice(hg_handle_t h) {
    hg_uint32_t in = 0, out;
    if (HG_Get_input(h, &in) != HG_SUCCESS) return HG_OTHER_ERROR;
    out = in * 2;
    HG_Respond(h, NULL, NULL, &out);
    HG_Free_input(h, &in);
    HG_Destroy(h);
    return HG_SUCCESS;
}

static atomic_int stop = 0;
static hg_context_t* sctx;

static void* progress_loop(void* arg) {
    (void)arg;
    while (!atomic_load(&stop))
        (void)HG_Progress(sctx, 10);
    return NULL;
}

static void* trigger_loop(void* arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        unsigned n;
        (void)HG_Trigger(sctx, 10, 16, &n);
    }
    return NULL;
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
        ++bad;
    }
    s->busy = 0;
    return HG_SUCCESS;
}

int main(int argc, char** argv) {
    const char* info = argc > 1 ? argv[1] : "na+sm";
    hg_class_t* srv = HG_Init(info, 1);
    char client_info[64];
    snprintf(client_info, sizeof client_info, "%s", info);
    char* sep = strstr(client_info, "://");
    if (sep) {
        char* port = strrchr(sep + 3, ':');
        if (port) strcpy(port, ":0");
    }
    hg_class_t* cli = HG_Init(client_info, 0);
    if (!srv || !cli) return 1;
    sctx = HG_Context_create(srv);
    hg_context_t* cctx = HG_Context_create(cli);
    hg_id_t id = HG_Register_name(srv, "twice", proc_u32, proc_u32, twice);
    if (HG_Register_name(cli, "twice", proc_u32, proc_u32, NULL) != id) return 1;
    hg_addr_t self, server;
    HG_Addr_self(srv, &self);
    char name[512];
    hg_size_t len = sizeof name;
    HG_Addr_to_string(srv, name, &len, self);
    HG_Addr_lookup2(cli, name, &server);

    pthread_t p, t;
    pthread_create(&p, NULL, progress_loop, NULL);
    pthread_create(&t, NULL, trigger_loop, NULL);

    enum { kCalls = 300, kSlots = 8 };
    struct slot slots[kSlots];
    for (int i = 0; i < kSlots; ++i) {
        HG_Create(cctx, server, id, &slots[i].h);
        slots[i].busy = 0;
    }
    int sent = 0;
    const time_t until = time(NULL) + 30;
    while (good + bad < kCalls && time(NULL) < until) {
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
        unsigned n;
        (void)HG_Progress(cctx, 1);
        (void)HG_Trigger(cctx, 0, 16, &n);
    }
    atomic_store(&stop, 1);
    pthread_join(p, NULL);
    pthread_join(t, NULL);
    for (int i = 0; i < kSlots; ++i)
        HG_Destroy(slots[i].h);
    HG_Addr_free(cli, server);
    HG_Addr_free(srv, self);
    HG_Context_destroy(cctx);
    /* The last respond callbacks hold their handles until a trigger runs them. */
    for (time_t t_end = time(NULL) + 5;
         HG_Context_destroy(sctx) == HG_BUSY && time(NULL) < t_end;) {
        unsigned n;
        (void)HG_Progress(sctx, 1);
        (void)HG_Trigger(sctx, 0, 16, &n);
    }
    const int closed = HG_Finalize(cli) == HG_SUCCESS && HG_Finalize(srv) == HG_SUCCESS;
    printf("%d of %d calls answered right, %d wrong or failed, over %s\n", good, kCalls, bad, info);
    return good == kCalls && bad == 0 && closed ? 0 : 1;
}
