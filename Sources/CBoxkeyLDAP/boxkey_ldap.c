#include <dlfcn.h>
#include <ldap.h>
#include <lber.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include "boxkey_ldap.h"
#include "ldap_calls.h"

/* Round trips of one paged search, at most. */
#define BOXKEY_LDAP_MAX_PAGES 2000
/* What the box takes from a directory, at most: a message (libldap's own limit is 4 GiB), an
   entry's DN, a name or uidNumber value, a phone value (a key, a space, a name). */
#define BOXKEY_LDAP_MAX_PDU (4 << 20)
#define BOXKEY_LDAP_MAX_DN 2048
#define BOXKEY_LDAP_MAX_NAME 256
#define BOXKEY_LDAP_MAX_VALUE 1024
/* Entries of a search without paging, at most (the box's own cap on a roster). */
#define BOXKEY_LDAP_MAX_UNPAGED 200000

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
    if (boxkey_ldap_loaded(err, err_len) != 0) return LDAP_OTHER;
    int rc = ldap_initialize(&ld, uri);
    if (rc != LDAP_SUCCESS) return fail(rc, NULL, "bad directory URI", err, err_len);
    /* No message over 4 MiB: a directory that sends more (libldap would take 4 GiB) breaks the
       connection instead of the box's memory. */
    Sockbuf *sb = NULL;
    ber_len_t max_incoming = BOXKEY_LDAP_MAX_PDU;
    if (ldap_get_option(ld, LDAP_OPT_SOCKBUF, &sb) != LDAP_OPT_SUCCESS || !sb || ber_sockbuf_ctrl(sb, LBER_SB_OPT_SET_MAX_INCOMING, &max_incoming) != 1) {
        snprintf(err, err_len, "cannot bound the size of the directory's messages");
        ldap_unbind_ext_s(ld, NULL, NULL);
        return LDAP_LOCAL_ERROR;
    }
    int version = LDAP_VERSION3, demand = LDAP_OPT_X_TLS_DEMAND, zero = 0;
    struct timeval timeout = { timeout_s, 0 };
    /* Every option is checked: a TLS setting that did not take (the certificate not checked,
       the wrong CA) must fail the open, never leave a connection weaker than configured. */
    struct { int option; const void *value; const char *what; } options[] = {
        { LDAP_OPT_PROTOCOL_VERSION, &version, "LDAPv3" },
        { LDAP_OPT_REFERRALS, LDAP_OPT_OFF, "no referrals" },
        { LDAP_OPT_NETWORK_TIMEOUT, &timeout, "the network timeout" },
        { LDAP_OPT_TIMEOUT, &timeout, "the timeout" },
        /* The server's certificate is always checked (never "allow" or "never"). */
        { LDAP_OPT_X_TLS_REQUIRE_CERT, &demand, "TLS: demand a valid certificate" },
        /* A new TLS context does not take ldap.conf's TLS_CACERT: name the system's store. */
        { LDAP_OPT_X_TLS_CACERTFILE, ca_file && *ca_file ? ca_file : "/etc/ssl/certs/ca-certificates.crt", "TLS: the CA file" },
        { LDAP_OPT_X_TLS_NEWCTX, &zero, "TLS: a new context (is the CA file readable?)" },
    };
    /* ldapi:// without StartTLS uses no TLS: its options are not set (nor the CA file needed). */
    size_t count = starttls || strncasecmp(uri, "ldaps://", 8) == 0 ? sizeof options / sizeof *options : 4;
    for (size_t i = 0; i < count; i++) {
        if (ldap_set_option(ld, options[i].option, options[i].value) != LDAP_OPT_SUCCESS) {
            char what[160];
            snprintf(what, sizeof what, "cannot set %s", options[i].what);
            fail(LDAP_PARAM_ERROR, ld, what, err, err_len);
            ldap_unbind_ext_s(ld, NULL, NULL);
            return LDAP_PARAM_ERROR;
        }
    }
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

static void free_values(char **values) {
    for (int i = 0; values && values[i]; i++) free(values[i]);
    free(values);
}

/* NUL-terminated copies of the values of at most `max` bytes (NULL-terminated; how many in
   `*kept`); NULL if out of memory. */
