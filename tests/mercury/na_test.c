/* Mercury's NA C API on Talaria, from C11, over the transport named by argv[1] (a Mercury info
 * string: "na+sm", "na+tcp://127.0.0.1:0", "ofi+tcp://127.0.0.1:0", "inproc://", ...). Two
 * classes in this process, a server and a client: an unexpected ping answered by an expected
 * pong through the source address the server received, put and get through registered memory
 * whose handle travels serialized, a busy op id, a canceled receive, the address string
 * protocol, and NA_Finalize refusing a class whose objects live. Callbacks must run in
 * NA_Trigger only. Each check says what failed; the status is the count. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "na.h"

static int in_trigger = 0; /* callbacks must see it set */
static int outside = 0;    /* callbacks that ran outside NA_Trigger */

struct peer {
    na_class_t* cls;
    na_context_t* ctx;
    na_op_id_t* op;
};

/* Progress and trigger both sides until *value reaches want (10 s at most). */
static void drive(struct peer* a, struct peer* b, int* done, int want) {
    const time_t until = time(NULL) + 10;
    while (*done < want && time(NULL) < until) {
        struct peer* ps[2] = {a, b};
        for (int i = 0; i < 2; ++i) {
            (void)NA_Progress(ps[i]->cls, ps[i]->ctx, 1);
            unsigned n = 0;
            in_trigger = 1;
            NA_Trigger(ps[i]->ctx, 16, &n);
            in_trigger = 0;
        }
    }
}

/* The same as a program with its own poll loop does (Mercury's perf tools): block on both
   wait fds (NA_Poll_get_fd) when NA_Poll_try_wait says both may block, then NA_Poll and
   NA_Trigger each. A poll that waits out its timeout with messages in flight is a lost
   wake-up. */
static int lost_wakeups = 0;
static void poll_drive(struct peer* a, struct peer* b, int* done, int want) {
    const time_t until = time(NULL) + 10;
    struct peer* ps[2] = {a, b};
    while (*done < want && time(NULL) < until) {
        struct pollfd p[2] = {{NA_Poll_get_fd(a->cls, a->ctx), POLLIN, 0},
                              {NA_Poll_get_fd(b->cls, b->ctx), POLLIN, 0}};
        if (p[0].fd >= 0 && p[1].fd >= 0 && NA_Poll_try_wait(a->cls, a->ctx) &&
            NA_Poll_try_wait(b->cls, b->ctx) && poll(p, 2, 2000) == 0)
            ++lost_wakeups;
        for (int i = 0; i < 2; ++i) {
            unsigned n = 0;
            (void)NA_Poll(ps[i]->cls, ps[i]->ctx, &n);
            in_trigger = 1;
            NA_Trigger(ps[i]->ctx, 16, &n);
            in_trigger = 0;
        }
    }
}

/* --- ping / pong */
struct server_state {
    struct peer* p;
    char* buf;
    void* buf_data;
    na_addr_t* client;
    na_op_id_t* reply_op;
    char pong[8];
    int* done;
};

static void on_pong_sent(const struct na_cb_info* info) {
    struct server_state* s = (struct server_state*)info->arg;
    outside += !in_trigger;
    CHECK(info->ret == NA_SUCCESS, "the pong was sent");
    ++*s->done;
}

static void on_ping(const struct na_cb_info* info) {
    struct server_state* s = (struct server_state*)info->arg;
    outside += !in_trigger;
    CHECK(info->ret == NA_SUCCESS, "the ping arrived");
    CHECK(info->type == NA_CB_RECV_UNEXPECTED, "as an unexpected message");
    CHECK(info->info.recv_unexpected.actual_buf_size == 5, "of 5 bytes");
    CHECK(info->info.recv_unexpected.tag == 7, "with its tag");
    CHECK(memcmp(s->buf, "ping", 5) == 0, "reading ping");
    s->client = info->info.recv_unexpected.source;
    CHECK(s->client != NULL, "from a source address");
    /* The op id is free again in its own callback. */
    CHECK(NA_Msg_recv_unexpected(s->p->cls, s->p->ctx, NULL, NULL, s->buf, 64, s->buf_data,
                                 s->p->op) == NA_SUCCESS,
          "a receive reposted with the same op id from its callback");
    memcpy(s->pong, "pong", 5);
    CHECK(NA_Msg_send_expected(s->p->cls, s->p->ctx, on_pong_sent, s, s->pong, 5, NULL, s->client,
                               0, 7, s->reply_op) == NA_SUCCESS,
          "the pong posted");
    ++*s->done;
}

