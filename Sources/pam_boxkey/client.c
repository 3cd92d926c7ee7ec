/* The daemon's socket, from inside a login program: every step has a deadline (poll), never
 * an unbounded read, and nothing here starts a thread. */
#define _GNU_SOURCE
#include "module.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

enum bk_client_error bk_client_open(struct bk_client *c, const char *path) {
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) { c->error_number = errno; return BK_CLIENT_UNAVAILABLE; }
    struct sockaddr_un address = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof address.sun_path) {
        bk_client_close(c);
        c->error_number = ENAMETOOLONG;
        return BK_CLIENT_UNAVAILABLE;
    }
    memcpy(address.sun_path, path, strlen(path));
    /* Non-blocking: a daemon that is alive but not accepting has a full listen queue, which
     * gives EAGAIN here, where a blocking connect would hang every sudo and login. */
    if (connect(c->fd, (struct sockaddr *)&address, sizeof address) != 0) {
        int e = errno;
        bk_client_close(c);
        c->error_number = e;
        return BK_CLIENT_UNAVAILABLE;
    }
    return BK_CLIENT_OK;
}

void bk_client_close(struct bk_client *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

static enum bk_client_error wait_for(struct bk_client *c, short events, int timeout_ms) {
    struct pollfd p = { .fd = c->fd, .events = events };
    for (;;) {
        int rc = poll(&p, 1, timeout_ms);
        if (rc < 0 && errno == EINTR) continue;
        if (rc <= 0) return BK_CLIENT_TIMED_OUT;
        if (p.revents & POLLNVAL) return BK_CLIENT_CLOSED;
        if (!(p.revents & events) && (p.revents & (POLLHUP | POLLERR))) return BK_CLIENT_CLOSED;
        return BK_CLIENT_OK;
    }
}

enum bk_client_error bk_client_send(struct bk_client *c, struct bk_frame *f) {
    enum bk_client_error e = BK_CLIENT_OK;
    size_t offset = 0;
    if (c->fd < 0) e = BK_CLIENT_CLOSED;
    while (e == BK_CLIENT_OK && offset < f->length) {
        if ((e = wait_for(c, POLLOUT, 1000)) != BK_CLIENT_OK) break;
        ssize_t n = send(c->fd, f->bytes + offset, f->length - offset, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) e = BK_CLIENT_CLOSED;
        else offset += (size_t)n;
    }
    explicit_bzero(f, sizeof *f);
    return e;
}

static enum bk_client_error read_exactly(struct bk_client *c, uint8_t *out, size_t count, int64_t deadline) {
    size_t offset = 0;
    while (offset < count) {
        int64_t remaining = deadline - monotonic_ms();
        if (remaining <= 0) return BK_CLIENT_TIMED_OUT;
        enum bk_client_error e = wait_for(c, POLLIN, remaining > 0x7fffffff ? 0x7fffffff : (int)remaining);
        if (e != BK_CLIENT_OK) return e;
        ssize_t n = recv(c->fd, out + offset, count - offset, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) return BK_CLIENT_CLOSED;
        offset += (size_t)n;
    }
    return BK_CLIENT_OK;
}

enum bk_client_error bk_client_receive(struct bk_client *c, int64_t timeout_ms, struct bk_reply *out) {
    int64_t deadline = monotonic_ms() + timeout_ms;
    uint8_t header[2], body[BK_MAX_FRAME];
    memset(out, 0, sizeof *out);
    if (c->fd < 0) return BK_CLIENT_CLOSED;
    enum bk_client_error e = read_exactly(c, header, 2, deadline);
    if (e != BK_CLIENT_OK) return e;
    size_t length = (size_t)header[0] << 8 | header[1];
    if (length == 0 || length > BK_MAX_FRAME) { c->decode_error = BK_TOO_LONG; return BK_CLIENT_PROTOCOL; }
    if ((e = read_exactly(c, body, length, deadline)) == BK_CLIENT_OK) {
        c->decode_error = bk_decode_reply(body, length, out);
        if (c->decode_error != BK_DECODED) e = BK_CLIENT_PROTOCOL;
    }
    explicit_bzero(body, sizeof body); /* a push's password passed through here */
    return e;
}

/* Words, not errno numbers: this reaches logs. */
const char *bk_client_error_text(const struct bk_client *c, enum bk_client_error e) {
    switch (e) {
    case BK_CLIENT_OK: return "ok";
    case BK_CLIENT_UNAVAILABLE: return strerror(c->error_number);
    case BK_CLIENT_TIMED_OUT: return "no answer in time";
    case BK_CLIENT_CLOSED: return "the daemon closed the connection";
    case BK_CLIENT_PROTOCOL: return bk_decode_error_text(c->decode_error);
    }
    return "?";
}
