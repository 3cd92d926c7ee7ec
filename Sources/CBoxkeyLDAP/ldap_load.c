#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#define BOXKEY_LDAP_LOADER
#include "ldap_calls.h"

#define DEFINE(name) __typeof__(name) *p_##name;
LDAP_FUNCTIONS(DEFINE)

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[256];

static void load_libldap(void) {
    /* Debian 12's soname (OpenLDAP 2.5), Debian 13's (2.6: libldap_r merged into libldap, the
     * soname back to libldap.so.2 with an unchanged API), then 2.4's. */
    const char *names[] = { "libldap-2.5.so.0", "libldap.so.2", "libldap-2.4.so.2" };
    void *handle = NULL;
    for (size_t i = 0; !handle && i < sizeof names / sizeof *names; i++) handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        snprintf(load_error, sizeof load_error, "libldap is not installed (Debian 12: apt install libldap-2.5-0; Debian 13: apt install libldap2): %s", dlerror());
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

int boxkey_ldap_loaded(char *err, size_t err_len) {
    pthread_once(&load_once, load_libldap);
    if (load_error[0]) {
        snprintf(err, err_len, "%s", load_error);
        return LDAP_OTHER;
    }
    return 0;
}