static char **copy_values(struct berval **values, ber_len_t max, int *kept) {
    int count = ldap_count_values_len(values);
    if (count < 0) count = 0;
    char **out = calloc((size_t)count + 1, sizeof(char *));
    *kept = 0;
    if (!out) return NULL;
    for (int i = 0; i < count; i++) {
        if (values[i]->bv_len > max) continue;
        char *copy = malloc(values[i]->bv_len + 1);
        if (!copy) { free_values(out); return NULL; }
        /* A NUL inside a value would cut it short (`alice\0x` read as `alice`): it becomes DEL,
           which no login name or phone key takes. */
        for (ber_len_t k = 0; k < values[i]->bv_len; k++) copy[k] = values[i]->bv_val[k] ? values[i]->bv_val[k] : 0x7f;
        copy[values[i]->bv_len] = 0;
        out[(*kept)++] = copy;
    }
    return out;
}

/* Whether any value is longer than `max` bytes. */
static int any_longer(struct berval **values, ber_len_t max) {
    for (int i = 0; values && values[i]; i++)
        if (values[i]->bv_len > max) return 1;
    return 0;
}

/* Hands one entry to `each` (a search) or `change` (a sync stream, with its state and UUID).
   Returns what the callback returned, -1 when out of memory, or -2 for an entry larger than a
   user's can be (its DN, a name or its uidNumber): the box keeps what it reads, so bytes are
   bounded as well as entries. A name is never dropped (one name fewer could make an entry look
   like one user's); a phone value too long to be one is (it grants nothing). */
static int hand_over(LDAP *ld, LDAPMessage *e, const char *names_attr, const char *values_attr,
                     int state, const unsigned char *uuid, boxkey_ldap_entry each,
                     boxkey_ldap_sync_change change, void *context) {
    char *dn = ldap_get_dn(ld, e);
    struct berval **names = ldap_get_values_len(ld, e, names_attr);
    struct berval **numbers = ldap_get_values_len(ld, e, "uidNumber");
    struct berval **values = ldap_get_values_len(ld, e, values_attr);
    int stop = -2, name_count = 0, value_count = 0, number_count = 0;
    char **name_strings = NULL, **value_strings = NULL, **number_strings = NULL;
    if ((!dn || strlen(dn) <= BOXKEY_LDAP_MAX_DN) && !any_longer(names, BOXKEY_LDAP_MAX_NAME) && !any_longer(numbers, BOXKEY_LDAP_MAX_NAME)) {
        name_strings = copy_values(names, BOXKEY_LDAP_MAX_NAME, &name_count);
        value_strings = copy_values(values, BOXKEY_LDAP_MAX_VALUE, &value_count);
        number_strings = copy_values(numbers, BOXKEY_LDAP_MAX_NAME, &number_count);
        stop = -1;
    }
    if (name_strings && value_strings && number_strings) {
        const char *number = number_count == 1 ? number_strings[0] : NULL;
        stop = each ? each(context, dn ? dn : "", (const char *const *)name_strings, name_count, number,
                           (const char *const *)value_strings, value_count)
                    : change(context, state, uuid, dn ? dn : "", (const char *const *)name_strings, name_count, number,
                             (const char *const *)value_strings, value_count);
    }
    free_values(name_strings);
    free_values(value_strings);
    free_values(number_strings);
    ldap_value_free_len(names);
    ldap_value_free_len(numbers);
    ldap_value_free_len(values);
    ldap_memfree(dn);
    return stop;
}

/* One page of a search: its entries handed over as they arrive, one message at a time (a page
   taken whole by ldap_search_ext_s would be held before any count: a directory that ignores the
   page size could fill it without limit), at most `most` of them, then its result message in
   `*result` (the caller parses and frees it). Returns the search's code (LDAP_SIZELIMIT_EXCEEDED,
   the reason in err, for more entries than asked for); `*stop` is what the last callback said. */
