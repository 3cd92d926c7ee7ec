#define _GNU_SOURCE
#include "boxkey_sys.h"
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <spawn.h>
#include <stdlib.h>

int boxkey_disable_core_dumps(void) {
    struct rlimit none = {0, 0};
    int a = setrlimit(RLIMIT_CORE, &none);
    int b = prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    return a == 0 && b == 0 ? 0 : -1;
}

long long boxkey_peer_uid(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    return (long long)cred.uid;
}

int boxkey_sol_socket(void) { return SOL_SOCKET; }
int boxkey_so_peercred(void) { return SO_PEERCRED; }

short boxkey_posix_spawn_setsid(void) { return POSIX_SPAWN_SETSID; }

int boxkey_posix_spawn_close_from(posix_spawn_file_actions_t *actions, int from) {
    return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

const char *boxkey_secure_getenv(const char *name) {
    return secure_getenv(name);
}
