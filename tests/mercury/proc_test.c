/* Mercury's procs on Talaria, from C11: what Mercury's own proc test checks (a struct of
 * integers and a string encoded, copied as an RPC would, decoded and freed, with a proc whose
 * class pointer is never read), the byte encoding Mercury uses, encoding past the caller's
 * buffer into the extra buffer, and decoding bytes that end early or lie. Each check says what
 * failed; the program's status is the count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mercury_proc.h"
#include "mercury_proc_string.h"

/* Mercury's test_proc classes: never dereferenced. */
#define FAKE_CLASS ((hg_class_t*)1)

typedef struct {
    hg_uint8_t val8;
    hg_uint16_t val16;
    hg_uint32_t val32;
    hg_uint64_t val64;
    hg_id_t id;
    hg_const_string_t name;
    hg_string_t note;
} record_t;

static hg_return_t hg_proc_record_t(hg_proc_t proc, void* data) {
    record_t* r = (record_t*)data;
    hg_return_t ret;
    if ((ret = hg_proc_hg_uint8_t(proc, &r->val8)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_uint16_t(proc, &r->val16)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_uint32_t(proc, &r->val32)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_uint64_t(proc, &r->val64)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_id_t(proc, &r->id)) != HG_SUCCESS) return ret;
    if ((ret = hg_proc_hg_const_string_t(proc, &r->name)) != HG_SUCCESS) return ret;
    return hg_proc_hg_string_t(proc, &r->note);
}

static void round_trip(void) {
    hg_proc_t proc = HG_PROC_NULL;
    CHECK(hg_proc_create(FAKE_CLASS, HG_CRC32, &proc) == HG_SUCCESS, "create");
    CHECK(hg_proc_get_class(proc) == FAKE_CLASS, "the class is kept");
    char in_buf[4096], out_buf[4096];
    char note[] = "note";
    record_t in = {1, 2, 3, 4, 0x0000000100000005ull, "Hello", note};
    record_t out = {0, 0, 0, 0, 0, "not decoded", NULL};
    CHECK(hg_proc_reset(proc, in_buf, sizeof in_buf, HG_ENCODE) == HG_SUCCESS, "reset encode");
    CHECK(hg_proc_get_op(proc) == HG_ENCODE, "op");
    CHECK(hg_proc_record_t(proc, &in) == HG_SUCCESS, "encode");
    CHECK(hg_proc_flush(proc) == HG_SUCCESS, "flush");
    /* 1 + 2 + 4 + 8 + 4 (hg_id_t in 32 bits) + (8 + 6 + 2) + (8 + 5 + 2) */
    const hg_size_t used = hg_proc_get_size_used(proc);
    CHECK(used == 19 + 16 + 15, "encoded size");
    CHECK(hg_proc_get_size_left(proc) == sizeof in_buf - used, "size left");
    CHECK(hg_proc_get_extra_buf(proc) == NULL, "no extra buffer for a small encoding");
    memcpy(out_buf, in_buf, sizeof out_buf); /* as an RPC copies it */
    CHECK(hg_proc_reset(proc, out_buf, used, HG_DECODE) == HG_SUCCESS, "reset decode");
    CHECK(hg_proc_record_t(proc, &out) == HG_SUCCESS, "decode");
    CHECK(hg_proc_get_size_left(proc) == 0, "decode read everything");
    CHECK(out.val8 == 1 && out.val16 == 2 && out.val32 == 3 && out.val64 == 4, "integers");
    CHECK(out.id == 5, "hg_id_t travels in 32 bits");
    CHECK(out.name && strcmp(out.name, "Hello") == 0, "const string");
    CHECK(out.note && strcmp(out.note, "note") == 0 && out.note != note, "string copied");
    CHECK(hg_proc_reset(proc, NULL, 0, HG_FREE) == HG_SUCCESS, "reset free");
    CHECK(hg_proc_record_t(proc, &out) == HG_SUCCESS, "free pass"); /* asan: nothing leaks */
    hg_proc_free(proc);
}

static void encoding_is_mercurys(void) {
    unsigned char buf[64];
    hg_proc_t proc = HG_PROC_NULL;
    CHECK(
        hg_proc_create_set(FAKE_CLASS, buf, sizeof buf, HG_ENCODE, HG_NOHASH, &proc) == HG_SUCCESS,
        "create_set");
    hg_uint16_t v = 0x0102;
    hg_const_string_t hi = "Hi", none = NULL;
    hg_proc_hg_uint16_t(proc, &v);
    hg_proc_hg_const_string_t(proc, &hi);
    hg_proc_hg_const_string_t(proc, &none);
    const unsigned char want[] = {0x02, 0x01,                                      /* host order */
                                  3,    0,    0, 0, 0, 0, 0, 0, 'H', 'i', 0, 1, 0, /* is_const 1 */
                                  0,    0,    0, 0, 0, 0, 0, 0}; /* NULL: length 0 */
    CHECK(hg_proc_get_size_used(proc) == sizeof want, "encoded size of the sample");
    CHECK(memcmp(buf, want, sizeof want) == 0, "bytes as Mercury writes them");
    hg_proc_free(proc);
}

