#ifndef BOXKEY_CPAM_SHIM_H
#define BOXKEY_CPAM_SHIM_H
#include <security/pam_appl.h>
#include <security/pam_modules.h>
#include <security/pam_ext.h>
#include <syslog.h>

/* pam_syslog is variadic; Swift cannot call it. */
static inline void boxkey_pam_log(pam_handle_t *pamh, int priority, const char *message) {
    pam_syslog(pamh, priority, "%s", message);
}
#endif
