/* libFuzzer target: what a directory puts in a Sync State control and a Sync Info message
 * (RFC 4533), parsed as boxkeyd parses them (Sources/CBoxkeyLDAP). A lying directory once crashed
 * boxkeyd with an empty control value; a malformed refresh end read as "done". The contract
 * checked here: no crash, no read outside the value, and "refreshed" only for a value that
 * parses whole as a refreshDelete/refreshPresent. libldap is loaded as boxkeyd loads it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ldap_calls.h"

static int refreshed;

static int note(void *context, int state, const unsigned char *uuid, const char *dn, const char *const *names,
                int name_count, const char *number, const char *const *values, int count) {
    (void)context; (void)dn; (void)names; (void)name_count; (void)number; (void)values; (void)count;
    if (state == BOXKEY_LDAP_SYNC_REFRESHED) refreshed = 1;
    else if (!uuid || state != LDAP_SYNC_DELETE) abort();
    else { volatile unsigned char last = uuid[15]; (void)last; }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int loaded = -1;
    char err[256];
    if (loaded < 0 && (loaded = boxkey_ldap_loaded(err, sizeof err)) != 0) abort();
    /* An exact copy: ASan sees a read one byte past the value. */
    char *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    struct berval value = { size, copy };
    int state = -1;
    unsigned char uuid[16];
    if (boxkey_ldap_sync_state_value(&value, &state, uuid) == 0 && (state < LDAP_SYNC_PRESENT || state > LDAP_SYNC_DELETE)) abort();
    refreshed = 0;
    err[0] = 0;
    int rc = boxkey_ldap_sync_info_value(&value, note, NULL, err, sizeof err);
    if (rc != 0 && (refreshed || !err[0])) abort(); /* an error says why, and is never "done" */
    if (refreshed && size > 0 && copy[0] != (char)LDAP_TAG_SYNC_REFRESH_DELETE && copy[0] != (char)LDAP_TAG_SYNC_REFRESH_PRESENT) abort();
    free(copy);
    return 0;
}