struct client_state {
    char buf[64];
    int* done;
};

static void on_reply(const struct na_cb_info* info) {
    struct client_state* c = (struct client_state*)info->arg;
    outside += !in_trigger;
    CHECK(info->ret == NA_SUCCESS && info->type == NA_CB_RECV_EXPECTED, "the pong arrived");
    CHECK(info->info.recv_expected.actual_buf_size == 5 && memcmp(c->buf, "pong", 5) == 0,
          "reading pong");
    ++*c->done;
}

static void on_counted(const struct na_cb_info* info) {
    outside += !in_trigger;
    int* slot = (int*)info->arg;
    *slot = info->ret == NA_SUCCESS ? 1 : (int)info->ret + 100;
}

static na_return_t canceled_ret = NA_SUCCESS;
static void on_canceled(const struct na_cb_info* info) {
    outside += !in_trigger;
    canceled_ret = info->ret;
    *(int*)info->arg = 1;
}
static void on_canceled_count(const struct na_cb_info* info) {
    outside += !in_trigger;
    *(int*)info->arg += info->ret == NA_CANCELED;
}

int main(int argc, char** argv) {
    const char* info = argc > 1 ? argv[1] : "na+sm";
    CHECK(strcmp(NA_Error_to_string(NA_TIMEOUT), "NA_TIMEOUT") == 0, "error names");
    CHECK(NA_Error_to_string((na_return_t)999) == NULL, "no name out of range");

    struct na_protocol_info* protos = NULL;
    CHECK(NA_Get_protocol_info(NULL, &protos) == NA_SUCCESS && protos != NULL,
          "NA_Get_protocol_info lists the protocols built");
    int has_sm = 0;
    for (struct na_protocol_info* p = protos; p; p = p->next)
        has_sm |= strcmp(p->class_name, "na") == 0 && strcmp(p->protocol_name, "sm") == 0;
    CHECK(has_sm, "na+sm among them");
    NA_Free_protocol_info(protos);
    CHECK(NA_Get_protocol_info("na+nothing", &protos) == NA_PROTONOSUPPORT && protos == NULL,
          "an unknown protocol matches nothing");

    struct peer srv = {0}, cli = {0};
    srv.cls = NA_Initialize(info, true);
    if (!srv.cls) {
        fprintf(stderr, "cannot open %s\n", info);
        return 1;
    }
    CHECK(NA_Is_listening(srv.cls), "the server listens");
    char client_info[64];
    snprintf(client_info, sizeof client_info, "%s", info);
    char* colon = strstr(client_info, "://");
    if (colon && strncmp(client_info, "inproc", 6) != 0) {
        /* A client of a host:port string opens the same host on any port. */
        char* port = strrchr(colon + 3, ':');
        if (port) strcpy(port, ":0");
    }
    cli.cls = NA_Initialize(client_info, false);
    CHECK(cli.cls != NULL, "the client opens");
    if (!cli.cls) return 1;
    srv.ctx = NA_Context_create(srv.cls);
    cli.ctx = NA_Context_create(cli.cls);
    srv.op = NA_Op_create(srv.cls, NA_OP_SINGLE);
    cli.op = NA_Op_create(cli.cls, NA_OP_SINGLE);
    na_op_id_t* cli_op2 = NA_Op_create(cli.cls, NA_OP_SINGLE);
    CHECK(srv.ctx && cli.ctx && srv.op && cli.op && cli_op2, "contexts and op ids");

    /* The server's address, as a string (the size protocol first). */
    na_addr_t* self = NULL;
    CHECK(NA_Addr_self(srv.cls, &self) == NA_SUCCESS, "self address");
    size_t len = 0;
    CHECK(NA_Addr_to_string(srv.cls, NULL, &len, self) == NA_SUCCESS && len > 1, "size query");
    char tiny[2];
    size_t tiny_len = sizeof tiny;
    CHECK(NA_Addr_to_string(srv.cls, tiny, &tiny_len, self) == NA_OVERFLOW && tiny_len == len,
          "a short buffer is NA_OVERFLOW, with the size needed");
    char* name = (char*)malloc(len); /* a ucx+sm address is a long hex string */
    size_t name_len = len;
    CHECK(NA_Addr_to_string(srv.cls, name, &name_len, self) == NA_SUCCESS &&
              name_len == strlen(name) + 1,
          "the string, its NUL counted");
    CHECK(NA_Addr_is_self(srv.cls, self), "self is self");
    printf("server address: %.80s%s\n", name, strlen(name) > 80 ? "..." : "");

    na_addr_t* server = NULL;
    CHECK(NA_Addr_lookup(cli.cls, name, &server) == NA_SUCCESS, "the client looks it up");

    int done = 0;
    struct server_state ss = {&srv, NULL, NULL, NULL, NA_Op_create(srv.cls, 0), {0}, &done};
    ss.buf = (char*)NA_Msg_buf_alloc(srv.cls, 64, NA_RECV, &ss.buf_data);
    CHECK(ss.buf != NULL, "a message buffer");
    CHECK(NA_Msg_recv_unexpected(srv.cls, srv.ctx, on_ping, &ss, ss.buf, 64, ss.buf_data, srv.op) ==
              NA_SUCCESS,
          "the server's receive");
    struct client_state cs = {{0}, &done};
    CHECK(NA_Msg_recv_expected(cli.cls, cli.ctx, on_reply, &cs, cs.buf, sizeof cs.buf, NULL, server,
                               0, 7, cli.op) == NA_SUCCESS,
          "the client's receive of the pong");
    int sent = 0;
    CHECK(NA_Msg_send_unexpected(cli.cls, cli.ctx, on_counted, &sent, "ping", 5, NULL, server, 0, 7,
                                 cli.op) == NA_BUSY,
          "an op id in use is NA_BUSY");
    CHECK(NA_Msg_send_unexpected(cli.cls, cli.ctx, on_counted, &sent, "ping", 5, NULL, server, 0, 7,
                                 cli_op2) == NA_SUCCESS,
          "the ping");
    poll_drive(&srv, &cli, &done, 3);
    CHECK(done == 3 && sent == 1, "ping, pong and both sends completed");
    CHECK(lost_wakeups == 0, "driven by poll on the wait fds, no wake-up was lost");

    /* Put and get: the server's memory, its handle serialized as it would travel. */
    char region[4096], mine[4096];
    for (int i = 0; i < 4096; ++i)
        region[i] = (char)(i * 7);
    memset(mine, 0, sizeof mine);
    na_mem_handle_t *srv_mh = NULL, *cli_mh = NULL, *remote = NULL;
    CHECK(NA_Mem_handle_create(srv.cls, region, sizeof region, NA_MEM_READWRITE, &srv_mh) ==
                  NA_SUCCESS &&
              NA_Mem_register(srv.cls, srv_mh, NA_MEM_TYPE_HOST, 0) == NA_SUCCESS,
          "the server registers its region");
    CHECK(
        NA_Mem_handle_create(cli.cls, mine, sizeof mine, NA_MEM_READWRITE, &cli_mh) == NA_SUCCESS &&
            NA_Mem_register(cli.cls, cli_mh, NA_MEM_TYPE_HOST, 0) == NA_SUCCESS,
        "the client registers its buffer");
    size_t hs = NA_Mem_handle_get_serialize_size(srv.cls, srv_mh);
    char* wire = (char*)malloc(hs ? hs : 1);
    CHECK(hs > 0 && NA_Mem_handle_serialize(srv.cls, wire, hs, srv_mh) == NA_SUCCESS &&
              NA_Mem_handle_deserialize(cli.cls, &remote, wire, hs) == NA_SUCCESS,
          "the handle serialized and deserialized");
    int got = 0, put = 0;
    CHECK(NA_Get(cli.cls, cli.ctx, on_counted, &got, cli_mh, 0, remote, 1024, 2048, server, 0,
                 cli.op) == NA_SUCCESS,
          "a get");
    drive(&srv, &cli, &got, 1);
    CHECK(got == 1 && memcmp(mine, region + 1024, 2048) == 0, "the get read the region");
    memset(mine, 'x', 100);
    CHECK(NA_Put(cli.cls, cli.ctx, on_counted, &put, cli_mh, 0, remote, 10, 100, server, 0,
                 cli.op) == NA_SUCCESS,
          "a put");
    drive(&srv, &cli, &put, 1);
    CHECK(put == 1 && region[10] == 'x' && region[109] == 'x' && region[110] == (char)(110 * 7),
          "the put wrote 100 bytes at offset 10");
    free(wire);

    /* A receive canceled: its callback runs in trigger with NA_CANCELED. */
    char spare[16];
    int canceled = 0;
    CHECK(NA_Msg_recv_unexpected(cli.cls, cli.ctx, on_canceled, &canceled, spare, sizeof spare,
                                 NULL, cli_op2) == NA_SUCCESS,
          "a receive to cancel");
    CHECK(NA_Cancel(cli.cls, cli.ctx, cli_op2) == NA_SUCCESS, "cancel");
    drive(&srv, &cli, &canceled, 1);
    CHECK(canceled && canceled_ret == NA_CANCELED, "the canceled receive says NA_CANCELED");
    CHECK(outside == 0, "every callback ran in NA_Trigger");

    /* Three completions queued: NA_Context_get_completion_count says three (Mercury's perf
       tools trigger as many as it says), and one NA_Trigger runs them. */
    {
        na_op_id_t* ops[3];
        char bufs[3][16];
        int three = 0;
        for (int i = 0; i < 3; ++i) {
            ops[i] = NA_Op_create(cli.cls, NA_OP_SINGLE);
            CHECK(NA_Msg_recv_unexpected(cli.cls, cli.ctx, on_canceled_count, &three, bufs[i],
                                         sizeof bufs[i], NULL, ops[i]) == NA_SUCCESS,
                  "a receive to cancel");
            CHECK(NA_Cancel(cli.cls, cli.ctx, ops[i]) == NA_SUCCESS, "cancel");
        }
        const time_t until = time(NULL) + 5;
        while (NA_Context_get_completion_count(cli.ctx) < 3 && time(NULL) < until)
            (void)NA_Progress(cli.cls, cli.ctx, 1);
        CHECK(NA_Context_get_completion_count(cli.ctx) == 3, "three completions counted");
        unsigned n = 0;
        in_trigger = 1;
        NA_Trigger(cli.ctx, 16, &n);
        in_trigger = 0;
        CHECK(n == 3 && three == 3 && outside == 0, "one NA_Trigger ran the three");
        CHECK(NA_Context_get_completion_count(cli.ctx) == 0, "and none is counted after");
        for (int i = 0; i < 3; ++i)
            NA_Op_destroy(cli.cls, ops[i]);
    }

    /* Teardown: refused while objects live. */
    CHECK(NA_Finalize(cli.cls) == NA_BUSY, "NA_Finalize with live objects is NA_BUSY");
    NA_Mem_deregister(cli.cls, cli_mh);
    NA_Mem_handle_free(cli.cls, cli_mh);
    NA_Mem_handle_free(cli.cls, remote);
    NA_Mem_deregister(srv.cls, srv_mh);
    NA_Mem_handle_free(srv.cls, srv_mh);
    NA_Cancel(srv.cls, srv.ctx, srv.op); /* the reposted receive */
    {
        const time_t until = time(NULL) + 5;
        while (NA_Context_destroy(srv.cls, srv.ctx) == NA_BUSY && time(NULL) < until) {
            unsigned n;
            (void)NA_Progress(srv.cls, srv.ctx, 1);
            NA_Trigger(srv.ctx, 16, &n);
        }
    }
    NA_Addr_free(srv.cls, ss.client);
    NA_Addr_free(srv.cls, self);
    NA_Msg_buf_free(srv.cls, ss.buf, ss.buf_data);
    NA_Op_destroy(srv.cls, srv.op);
    NA_Op_destroy(srv.cls, ss.reply_op);
    CHECK(NA_Finalize(srv.cls) == NA_SUCCESS, "the server's class closes");
    NA_Addr_free(cli.cls, server);
    free(name);
    NA_Op_destroy(cli.cls, cli.op);
    NA_Op_destroy(cli.cls, cli_op2);
    CHECK(NA_Context_destroy(cli.cls, cli.ctx) == NA_SUCCESS, "the client's context");
    CHECK(NA_Finalize(cli.cls) == NA_SUCCESS, "the client's class closes");
    if (failures == 0) printf("NA over %s: every check passed\n", info);
    return failures;
}
