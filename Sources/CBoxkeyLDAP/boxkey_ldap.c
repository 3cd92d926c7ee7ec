#define LDAP_DEPRECATED 0
#include <dlfcn.h>
#include <ldap.h>
#include <lber.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
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
    X(ldap_unbind_ext_s) X(ldap_value_free_len)

#define DECLARE(name) static __typeof__(name) *p_##name;
LDAP_FUNCTIONS(DECLARE)

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[256];

static void load_libldap(void) {
    /* Debian 12's soname, then the later and earlier ones. */
    const char *names[] = { "libldap-2.5.so.0", "libldap.so.2", "libldap-2.4.so.2" };
    void *handle = NULL;
    for (size_t i = 0; !handle && i < sizeof names / sizeof *names; i++) handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(load_error, sizeof load_error, "libldap is not installed (apt install libldap-2.5-0): %s", dlerror());
        return;
    }
    /* dlsym on the handle also finds liblber's functions: it is libldap's dependency. */
#define RESOLVE(name) \
    if (!(p_##name = (__typeof__(name) *)dlsym(handle, #name))) { \
        snprintf(load_error, sizeof load_error, "libldap lacks %s", #name); \
        return; \
    }
    LDAP_FUNCTIONS(RESOLVE)
}

/* 0 once libldap is loaded; otherwise the reason in err. */
static int loaded(char *err, size_t err_len) {
    pthread_once(&load_once, load_libldap);
    if (load_error[0]) {
        snprintf(err, err_len, "%s", load_error);
        return LDAP_OTHER;
    }
    return 0;
}

/* From here on every libldap call goes through the pointers. */
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

static int fail(int rc, LDAP *ld, const char *what, char *err, size_t err_len) {
    char *diagnostic = NULL;
    if (ld) ldap_get_option(ld, LDAP_OPT_DIAGNOSTIC_MESSAGE, &diagnostic);
    snprintf(err, err_len, "%s: %s%s%s", what, ldap_err2string(rc),
             diagnostic && *diagnostic ? " (" : "", diagnostic && *diagnostic ? diagnostic : "");
    if (diagnostic && *diagnostic) strncat(err, ")", err_len - strlen(err) - 1);
    ldap_memfree(diagnostic);
    return rc ? rc : LDAP_OTHER;
}

int boxkey_ldap_open(boxkey_ldap **out, const char *uri, int starttls, const char *ca_file,
                     const char *bind_dn, const char *password, int timeout_s,
                     char *err, size_t err_len) {
    LDAP *ld = NULL;
    *out = NULL;
    if (loaded(err, err_len) != 0) return LDAP_OTHER;
    int rc = ldap_initialize(&ld, uri);
    if (rc != LDAP_SUCCESS) return fail(rc, NULL, "bad directory URI", err, err_len);
    int version = LDAP_VERSION3, demand = LDAP_OPT_X_TLS_DEMAND, zero = 0;
    struct timeval timeout = { timeout_s, 0 };
    ldap_set_option(ld, LDAP_OPT_PROTOCOL_VERSION, &version);
    ldap_set_option(ld, LDAP_OPT_REFERRALS, LDAP_OPT_OFF);
    ldap_set_option(ld, LDAP_OPT_NETWORK_TIMEOUT, &timeout);
    ldap_set_option(ld, LDAP_OPT_TIMEOUT, &timeout);
    /* The server's certificate is always checked (never "allow" or "never"). */
    ldap_set_option(ld, LDAP_OPT_X_TLS_REQUIRE_CERT, &demand);
    /* A new TLS context does not take ldap.conf's TLS_CACERT: name the system's store. */
    ldap_set_option(ld, LDAP_OPT_X_TLS_CACERTFILE, ca_file && *ca_file ? ca_file : "/etc/ssl/certs/ca-certificates.crt");
    ldap_set_option(ld, LDAP_OPT_X_TLS_NEWCTX, &zero);
    if (starttls) {
        rc = ldap_start_tls_s(ld, NULL, NULL);
        if (rc != LDAP_SUCCESS) { fail(rc, ld, "StartTLS failed", err, err_len); ldap_unbind_ext_s(ld, NULL, NULL); return rc; }
    }
    if (bind_dn && strcmp(bind_dn, "EXTERNAL") == 0) {
        rc = ldap_sasl_interactive_bind_s(ld, NULL, "EXTERNAL", NULL, NULL, LDAP_SASL_QUIET, NULL, NULL);
    } else {
        struct berval secret = { password ? strlen(password) : 0, (char *)(password ? password : "") };
        rc = ldap_sasl_bind_s(ld, bind_dn, LDAP_SASL_SIMPLE, &secret, NULL, NULL, NULL);
    }
    if (rc != LDAP_SUCCESS) { fail(rc, ld, "bind failed", err, err_len); ldap_unbind_ext_s(ld, NULL, NULL); return rc; }
    *out = (boxkey_ldap *)ld;
    return 0;
}

/* NUL-terminated copies of a value list (NULL-terminated); NULL if out of memory. */
static char **copy_values(struct berval **values) {
    int count = ldap_count_values_len(values);
    char **out = calloc((size_t)count + 1, sizeof(char *));
    for (int i = 0; out && i < count; i++) {
        out[i] = strndup(values[i]->bv_val, values[i]->bv_len);
        if (!out[i]) { for (int j = 0; j < i; j++) free(out[j]); free(out); return NULL; }
    }
    return out;
}

static void free_values(char **values) {
    for (int i = 0; values && values[i]; i++) free(values[i]);
    free(values);
}

int boxkey_ldap_search(boxkey_ldap *handle, const char *base, const char *filter,
                       const char *names_attr, const char *values_attr, int page_size,
                       boxkey_ldap_entry each, void *context, int *requests,
                       char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    char *attrs[] = { (char *)names_attr, (char *)values_attr, "uidNumber", NULL };
    struct berval *cookie = NULL;
    int rc = LDAP_SUCCESS, stop = 0;
    *requests = 0;
    do {
        LDAPControl *page = NULL, *controls[2] = { NULL, NULL };
        if (page_size > 0) {
            rc = ldap_create_page_control(ld, page_size, cookie, 1, &page);
            if (rc != LDAP_SUCCESS) { fail(rc, ld, "paged search", err, err_len); break; }
            controls[0] = page;
        }
        LDAPMessage *result = NULL;
        rc = ldap_search_ext_s(ld, base, LDAP_SCOPE_SUBTREE, filter, attrs, 0,
                               page ? controls : NULL, NULL, NULL, LDAP_NO_LIMIT, &result);
        (*requests)++;
        if (page) ldap_control_free(page);
        if (rc != LDAP_SUCCESS && rc != LDAP_PARTIAL_RESULTS) {
            fail(rc, ld, "search failed", err, err_len);
            ldap_msgfree(result);
            break;
        }
        for (LDAPMessage *e = ldap_first_entry(ld, result); e && !stop; e = ldap_next_entry(ld, e)) {
            char *dn = ldap_get_dn(ld, e);
            struct berval **names = ldap_get_values_len(ld, e, names_attr);
            struct berval **numbers = ldap_get_values_len(ld, e, "uidNumber");
            struct berval **values = ldap_get_values_len(ld, e, values_attr);
            char **name_strings = copy_values(names), **value_strings = copy_values(values), **number_strings = copy_values(numbers);
            if (name_strings && value_strings && number_strings) {
                stop = each(context, dn ? dn : "", (const char *const *)name_strings, ldap_count_values_len(names),
                            ldap_count_values_len(numbers) == 1 ? number_strings[0] : NULL,
                            (const char *const *)value_strings, ldap_count_values_len(values));
            } else {
                rc = LDAP_NO_MEMORY;
                stop = 1;
            }
            free_values(name_strings);
            free_values(value_strings);
            free_values(number_strings);
            ldap_value_free_len(names);
            ldap_value_free_len(numbers);
            ldap_value_free_len(values);
            ldap_memfree(dn);
        }
        if (cookie) { ber_bvfree(cookie); cookie = NULL; }
        if (page_size > 0 && !stop) {
            LDAPControl **returned = NULL;
            int code = 0;
            ldap_parse_result(ld, result, &code, NULL, NULL, NULL, &returned, 0);
            LDAPControl *response = ldap_control_find(LDAP_CONTROL_PAGEDRESULTS, returned, NULL);
            if (response) {
                struct berval next = { 0, NULL };
                ber_int_t estimate = 0;
                if (ldap_parse_pageresponse_control(ld, response, &estimate, &next) == LDAP_SUCCESS && next.bv_len > 0) {
                    cookie = ber_bvdup(&next);
                }
                ber_memfree(next.bv_val);
            }
            ldap_controls_free(returned);
        }
        ldap_msgfree(result);
        if (rc == LDAP_NO_MEMORY) { fail(rc, NULL, "search failed", err, err_len); break; }
        rc = LDAP_SUCCESS;
    } while (cookie && !stop);
    if (cookie) ber_bvfree(cookie);
    return rc;
}

int boxkey_ldap_change(boxkey_ldap *handle, const char *dn, int operation, const char *attr,
                       const char *value, const char *object_class, char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    char *values[] = { (char *)value, NULL };
    int add = operation != BOXKEY_LDAP_DELETE;
    LDAPMod mod = { .mod_op = operation == BOXKEY_LDAP_ADD ? LDAP_MOD_ADD : operation == BOXKEY_LDAP_REPLACE ? LDAP_MOD_REPLACE : LDAP_MOD_DELETE,
                    .mod_type = (char *)attr };
    mod.mod_vals.modv_strvals = values;
    LDAPMod *mods[] = { &mod, NULL };
    int rc = ldap_modify_ext_s(ld, dn, mods, NULL, NULL);
    if (rc == LDAP_OBJECT_CLASS_VIOLATION && add && object_class) {
        /* The entry lacks the auxiliary class that allows `attr`: add both at once. */
        char *class_values[] = { (char *)object_class, NULL };
        LDAPMod class_mod = { .mod_op = LDAP_MOD_ADD, .mod_type = "objectClass" };
        class_mod.mod_vals.modv_strvals = class_values;
        LDAPMod *both[] = { &class_mod, &mod, NULL };
        rc = ldap_modify_ext_s(ld, dn, both, NULL, NULL);
    }
    if (rc != LDAP_SUCCESS) return fail(rc, ld, add ? "writing the value failed" : "deleting the value failed", err, err_len);
    return 0;
}

int boxkey_ldap_swap(boxkey_ldap *handle, const char *dn, const char *attr, const char *old,
                     const char *value, char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    char *old_values[] = { (char *)old, NULL }, *new_values[] = { (char *)value, NULL };
    LDAPMod del = { .mod_op = LDAP_MOD_DELETE, .mod_type = (char *)attr };
    LDAPMod add = { .mod_op = LDAP_MOD_ADD, .mod_type = (char *)attr };
    del.mod_vals.modv_strvals = old_values;
    add.mod_vals.modv_strvals = new_values;
    LDAPMod *mods[] = { old ? &del : &add, old ? &add : NULL, NULL };
    int rc = ldap_modify_ext_s(ld, dn, mods, NULL, NULL);
    if (rc != LDAP_SUCCESS) return fail(rc, ld, "writing the value failed (changed by someone else meanwhile?)", err, err_len);
    return 0;
}

void boxkey_ldap_close(boxkey_ldap *ld) {
    if (ld) ldap_unbind_ext_s((LDAP *)ld, NULL, NULL);
}