static void encoding_grows_into_the_extra_buffer(void) {
    char small[16];
    hg_proc_t proc = HG_PROC_NULL;
    hg_proc_create_set(FAKE_CLASS, small, sizeof small, HG_ENCODE, HG_NOHASH, &proc);
    hg_proc_set_flags(proc, HG_PROC_SM);
    for (hg_uint64_t i = 0; i < 1000; ++i)
        CHECK(hg_proc_hg_uint64_t(proc, &i) == HG_SUCCESS, "encode past the caller's buffer");
    CHECK(hg_proc_get_flags(proc) == HG_PROC_SM, "flags survive growth");
    CHECK(hg_proc_get_size_used(proc) == 8000, "size used counts the whole encoding");
    char* extra = (char*)hg_proc_get_extra_buf(proc);
    CHECK(extra != NULL && hg_proc_get_extra_size(proc) >= 8000, "extra buffer");
    CHECK(hg_proc_get_size(proc) == sizeof small + hg_proc_get_extra_size(proc), "get_size");
    /* The extra buffer holds all of it, the first two values included. */
    hg_proc_t dec = HG_PROC_NULL;
    hg_proc_create_set(FAKE_CLASS, extra, 8000, HG_DECODE, HG_NOHASH, &dec);
    int same = 1;
    for (hg_uint64_t i = 0; i < 1000; ++i) {
        hg_uint64_t v = ~0ull;
        same &= hg_proc_hg_uint64_t(dec, &v) == HG_SUCCESS && v == i;
    }
    CHECK(same, "the extra buffer decodes to what was encoded");
    hg_proc_free(dec);
    CHECK(hg_proc_set_extra_buf_is_mine(proc, 1) == HG_SUCCESS, "take the extra buffer");
    hg_proc_free(proc);
    free(extra); /* ours now: asan says if the proc freed it too */
    CHECK(hg_proc_set_size(HG_PROC_NULL, 10) == HG_INVALID_ARG, "set_size on NULL");
}

static void bad_input_is_refused(void) {
    hg_proc_t proc = HG_PROC_NULL;
    CHECK(hg_proc_create(NULL, HG_NOHASH, &proc) == HG_INVALID_ARG, "a NULL class");
    hg_proc_create(FAKE_CLASS, HG_NOHASH, &proc);
    CHECK(hg_proc_reset(proc, NULL, 16, HG_ENCODE) == HG_INVALID_ARG, "encode into NULL");
    CHECK(hg_proc_reset(HG_PROC_NULL, NULL, 0, HG_FREE) == HG_INVALID_ARG, "a NULL proc");

    unsigned char three[3] = {1, 2, 3};
    hg_uint32_t v = 0;
    hg_proc_reset(proc, three, sizeof three, HG_DECODE);
    CHECK(hg_proc_hg_uint32_t(proc, &v) == HG_OVERFLOW, "decoding past the end");
    CHECK(hg_proc_save_ptr(proc, 4) == NULL, "save_ptr past the end of a decode");
    CHECK(hg_proc_save_ptr(proc, 3) == (void*)three, "save_ptr within it");

    /* A string whose length claims a terabyte. */
    unsigned char lie[16] = {0, 0, 0, 0, 0, 1, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0, 0};
    hg_string_t s = NULL;
    hg_proc_reset(proc, lie, sizeof lie, HG_DECODE);
    CHECK(hg_proc_hg_string_t(proc, &s) == HG_OVERFLOW && s == NULL, "a length past the bytes");
    /* One without its NUL, and one with a NUL inside. */
    unsigned char no_nul[13] = {3, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 'c', 0, 0};
    hg_proc_reset(proc, no_nul, sizeof no_nul, HG_DECODE);
    CHECK(hg_proc_hg_string_t(proc, &s) == HG_PROTOCOL_ERROR && s == NULL, "no NUL");
    unsigned char inner[13] = {3, 0, 0, 0, 0, 0, 0, 0, 'a', 0, 0, 0, 0};
    hg_proc_reset(proc, inner, sizeof inner, HG_DECODE);
    CHECK(hg_proc_hg_string_t(proc, &s) == HG_PROTOCOL_ERROR && s == NULL, "a NUL inside");
    /* The flags missing after the bytes. */
    unsigned char short_flags[12] = {3, 0, 0, 0, 0, 0, 0, 0, 'a', 'b', 0, 0};
    hg_proc_reset(proc, short_flags, sizeof short_flags, HG_DECODE);
    CHECK(hg_proc_hg_string_t(proc, &s) == HG_OVERFLOW && s == NULL, "flags missing");
    CHECK(hg_proc_checksum_get(proc, &v, sizeof v) == HG_INVALID_ARG, "no checksum here");
    hg_proc_free(proc);
    CHECK(hg_proc_free(HG_PROC_NULL) == HG_SUCCESS, "free NULL");
}

static void string_objects(void) {
    hg_string_object_t a, b;
    hg_string_object_init_const_char(&a, "text", 0);
    CHECK(a.is_const && !a.is_owned, "const, not owned");
    CHECK(hg_string_object_dup(a, &b) == HG_SUCCESS && b.is_owned && !b.is_const &&
              strcmp(b.data, "text") == 0 && b.data != a.data,
          "dup");
    char* mine = hg_string_object_swap(&b, NULL);
    CHECK(mine && b.data == NULL && !b.is_owned, "swap takes the data out");
    free(mine);
    CHECK(hg_string_object_free(&a) == HG_SUCCESS && a.data != NULL, "not owned: kept");
}

int main(void) {
    round_trip();
    encoding_is_mercurys();
    encoding_grows_into_the_extra_buffer();
    bad_input_is_refused();
    string_objects();
    if (failures == 0) printf("procs: every check passed\n");
    return failures;
}
