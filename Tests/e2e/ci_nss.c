/* A case-insensitive user database, as sssd gives with case_sensitive = Preserving (or any NSS
   that matches names regardless of case): getpwnam("alice") returns the entry "Alice" when no
   entry is named exactly "alice", with pw_name as stored. Interposed with LD_PRELOAD before
   nss_wrapper. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pwd.h>
#include <string.h>
#include <strings.h>
#include <errno.h>

static struct passwd *(*real_getpwnam)(const char *);
static int (*real_getpwnam_r)(const char *, struct passwd *, char *, size_t, struct passwd **);

static struct passwd *scan(const char *name) {
    struct passwd *p, *found = NULL;
    setpwent();
    while ((p = getpwent()) != NULL) {
        if (strcasecmp(p->pw_name, name) == 0) { found = p; break; }
    }
    endpwent();
    return found;
}

struct passwd *getpwnam(const char *name) {
    if (!real_getpwnam) real_getpwnam = dlsym(RTLD_NEXT, "getpwnam");
    struct passwd *p = real_getpwnam(name);
    if (p) return p;
    static struct passwd copy; static char buf[4096];
    struct passwd *f = scan(name);
    if (!f) return NULL;
    /* copy out: getpwent's buffer is reused */
    size_t off = 0;
    #define DUP(field) do { size_t n = strlen(f->field) + 1; memcpy(buf + off, f->field, n); copy.field = buf + off; off += n; } while (0)
    DUP(pw_name); DUP(pw_passwd); DUP(pw_gecos); DUP(pw_dir); DUP(pw_shell);
    copy.pw_uid = f->pw_uid; copy.pw_gid = f->pw_gid;
    return &copy;
}

int getpwnam_r(const char *name, struct passwd *pwd, char *buf, size_t len, struct passwd **result) {
    if (!real_getpwnam_r) real_getpwnam_r = dlsym(RTLD_NEXT, "getpwnam_r");
    int rc = real_getpwnam_r(name, pwd, buf, len, result);
    if (rc != 0 || *result) return rc;
    struct passwd *f = scan(name);
    if (!f) return 0;
    size_t off = 0;
    #define DUPR(field) do { size_t n = strlen(f->field) + 1; if (off + n > len) return ERANGE; memcpy(buf + off, f->field, n); pwd->field = buf + off; off += n; } while (0)
    DUPR(pw_name); DUPR(pw_passwd); DUPR(pw_gecos); DUPR(pw_dir); DUPR(pw_shell);
    pwd->pw_uid = f->pw_uid; pwd->pw_gid = f->pw_gid;
    *result = pwd;
    return 0;
}
