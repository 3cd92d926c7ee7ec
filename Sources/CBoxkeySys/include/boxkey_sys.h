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
/* pthread_setname_np / pthread_getname_np for the calling thread (GNU extensions; names up to
   15 bytes). Return 0 or an error number. */
int boxkey_set_thread_name(const char *name);
int boxkey_thread_name(char *name, size_t size);
/* Signals as bytes on a pipe. boxkey_signal_pipe makes the pipe (once) and returns its read end,
   or -1 with errno; boxkey_catch_signal then gives a signal a handler that writes its number
   (one byte) to the pipe. The handler is async-signal-safe and keeps errno; the write end is
   non-blocking, so a full pipe drops a repeat, never blocks. A program that execs gets these
   signals' default actions back (handlers do not survive exec, and no signal is blocked). */
int boxkey_signal_pipe(void);
int boxkey_catch_signal(int signo);
/* Hands back the pages of this program's own file that are mapped but never written (its code
   and read-only data), as MADV_DONTNEED: whatever is used again is mapped again from the page
   cache. Start-up touches much of a Swift program once (the runtime's conformance tables, with
   the kernel's fault-around), and a daemon then uses little of it. Left alone: a mapping with
   any private page (written, in memory or swapped out) and any part of the relocated data
   (PT_GNU_RELRO). Returns the size of the mappings handed back, or -1. */
long boxkey_release_program_pages(void);
#endif
