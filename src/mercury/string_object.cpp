// hg_string_object_* and the string proc of Mercury's C API (include/talaria/mercury/
// mercury_string_object.h, mercury_proc_string.h).
//
// Encoding (Mercury's): uint64_t length counting the terminating NUL (0: a NULL string), the
// bytes, then is_const and is_owned as one byte each. A decode checks what arrived before it
// allocates: a length past the bytes left is HG_OVERFLOW (a peer cannot make it allocate what
// it did not send), bytes whose last is not NUL, or a NUL inside, HG_PROTOCOL_ERROR. The
// decoded copy is the decoder's (owned, not const), whatever the sender's flags said.
#include <cstdlib>
#include <cstring>

#include "mercury_proc_string.h"

extern "C" {

HG_PUBLIC hg_return_t hg_string_object_init(hg_string_object_t* string) {
    if (!string) return HG_INVALID_ARG;
    string->data = nullptr;
    string->is_const = false;
    string->is_owned = false;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_string_object_init_char(hg_string_object_t* string, char* s,
                                                 uint8_t is_owned) {
    if (!string) return HG_INVALID_ARG;
    string->data = s;
    string->is_const = false;
    string->is_owned = is_owned != 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_string_object_init_const_char(hg_string_object_t* string, const char* s,
                                                       uint8_t is_owned) {
    if (!string) return HG_INVALID_ARG;
    string->data = const_cast<char*>(s);  // const in name only: owned ones are freed
    string->is_const = true;
    string->is_owned = is_owned != 0;
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_string_object_free(hg_string_object_t* string) {
    if (!string) return HG_INVALID_ARG;
    if (string->is_owned) {
        std::free(string->data);
        string->data = nullptr;
        string->is_owned = false;
    }
    return HG_SUCCESS;
}

HG_PUBLIC hg_return_t hg_string_object_dup(hg_string_object_t string,
                                           hg_string_object_t* new_string) {
    if (!new_string) return HG_INVALID_ARG;
    new_string->data = string.data ? ::strdup(string.data) : nullptr;
    if (string.data && !new_string->data) return HG_NOMEM;
    new_string->is_const = false;
    new_string->is_owned = new_string->data != nullptr;
    return HG_SUCCESS;
}

HG_PUBLIC char* hg_string_object_swap(hg_string_object_t* string, char* s) {
    if (!string) return nullptr;
    char* old = string->data;
    string->data = s;
    string->is_const = false;
    string->is_owned = false;
    return old;
}

HG_PUBLIC hg_return_t hg_proc_hg_string_object_t(hg_proc_t proc, void* data) {
    auto* s = static_cast<hg_string_object_t*>(data);
    if (!proc || !s) return HG_INVALID_ARG;
    switch (hg_proc_get_op(proc)) {
        case HG_ENCODE: {
            uint64_t len = s->data ? uint64_t(std::strlen(s->data)) + 1 : 0;
            hg_return_t ret = hg_proc_uint64_t(proc, &len);
            if (ret != HG_SUCCESS || len == 0) return ret;
            if ((ret = hg_proc_bytes(proc, s->data, len)) != HG_SUCCESS) return ret;
            uint8_t flag = s->is_const;
            if ((ret = hg_proc_uint8_t(proc, &flag)) != HG_SUCCESS) return ret;
            flag = s->is_owned;
            return hg_proc_uint8_t(proc, &flag);
        }
        case HG_DECODE: {
            uint64_t len = 0;
            hg_return_t ret = hg_proc_uint64_t(proc, &len);
            if (ret != HG_SUCCESS) return ret;
            if (len == 0) return hg_string_object_init(s);
            // The bytes and both flags must have arrived.
            if (len > hg_proc_get_size_left(proc) || hg_proc_get_size_left(proc) - len < 2)
                return HG_OVERFLOW;
            char* copy = static_cast<char*>(std::malloc(std::size_t(len)));
            if (!copy) return HG_NOMEM;
            uint8_t flags[2] = {0, 0};
            if ((ret = hg_proc_bytes(proc, copy, len)) != HG_SUCCESS ||
                (ret = hg_proc_bytes(proc, flags, 2)) != HG_SUCCESS) {
                std::free(copy);
                return ret;
            }
            if (copy[len - 1] != '\0' || std::memchr(copy, '\0', std::size_t(len - 1))) {
                std::free(copy);
                return HG_PROTOCOL_ERROR;
            }
            s->data = copy;
            s->is_const = false;
            s->is_owned = true;
            return HG_SUCCESS;
        }
        case HG_FREE:
            return hg_string_object_free(s);
    }
    return HG_INVALID_ARG;
}

}  // extern "C"
