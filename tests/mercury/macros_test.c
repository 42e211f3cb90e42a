/* mercury_macros.h from C11 (and, the same file, from C++): structs and procs generated from
 * field lists, a procedure registered with MERCURY_REGISTER, and a call through them on
 * inproc whose input holds integers, a string and a bulk handle, and whose output is void. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "mercury_macros.h"
#include "mercury_proc_string.h"

MERCURY_GEN_PROC(put_in_t,
                 ((int32_t)(x))((uint64_t)(y))((hg_const_string_t)(name))((hg_bulk_t)(data)))
MERCURY_GEN_PROC(put_out_t, ((int32_t)(ret)))

typedef struct {
    hg_uint8_t a;
    hg_size_t b;
} pair_t;
MERCURY_GEN_STRUCT_PROC(pair_t, ((hg_uint8_t)(a))((hg_size_t)(b)))

static int served = 0, answered = 0;

static hg_return_t put_rpc(hg_handle_t h) {
    put_in_t in;
    put_out_t out = {0};
    CHECK(HG_Get_input(h, &in) == HG_SUCCESS, "the generated proc decodes");
    CHECK(in.x == -5 && in.y == 1ull << 40 && strcmp(in.name, "file") == 0 &&
              HG_Bulk_get_size(in.data) == 64,
          "every field arrived");
    out.ret = in.x * 2;
    CHECK(HG_Respond(h, NULL, NULL, &out) == HG_SUCCESS, "respond");
    HG_Free_input(h, &in);
    HG_Destroy(h);
    ++served;
    return HG_SUCCESS;
}

static hg_return_t on_done(const struct hg_cb_info* info) {
    put_out_t out;
    CHECK(info->ret == HG_SUCCESS, "the call completed");
    if (info->ret == HG_SUCCESS && HG_Get_output(info->info.forward.handle, &out) == HG_SUCCESS) {
        CHECK(out.ret == -10, "the generated output proc");
        HG_Free_output(info->info.forward.handle, &out);
    }
    ++answered;
    return HG_SUCCESS;
}

int main(void) {
    /* A struct proc on its own. */
    char buf[64];
    hg_proc_t p;
    pair_t in = {7, 1234567}, out = {0, 0};
    hg_proc_create_set((hg_class_t*)1, buf, sizeof buf, HG_ENCODE, HG_NOHASH, &p);
    CHECK(hg_proc_pair_t(p, &in) == HG_SUCCESS && hg_proc_get_size_used(p) == 9,
          "MERCURY_GEN_STRUCT_PROC encodes 1 + 8 bytes");
    hg_proc_reset(p, buf, 9, HG_DECODE);
    CHECK(hg_proc_pair_t(p, &out) == HG_SUCCESS && out.a == 7 && out.b == 1234567, "and decodes");
    hg_proc_free(p);

    hg_class_t* cls = HG_Init("inproc://macros-test", 1);
    CHECK(cls != NULL, "a class");
    if (!cls) return 1;
    hg_context_t* ctx = HG_Context_create(cls);
    hg_id_t id = MERCURY_REGISTER(cls, "put", put_in_t, put_out_t, put_rpc);
    hg_id_t none = MERCURY_REGISTER(cls, "nothing", void, void, NULL);
    CHECK(id != 0 && none != 0 && id != none, "MERCURY_REGISTER, hg_proc_void included");
    hg_addr_t self;
    HG_Addr_self(cls, &self);
    char region[64] = {0};
    void* ptrs[1] = {region};
    hg_size_t sizes[1] = {sizeof region};
    hg_bulk_t bulk;
    HG_Bulk_create(cls, 1, ptrs, sizes, HG_BULK_READ_ONLY, &bulk);
    put_in_t args = {-5, 1ull << 40, "file", bulk};
    hg_handle_t h;
    CHECK(HG_Create(ctx, self, id, &h) == HG_SUCCESS &&
              HG_Forward(h, on_done, NULL, &args) == HG_SUCCESS,
          "forward to self");
    const time_t until = time(NULL) + 10;
    while (answered == 0 && time(NULL) < until) {
        unsigned n;
        (void)HG_Progress(ctx, 1);
        (void)HG_Trigger(ctx, 0, 16, &n);
    }
    CHECK(served == 1 && answered == 1, "served and answered");
    HG_Destroy(h);
    HG_Bulk_free(bulk);
    HG_Addr_free(cls, self);
    for (int i = 0; i < 5; ++i) {
        unsigned n;
        (void)HG_Progress(ctx, 1);
        (void)HG_Trigger(ctx, 0, 16, &n);
    }
    CHECK(HG_Context_destroy(ctx) == HG_SUCCESS && HG_Finalize(cls) == HG_SUCCESS, "teardown");
    if (failures == 0) printf("mercury_macros.h: every check passed\n");
    return failures;
}
