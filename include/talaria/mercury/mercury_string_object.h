/* Talaria's Mercury-compatible C API: string objects, a string and whether its holder frees it
 * (Mercury 2.4.1's mercury_string_object.h). */
#ifndef MERCURY_STRING_OBJECT_H
#define MERCURY_STRING_OBJECT_H

#include "mercury_types.h"

typedef struct hg_string_object {
    char* data;
    bool is_const;
    bool is_owned; /* hg_string_object_free frees data (with free()) */
} hg_string_object_t;

#ifdef __cplusplus
extern "C" {
#endif

/* Empty: no data, not owned. */
HG_PUBLIC hg_return_t hg_string_object_init(hg_string_object_t* string);
HG_PUBLIC hg_return_t hg_string_object_init_char(hg_string_object_t* string, char* s,
                                                 uint8_t is_owned);
HG_PUBLIC hg_return_t hg_string_object_init_const_char(hg_string_object_t* string, const char* s,
                                                       uint8_t is_owned);
/* Free data if owned (data is then NULL). */
HG_PUBLIC hg_return_t hg_string_object_free(hg_string_object_t* string);
/* An owned copy of string's data (strdup; HG_NOMEM). */
HG_PUBLIC hg_return_t hg_string_object_dup(hg_string_object_t string,
                                           hg_string_object_t* new_string);
/* Put `s` in place of the data, now neither const nor owned; the old data is returned. */
HG_PUBLIC char* hg_string_object_swap(hg_string_object_t* string, char* s);

#ifdef __cplusplus
}
#endif

#endif /* MERCURY_STRING_OBJECT_H */
