#define _GNU_SOURCE
#include "boxkey_sys.h"
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <spawn.h>
#include <errno.h>
#include <link.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int signal_pipe_write = -1;

static void signal_to_pipe(int signo) {
    int saved = errno;
    unsigned char byte = (unsigned char)signo;
    if (write(signal_pipe_write, &byte, 1) < 0) { /* full: a repeat of a waiting signal */ }
    errno = saved;
}

int boxkey_signal_pipe(void) {
    static int read_end = -1;
    if (read_end >= 0) { errno = EBUSY; return -1; }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    if (fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0) { close(fds[0]); close(fds[1]); return -1; }
    signal_pipe_write = fds[1];
    read_end = fds[0];
    return read_end;
}

int boxkey_catch_signal(int signo) {
    if (signal_pipe_write < 0) { errno = EBADF; return -1; }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = signal_to_pipe;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    return sigaction(signo, &action, NULL);
}

/* The program's PT_GNU_RELRO range: data the loader relocated, then made read-only. */
struct relro { unsigned long start, end; };

static int find_relro(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct relro *r = data;
    if (info->dlpi_name && info->dlpi_name[0]) return 0; /* the first entry is the program */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
            r->start = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            r->end = r->start + info->dlpi_phdr[i].p_memsz;
        }
    }
    return 1;
}

long boxkey_release_program_pages(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = 0;
    /* After an upgrade replaced the file, both read "PATH (deleted)". */
    size_t exe_len = strlen(exe);
    const char *deleted = " (deleted)";
    if (exe_len > strlen(deleted) && strcmp(exe + exe_len - strlen(deleted), deleted) == 0) exe_len -= strlen(deleted);
    struct relro relro = {0, 0};
    dl_iterate_phdr(find_relro, &relro);
    FILE *maps = fopen("/proc/self/smaps", "re");
    if (!maps) return -1;
    char line[PATH_MAX + 128];
    unsigned long start = 0, end = 0;
    int candidate = 0, written = 0;
    long released = 0;
    while (fgets(line, sizeof line, maps)) {
        size_t len = strlen(line);
        int whole = len > 0 && line[len - 1] == '\n';
        unsigned long s, e;
        char perms[5];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %4s %*s %*s %*s %n", &s, &e, perms, &path_at) == 3) {
            char *path = path_at > 0 ? line + path_at : line + len;
            path[strcspn(path, "\n")] = 0;
            int ours = strncmp(path, exe, exe_len) == 0 && (path[exe_len] == 0 || strcmp(path + exe_len, deleted) == 0);
            /* Not writable, this program's file, and no part of the relocated data. */
            candidate = whole && exe_len > 0 && ours && perms[1] != 'w' && (e <= relro.start || s >= relro.end);
            written = 0;
            start = s;
            end = e;
        } else if (strncmp(line, "Anonymous:", 10) == 0 || strncmp(line, "Swap:", 5) == 0) {
            /* A private page, in memory or swapped out: this mapping holds written data. */
            if (strtol(strchr(line, ':') + 1, NULL, 10) != 0) written = 1;
        } else if (strncmp(line, "VmFlags:", 8) == 0) {
            /* The last line of a mapping's entry: decide. */
            if (candidate && !written && madvise((void *)start, end - start, MADV_DONTNEED) == 0)
                released += (long)(end - start);
            candidate = 0;
        }
        /* A line longer than the buffer: skip the rest of it. */
        while (!whole && fgets(line, sizeof line, maps)) {
            len = strlen(line);
            whole = len > 0 && line[len - 1] == '\n';
        }
    }
    fclose(maps);
    return released;
}

int boxkey_set_thread_name(const char *name) { return pthread_setname_np(pthread_self(), name); }

int boxkey_thread_name(char *name, size_t size) { return pthread_getname_np(pthread_self(), name, size); }
