#ifndef BOXKEY_SYS_H
#define BOXKEY_SYS_H
/* The few Linux calls Swift's Glibc module does not expose without _GNU_SOURCE. */
#include <spawn.h>
#include <sys/types.h>
#include <libintl.h> /* dgettext: the translations of what the CLI and the PAM module say */
#include <locale.h>

/* Same layout as struct ucred (SO_PEERCRED). */
struct boxkey_ucred {
    pid_t pid;
    uid_t uid;
    gid_t gid;
};

/* Makes the process undumpable (no core files, no ptrace by the same user) and sets the core
   size limit to 0. Returns 0 on success. */
int boxkey_disable_core_dumps(void);

/* The uid of the peer of a connected Unix socket, or -1. */
long long boxkey_peer_uid(int fd);

/* SOL_SOCKET and SO_PEERCRED, for NIO's unsafeGetSocketOption. */
int boxkey_sol_socket(void);
int boxkey_so_peercred(void);
/* POSIX_SPAWN_SETSID (a GNU extension): start a child in a new session. */
short boxkey_posix_spawn_setsid(void);
/* posix_spawn_file_actions_addclosefrom_np (a GNU extension, glibc 2.34): the child closes every
   descriptor from `from` up, so it inherits none its parent left open without FD_CLOEXEC.
   Returns 0 or an error number. */
int boxkey_posix_spawn_close_from(posix_spawn_file_actions_t *actions, int from);
/* secure_getenv (a GNU extension): NULL in a setuid or setgid process, so its caller's
   environment cannot steer it. */
const char *boxkey_secure_getenv(const char *name);
#endif
