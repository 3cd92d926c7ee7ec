/* libldap, loaded at run time (ldap_load.c): the functions boxkey_ldap.c calls go through
   pointers resolved by dlsym. Private to this target. */
#ifndef BOXKEY_LDAP_CALLS_H
#define BOXKEY_LDAP_CALLS_H
#define LDAP_DEPRECATED 0
#include <ldap.h>
#include <lber.h>
#include <stddef.h>
#include "boxkey_ldap.h"

/* libldap is loaded only when a box has [fleet]: linked in, it and what it pulls in (GnuTLS,
   p11-kit, nettle, SASL) cost every box about 3 MiB of RSS at start, fleet or not. */
#define LDAP_FUNCTIONS(X) \
    X(ber_bvdup) X(ber_bvfree) X(ber_memfree) X(ldap_control_find) X(ldap_control_free) \
    X(ldap_controls_free) X(ldap_count_values_len) X(ldap_create_page_control) X(ldap_err2string) \
    X(ldap_first_entry) X(ldap_get_dn) X(ldap_get_option) X(ldap_get_values_len) X(ldap_initialize) \
    X(ldap_memfree) X(ldap_modify_ext_s) X(ldap_msgfree) X(ldap_next_entry) \
    X(ldap_parse_pageresponse_control) X(ldap_parse_result) X(ldap_sasl_bind_s) \
    X(ldap_sasl_interactive_bind_s) X(ldap_search_ext_s) X(ldap_set_option) X(ldap_start_tls_s) \
    X(ldap_unbind_ext_s) X(ldap_value_free_len) \
    X(ber_alloc_t) X(ber_free) X(ber_flatten2) X(ber_init) X(ber_scanf) X(ber_peek_tag) X(ber_printf) \
    X(ldap_search_ext) X(ldap_result) X(ldap_msgtype) X(ldap_get_entry_controls) \
    X(ldap_parse_intermediate) X(ldap_abandon_ext) X(ber_bvarray_free) X(ber_get_option) X(ber_sockbuf_ctrl)

#define DECLARE(name) extern __typeof__(name) *p_##name __attribute__((visibility("hidden")));
LDAP_FUNCTIONS(DECLARE)
#undef DECLARE

/* The Sync State control's and the Sync Info message's values, parsed (boxkey_ldap.c); pure, so
   the C fuzz targets (Fuzz/C) feed them directly. */
__attribute__((visibility("hidden"))) int boxkey_ldap_sync_state_value(const struct berval *value, int *state, unsigned char uuid[16]);
__attribute__((visibility("hidden"))) int boxkey_ldap_sync_info_value(const struct berval *data, boxkey_ldap_sync_change change,
                                                                      void *context, char *err, size_t err_len);

/* 0 once libldap is loaded; otherwise the reason in err. */
__attribute__((visibility("hidden"))) int boxkey_ldap_loaded(char *err, size_t err_len);

/* From here on every libldap call goes through the pointers (not in the loader itself). */
#ifndef BOXKEY_LDAP_LOADER
#define CALL(name) (*p_##name)
#define ber_bvdup CALL(ber_bvdup)
#define ber_bvfree CALL(ber_bvfree)
#define ber_memfree CALL(ber_memfree)
#define ldap_control_find CALL(ldap_control_find)
#define ldap_control_free CALL(ldap_control_free)
#define ldap_controls_free CALL(ldap_controls_free)
#define ldap_count_values_len CALL(ldap_count_values_len)
#define ldap_create_page_control CALL(ldap_create_page_control)
#define ldap_err2string CALL(ldap_err2string)
#define ldap_first_entry CALL(ldap_first_entry)
#define ldap_get_dn CALL(ldap_get_dn)
#define ldap_get_option CALL(ldap_get_option)
#define ldap_get_values_len CALL(ldap_get_values_len)
#define ldap_initialize CALL(ldap_initialize)
#define ldap_memfree CALL(ldap_memfree)
#define ldap_modify_ext_s CALL(ldap_modify_ext_s)
#define ldap_msgfree CALL(ldap_msgfree)
#define ldap_next_entry CALL(ldap_next_entry)
#define ldap_parse_pageresponse_control CALL(ldap_parse_pageresponse_control)
#define ldap_parse_result CALL(ldap_parse_result)
#define ldap_sasl_bind_s CALL(ldap_sasl_bind_s)
#define ldap_sasl_interactive_bind_s CALL(ldap_sasl_interactive_bind_s)
#define ldap_search_ext_s CALL(ldap_search_ext_s)
#define ldap_set_option CALL(ldap_set_option)
#define ldap_start_tls_s CALL(ldap_start_tls_s)
#define ldap_unbind_ext_s CALL(ldap_unbind_ext_s)
#define ldap_value_free_len CALL(ldap_value_free_len)
#define ber_alloc_t CALL(ber_alloc_t)
#define ber_free CALL(ber_free)
#define ber_flatten2 CALL(ber_flatten2)
#define ber_init CALL(ber_init)
#define ber_scanf CALL(ber_scanf)
#define ber_peek_tag CALL(ber_peek_tag)
#define ber_printf CALL(ber_printf)
#define ldap_search_ext CALL(ldap_search_ext)
#define ldap_result CALL(ldap_result)
#define ldap_msgtype CALL(ldap_msgtype)
#define ldap_get_entry_controls CALL(ldap_get_entry_controls)
#define ldap_parse_intermediate CALL(ldap_parse_intermediate)
#define ldap_abandon_ext CALL(ldap_abandon_ext)
#define ber_bvarray_free CALL(ber_bvarray_free)
#define ber_get_option CALL(ber_get_option)
#define ber_sockbuf_ctrl CALL(ber_sockbuf_ctrl)
#endif

#endif