static int search_page(LDAP *ld, const char *base, const char *filter, char **attrs, LDAPControl **controls, int most,
                       const char *names_attr, const char *values_attr, boxkey_ldap_entry each, void *context,
                       int *stop, LDAPMessage **result, char *err, size_t err_len) {
    int msgid = 0, entries = 0;
    *result = NULL;
    int rc = ldap_search_ext(ld, base, LDAP_SCOPE_SUBTREE, filter, attrs, 0, controls, NULL, NULL, LDAP_NO_LIMIT, &msgid);
    if (rc != LDAP_SUCCESS) return rc;
    struct timeval *limit = NULL, wait = { 60, 0 };
    if (ldap_get_option(ld, LDAP_OPT_TIMEOUT, &limit) == LDAP_OPT_SUCCESS && limit) { wait = *limit; ldap_memfree(limit); }
    for (;;) {
        LDAPMessage *msg = NULL;
        int type = ldap_result(ld, msgid, LDAP_MSG_ONE, &wait, &msg);
        if (type == 0) {
            ldap_abandon_ext(ld, msgid, NULL, NULL);
            return LDAP_TIMEOUT;
        }
        if (type < 0) {
            int code = 0;
            ldap_get_option(ld, LDAP_OPT_RESULT_CODE, &code);
            return code ? code : LDAP_SERVER_DOWN;
        }
        if (type == LDAP_RES_SEARCH_RESULT) {
            *result = msg;
            int code = LDAP_OTHER;
            if (ldap_parse_result(ld, msg, &code, NULL, NULL, NULL, NULL, 0) != LDAP_SUCCESS) code = LDAP_DECODING_ERROR;
            return code;
        }
        if (type == LDAP_RES_SEARCH_ENTRY) {
            if (++entries > most) {
                ldap_msgfree(msg);
                ldap_abandon_ext(ld, msgid, NULL, NULL);
                snprintf(err, err_len, "search failed: the directory sent more than %d entries in one page", most);
                return LDAP_SIZELIMIT_EXCEEDED;
            }
            *stop = hand_over(ld, msg, names_attr, values_attr, -1, NULL, each, NULL, context);
            if (*stop) {  /* the caller has what it needs, or cannot take more: the rest is not read */
                ldap_msgfree(msg);
                ldap_abandon_ext(ld, msgid, NULL, NULL);
                return LDAP_SUCCESS;
            }
        }
        ldap_msgfree(msg);  /* an entry handed over, or a reference */
    }
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
        /* A server that answers every page with a cookie (and few entries, or none) would keep
           the box paging for ever: a roster takes 200 pages at most at the size asked. */
        if (*requests >= BOXKEY_LDAP_MAX_PAGES) {
            snprintf(err, err_len, "search failed: the directory was still paging after %d pages", BOXKEY_LDAP_MAX_PAGES);
            rc = LDAP_SIZELIMIT_EXCEEDED;
            break;
        }
        LDAPControl *page = NULL, *controls[2] = { NULL, NULL };
        if (page_size > 0) {
            rc = ldap_create_page_control(ld, page_size, cookie, 1, &page);
            if (rc != LDAP_SUCCESS) { fail(rc, ld, "paged search", err, err_len); break; }
            controls[0] = page;
        }
        LDAPMessage *result = NULL;
        rc = search_page(ld, base, filter, attrs, page ? controls : NULL, page_size > 0 ? page_size : BOXKEY_LDAP_MAX_UNPAGED,
                         names_attr, values_attr, each, context, &stop, &result, err, err_len);
        (*requests)++;
        if (page) ldap_control_free(page);
        if (rc == LDAP_SIZELIMIT_EXCEEDED && !stop) break;  /* more entries in a page than asked for: err says */
        if (rc != LDAP_SUCCESS && rc != LDAP_PARTIAL_RESULTS && !stop) {
            if (!err[0]) fail(rc, ld, "search failed", err, err_len);
            ldap_msgfree(result);
            break;
        }
        if (stop == -2) rc = LDAP_SIZELIMIT_EXCEEDED;
        else if (stop < 0) rc = LDAP_NO_MEMORY;
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
        if (rc == LDAP_NO_MEMORY) { snprintf(err, err_len, "search failed: out of memory"); break; }
        if (rc == LDAP_SIZELIMIT_EXCEEDED) {
            snprintf(err, err_len, "search failed: an entry larger than a user's can be (a DN over %d bytes, or a name over %d)", BOXKEY_LDAP_MAX_DN, BOXKEY_LDAP_MAX_NAME);
            break;
        }
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

/* ---- Content synchronisation (RFC 4533, OpenLDAP's syncprov), refreshAndPersist ---- */

int boxkey_ldap_sync_start(boxkey_ldap *handle, const char *base, const char *filter,
                           const char *names_attr, const char *values_attr, int *msgid,
                           char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    char *attrs[] = { (char *)names_attr, (char *)values_attr, "uidNumber", NULL };
    BerElement *ber = ber_alloc_t(LBER_USE_DER);
    struct berval value = { 0, NULL };
    /* syncRequestValue: refreshAndPersist and no cookie, so every start is a whole refresh
       (the box keeps no cookie: a restart of the stream is rare and the refresh is one read). */
    if (!ber || ber_printf(ber, "{e}", (ber_int_t)LDAP_SYNC_REFRESH_AND_PERSIST) < 0 || ber_flatten2(ber, &value, 0) < 0) {
        if (ber) ber_free(ber, 1);
        snprintf(err, err_len, "content synchronisation: cannot encode the request");
        return LDAP_ENCODING_ERROR;
    }
    /* Critical: a server without syncprov must refuse (unavailableCriticalExtension), not
       answer a plain search that then never tells of a change. */
    LDAPControl control = { LDAP_CONTROL_SYNC, value, 1 };
    LDAPControl *controls[] = { &control, NULL };
    int rc = ldap_search_ext(ld, base, LDAP_SCOPE_SUBTREE, filter, attrs, 0, controls, NULL, NULL, LDAP_NO_LIMIT, msgid);
    ber_free(ber, 1);
    if (rc != LDAP_SUCCESS) return fail(rc, ld, "content synchronisation", err, err_len);
    return 0;
}

/* A BER reader over a control's or message's value: NULL when there is none or it is empty
   (liblber reads an empty one from a NULL buffer, and aborts on a NULL value). */
static BerElement *reader(const struct berval *value) {
    return value && value->bv_val && value->bv_len > 0 ? ber_init((struct berval *)value) : NULL;
}

/* Whether the reader has read its value to the end: anything after the last field is garbage. */
static int read_whole(BerElement *ber) {
    ber_len_t left = 1;
    return ber_get_option(ber, LBER_OPT_REMAINING_BYTES, &left) == LBER_OPT_SUCCESS && left == 0;
}

/* A syncStateValue ::= SEQUENCE { state ENUMERATED, entryUUID OCTET STRING (16), cookie
   OPTIONAL }: 0 and the state and UUID (copied), or -1 when it is absent or malformed. */
int boxkey_ldap_sync_state_value(const struct berval *value, int *state_out, unsigned char uuid_out[16]) {
    BerElement *ber = reader(value);
    ber_int_t state = -1;
    struct berval uuid = { 0, NULL };
    ber_len_t len = 0;
    int valid = ber && ber_scanf(ber, "{em", &state, &uuid) != LBER_ERROR && uuid.bv_len == 16 &&
                state >= LDAP_SYNC_PRESENT && state <= LDAP_SYNC_DELETE;
    if (valid && ber_peek_tag(ber, &len) == LDAP_TAG_SYNC_COOKIE) valid = ber_scanf(ber, "x") != LBER_ERROR;
    valid = valid && read_whole(ber);
    if (valid) {
        *state_out = state;
        memcpy(uuid_out, uuid.bv_val, 16);
    }
    if (ber) ber_free(ber, 1);
    return valid ? 0 : -1;
}

/* An entry of the stream: its state and entryUUID from the Sync State control. */
static int sync_entry(LDAP *ld, LDAPMessage *msg, const char *names_attr, const char *values_attr,
                      boxkey_ldap_sync_change change, void *context, char *err, size_t err_len) {
    LDAPControl **controls = NULL;
    if (ldap_get_entry_controls(ld, msg, &controls) != LDAP_SUCCESS) controls = NULL;
    LDAPControl *control = ldap_control_find(LDAP_CONTROL_SYNC_STATE, controls, NULL);
    int state = -1, rc = 0;
    unsigned char uuid[16];
    if (!control || boxkey_ldap_sync_state_value(&control->ldctl_value, &state, uuid) != 0) {
        snprintf(err, err_len, "content synchronisation: an entry without a valid sync state");
        rc = LDAP_PROTOCOL_ERROR;
    } else {
        int handed = hand_over(ld, msg, names_attr, values_attr, state, uuid, NULL, change, context);
        if (handed == -2) {
            snprintf(err, err_len, "content synchronisation: an entry larger than a user's can be (a DN over %d bytes, or a name over %d)", BOXKEY_LDAP_MAX_DN, BOXKEY_LDAP_MAX_NAME);
            rc = LDAP_SIZELIMIT_EXCEEDED;
        } else if (handed < 0) {
            snprintf(err, err_len, "content synchronisation: out of memory");
            rc = LDAP_NO_MEMORY;
        }
    }
    ldap_controls_free(controls);
    return rc;
}

/* The optional fields that open a refreshDelete/refreshPresent or a syncIdSet: a cookie (the box
   keeps none: skipped), then a BOOLEAN (refreshDone, DEFAULT TRUE; refreshDeletes, DEFAULT
   FALSE). 0, or -1 when malformed. */
static int sync_info_head(BerElement *ber, ber_int_t *flag) {
    ber_len_t len = 0;
    if (ber_scanf(ber, "{") == LBER_ERROR) return -1;
    ber_tag_t tag = ber_peek_tag(ber, &len);
    if (tag == LDAP_TAG_SYNC_COOKIE) {
        if (ber_scanf(ber, "x") == LBER_ERROR) return -1;
        tag = ber_peek_tag(ber, &len);
    }
    if (tag == LDAP_TAG_REFRESHDONE /* == LDAP_TAG_REFRESHDELETES */ && ber_scanf(ber, "b", flag) == LBER_ERROR) return -1;
    return 0;
}

/* A syncInfoValue (RFC 4533 2.5): the end of the refresh (`change` gets REFRESHED), a set of
   entries deleted meanwhile (`change` gets each as LDAP_SYNC_DELETE), or a new cookie (nothing).
   A value that does not parse whole is an error (LDAP_PROTOCOL_ERROR, the reason in err):
   never read as "the refresh is done", which would make a part of the roster the whole. */
int boxkey_ldap_sync_info_value(const struct berval *data, boxkey_ldap_sync_change change, void *context,
                                char *err, size_t err_len) {
    BerElement *ber = reader(data);
    ber_len_t len = 0;
    ber_tag_t tag = ber ? ber_peek_tag(ber, &len) : LBER_ERROR;
    int rc = 0;
    if (tag == LDAP_TAG_SYNC_REFRESH_DELETE || tag == LDAP_TAG_SYNC_REFRESH_PRESENT) {
        ber_int_t done = 1; /* refreshDone DEFAULT TRUE */
        if (sync_info_head(ber, &done) != 0 || !read_whole(ber)) {
            snprintf(err, err_len, "content synchronisation: a malformed end of the refresh");
            rc = LDAP_PROTOCOL_ERROR;
        } else if (done) {
            change(context, BOXKEY_LDAP_SYNC_REFRESHED, NULL, "", NULL, 0, NULL, NULL, 0);
        }
    } else if (tag == LDAP_TAG_SYNC_ID_SET) {
        ber_int_t deletes = 0; /* refreshDeletes DEFAULT FALSE */
        BerVarray uuids = NULL;
        if (sync_info_head(ber, &deletes) != 0 || ber_scanf(ber, "[W]", &uuids) == LBER_ERROR || !read_whole(ber)) {
            snprintf(err, err_len, "content synchronisation: a malformed set of entry UUIDs");
            rc = LDAP_PROTOCOL_ERROR;
        } else if (!deletes) {
            /* A set of entries still present only comes after a cookie, and the box sends none. */
            snprintf(err, err_len, "content synchronisation: the server sent a present set unasked");
            rc = LDAP_PROTOCOL_ERROR;
        } else {
            for (int i = 0; uuids && uuids[i].bv_val; i++) {
                if (uuids[i].bv_len != 16) {
                    /* A deletion the box cannot place: start again rather than keep the entry. */
                    snprintf(err, err_len, "content synchronisation: an entry UUID of %lu bytes", (unsigned long)uuids[i].bv_len);
                    rc = LDAP_PROTOCOL_ERROR;
                    break;
                }
                change(context, LDAP_SYNC_DELETE, (const unsigned char *)uuids[i].bv_val, "", NULL, 0, NULL, NULL, 0);
            }
        }
        if (uuids) ber_bvarray_free(uuids);
    } else if (tag == LDAP_TAG_SYNC_NEW_COOKIE) {
        /* a new cookie alone: nothing to do, the box keeps none */
    } else {
        snprintf(err, err_len, "content synchronisation: a malformed sync info message");
        rc = LDAP_PROTOCOL_ERROR;
    }
    if (ber) ber_free(ber, 1);
    return rc;
}

/* A Sync Info message (an intermediate response); another extension's is not ours. */
static int sync_info(LDAP *ld, LDAPMessage *msg, boxkey_ldap_sync_change change, void *context,
                     char *err, size_t err_len) {
    char *oid = NULL;
    struct berval *data = NULL;
    int rc = ldap_parse_intermediate(ld, msg, &oid, &data, NULL, 0);
    if (rc == LDAP_SUCCESS && oid && strcmp(oid, LDAP_SYNC_INFO) == 0) rc = boxkey_ldap_sync_info_value(data, change, context, err, err_len);
    else rc = 0;
    ldap_memfree(oid);
    if (data) ber_bvfree(data);
    return rc;
}

int boxkey_ldap_sync_poll(boxkey_ldap *handle, int msgid, int timeout_ms, int max_messages, const char *names_attr,
                          const char *values_attr, boxkey_ldap_sync_change change, void *context,
                          int *handled, char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    struct timeval wait = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
    *handled = 0;
    while (*handled < max_messages) {
        LDAPMessage *msg = NULL;
        int type = ldap_result(ld, msgid, LDAP_MSG_ONE, &wait, &msg);
        if (type == 0) return 0;
        if (type < 0) {
            int code = 0;
            ldap_get_option(ld, LDAP_OPT_RESULT_CODE, &code);
            return fail(code ? code : LDAP_SERVER_DOWN, ld, "the directory's change stream broke", err, err_len);
        }
        /* What has arrived is handled now; the next wait is the caller's. */
        wait.tv_sec = 0;
        wait.tv_usec = 0;
        int rc = 0;
        if (type == LDAP_RES_SEARCH_ENTRY) {
            rc = sync_entry(ld, msg, names_attr, values_attr, change, context, err, err_len);
        } else if (type == LDAP_RES_INTERMEDIATE) {
            rc = sync_info(ld, msg, change, context, err, err_len);
        } else if (type == LDAP_RES_SEARCH_RESULT) {
            /* refreshAndPersist ends only when the server ends it: refused (no syncprov:
               unavailableCriticalExtension), told to refresh again, or shutting down. */
            int code = 0;
            ldap_parse_result(ld, msg, &code, NULL, NULL, NULL, NULL, 0);
            ldap_msgfree(msg);
            return fail(code ? code : LDAP_OTHER, ld, "the directory ended its change stream", err, err_len);
        }
        ldap_msgfree(msg);
        if (rc) return rc;
        (*handled)++;
    }
    return 0;
}

int boxkey_ldap_ping(boxkey_ldap *handle, const char *base, char *err, size_t err_len) {
    LDAP *ld = (LDAP *)handle;
    char *attrs[] = { LDAP_NO_ATTRS, NULL };
    LDAPMessage *result = NULL;
    int rc = ldap_search_ext_s(ld, base, LDAP_SCOPE_BASE, "(objectClass=*)", attrs, 0, NULL, NULL, NULL, 1, &result);
    ldap_msgfree(result);
    if (rc != LDAP_SUCCESS) return fail(rc, ld, "the directory did not answer", err, err_len);
    return 0;
}

int boxkey_ldap_descriptor(boxkey_ldap *handle) {
    int fd = -1;
    if (ldap_get_option((LDAP *)handle, LDAP_OPT_DESC, &fd) != LDAP_OPT_SUCCESS) return -1;
    return fd;
}

void boxkey_ldap_close(boxkey_ldap *ld) {
    if (ld) ldap_unbind_ext_s((LDAP *)ld, NULL, NULL);
}
